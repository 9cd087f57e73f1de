from axes.models import AccessAttempt, AccessFailureLog, AccessLog
from django.contrib import admin, messages
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group, User
from django.core.exceptions import PermissionDenied
from django.template.response import TemplateResponse
from django_dramatiq.models import Task as DramatiqTask

from core.errors import Forbidden, WardenError

from .access import authorize, membership_grant, membership_revoke
from .admin_scope import SUPERUSER, ReadOnlyScopedAdmin, ScopedAdmin, ScopedInline
from .audit import audit
from .models import (
    AllowRule,
    ApiToken,
    ApprovalPolicy,
    ApprovalRequest,
    AuditEvent,
    Decision,
    Membership,
    Notification,
    Project,
)
from .services import approval_decide
from .tokens import api_token_create, api_token_revoke


@admin.register(ApiToken)
class ApiTokenAdmin(admin.ModelAdmin):
    """Each staff member's own tokens (a superuser's: everyone's). A token is made for oneself only
    (superusers excepted); what it may do is fixed when it is made."""

    list_display = ["prefix", "user", "name", "scopes", "created_at", "last_used_at", "expires_at", "revoked_at"]
    list_filter = ["revoked_at", "expires_at"]
    search_fields = ["prefix", "name", "user__username"]
    readonly_fields = ["prefix", "token_hash", "created_at", "last_used_at", "revoked_at"]
    fields = [
        "user",
        "name",
        "scopes",
        "for_agent",
        "expires_at",
        "prefix",
        "token_hash",
        "created_at",
        "last_used_at",
        "revoked_at",
    ]
    actions = ["revoke"]

    def get_queryset(self, request):
        rows = super().get_queryset(request)
        return rows if request.user.is_superuser else rows.filter(user=request.user)  # one's own tokens only

    def _own(self, request, obj) -> bool:
        return request.user.is_superuser or obj is None or obj.user_id == request.user.pk

    def has_view_permission(self, request, obj=None):
        return self._own(request, obj) and super().has_view_permission(request, obj)

    def has_change_permission(self, request, obj=None):
        return self._own(request, obj) and super().has_change_permission(request, obj)

    def has_delete_permission(self, request, obj=None):
        return request.user.is_superuser and super().has_delete_permission(request, obj)

    def formfield_for_foreignkey(self, db_field, request, **kwargs):
        if db_field.name == "user" and not request.user.is_superuser:
            kwargs["queryset"] = get_user_model().objects.filter(pk=request.user.pk)
            kwargs["initial"] = request.user.pk
        return super().formfield_for_foreignkey(db_field, request, **kwargs)

    def get_readonly_fields(self, request, obj=None):
        # What a token may do is fixed when it is made: a new token is made for other rights.
        return self.readonly_fields + (["user", "scopes", "for_agent"] if obj is not None else [])

    def save_model(self, request, obj, form, change):
        if change:
            obj.save(update_fields=["name", "expires_at"])
            audit(actor=request.user, action="token_change", target=f"token {obj.prefix}", request=request)
            return
        try:
            token, raw = api_token_create(
                user=obj.user,
                name=obj.name,
                expires_at=obj.expires_at,
                scopes=obj.scopes or None,
                for_agent=obj.for_agent,
                created_by=request.user,
                request=request,
            )
        except (Forbidden, ValueError) as exc:
            raise PermissionDenied(str(exc)) from exc
        obj.pk = token.pk
        obj.refresh_from_db()
        messages.warning(request, f"The new token is {raw} — copy it now, it will not be shown again.")

    @admin.action(description="Revoke the selected tokens")
    def revoke(self, request, queryset):
        for token in queryset:
            api_token_revoke(token=token)
            audit(actor=request.user, action="token_revoke", target=f"token {token.prefix}", request=request)


class DecisionInline(ScopedInline, admin.TabularInline):
    model = Decision
    fields = ["reviewer", "verdict", "comment", "arguments_hash", "edited_arguments", "at"]
    readonly_fields = fields
    extra = 0
    can_delete = False

    def has_add_permission(self, request, obj=None):
        return False


@admin.register(ApprovalRequest)
class ApprovalRequestAdmin(ReadOnlyScopedAdmin):
    """Read-only, decided through the actions: each decision quotes the arguments hash of what the
    confirmation page showed, like a decision in the queue or through the API."""

    project_path = "run__project"
    list_display = ["id", "run", "kind", "parent", "status", "quorum", "requested_at", "expires_at", "decided_at"]
    list_filter = ["status", "kind"]
    search_fields = ["=id", "=run__id", "summary", "note"]
    inlines = [DecisionInline]
    readonly_fields = [
        "run",
        "task",
        "parent",
        "kind",
        "status",
        "quorum",
        "admins_only",
        "requested_by",
        "summary",
        "arguments_hash",
        "requested_at",
        "expires_at",
        "decided_at",
        "decided_by",
        "note",
    ]
    actions = ["approve", "reject"]

    def _decide(self, request, queryset, approve: bool):
        """First a page that shows each request as it stands (its summary and arguments hash); only its
        confirmation decides, bound to those hashes. Refused rows are said and audited at once."""
        allowed = []
        for approval in queryset.select_related("run"):
            try:
                authorize(
                    request.user,
                    approval.run.project_id,
                    "decide",
                    what=f"approval request {approval.id}",
                    request=request,
                )
                allowed.append(approval)
            except WardenError as exc:
                self.message_user(request, f"{approval}: {exc}", messages.ERROR)
        if not allowed:
            return None
        action = "approve" if approve else "reject"
        note = request.POST.get("note", "").strip()
        if request.POST.get("confirm") == "yes":
            for approval in allowed:
                try:
                    approval_decide(
                        request_id=approval.id,
                        user=request.user,
                        approve=approve,
                        note=note or ("in the admin" if approve else ""),
                        seen_hash=request.POST.get(f"hash-{approval.id}", ""),
                        request=request,
                    )
                    self.message_user(request, f"{approval}: {action}d", messages.SUCCESS)
                except WardenError as exc:
                    self.message_user(request, f"{approval}: {exc}", messages.ERROR)
            return None
        context = {
            **self.admin_site.each_context(request),
            "title": f"{action.capitalize()} approval requests",
            "requests": allowed,
            "decision": action,
            "action_checkbox_name": admin.helpers.ACTION_CHECKBOX_NAME,
            "opts": self.model._meta,
        }
        return TemplateResponse(request, "admin/approvals/decide_confirm.html", context)

    @admin.action(description="Approve the selected requests")
    def approve(self, request, queryset):
        return self._decide(request, queryset, True)

    @admin.action(description="Reject the selected requests")
    def reject(self, request, queryset):
        return self._decide(request, queryset, False)


class MembershipInline(ScopedInline, admin.TabularInline):
    """Who belongs to the project, as a list: memberships are granted on their own page."""

    model = Membership
    fields = ["user", "role", "created_at"]
    readonly_fields = fields
    extra = 0
    can_delete = False

    def has_add_permission(self, request, obj=None):
        return False

    def has_change_permission(self, request, obj=None):
        return False


@admin.register(Project)
class ProjectAdmin(ScopedAdmin):
    """Members see their projects; a project's admins rename it; superusers create and delete them."""

    project_path = "pk"
    change_action = "administer"
    add_action = SUPERUSER
    list_display = ["slug", "name", "created_at"]
    search_fields = ["slug", "name"]
    inlines = [MembershipInline]

    def get_readonly_fields(self, request, obj=None):
        return ["slug"] if obj and not request.user.is_superuser else []


@admin.register(Membership)
class MembershipAdmin(ScopedAdmin):
    """Granted only by an admin of that project, never above the granter's own role (superusers: any)."""

    project_path = "project"
    change_action = add_action = delete_action = "administer"
    list_display = ["project", "user", "role", "created_at"]
    list_filter = ["role", "project"]
    search_fields = ["user__username", "project__slug"]

    def get_readonly_fields(self, request, obj=None):
        return ["project", "user"] if obj else []  # another person or project is another membership

    def save_through_service(self, request, obj, form, change):
        try:
            membership_grant(user=obj.user, project=obj.project, role=obj.role, granter=request.user, request=request)
        except WardenError as exc:
            raise PermissionDenied(str(exc)) from exc
        obj.pk = Membership.objects.get(user=obj.user, project=obj.project).pk

    def delete_through_service(self, request, obj):
        try:
            membership_revoke(user=obj.user, project=obj.project, granter=request.user, request=request)
        except WardenError as exc:
            raise PermissionDenied(str(exc)) from exc


@admin.register(AuditEvent)
class AuditEventAdmin(ReadOnlyScopedAdmin):
    """Read-only: the log cannot be changed or deleted from here (nor anywhere else). Rows of no project
    (logins) are a superuser's to read."""

    project_path = "project"
    delete_action = None
    list_display = ["at", "actor_label", "via", "action", "outcome", "target", "run", "address"]
    list_filter = ["outcome", "via", "action"]
    search_fields = ["actor_label", "action", "target", "=run__id"]
    date_hierarchy = "at"


@admin.register(Decision)
class DecisionAdmin(ReadOnlyScopedAdmin):
    project_path = "request__run__project"
    delete_action = None
    list_display = ["id", "request", "reviewer", "verdict", "at"]
    list_filter = ["verdict"]
    search_fields = ["=request__id", "reviewer__username", "comment"]
    readonly_fields = ["request", "reviewer", "verdict", "comment", "arguments_hash", "edited_arguments", "at"]


@admin.register(ApprovalPolicy)
class ApprovalPolicyAdmin(ScopedAdmin):
    """A project's policies are its admins' to write; policies of every project (no project) are a
    superuser's. Every change is audited."""

    project_path = "project"
    shared_rows = True
    change_action = add_action = delete_action = "administer"
    list_display = ["name", "enabled", "project", "workflow", "tool", "quorum", "expires_after_seconds", "on_expiry"]
    list_filter = ["enabled", "on_expiry", "on_reject", "project"]
    search_fields = ["name", "tool"]


@admin.register(Notification)
class NotificationAdmin(ReadOnlyScopedAdmin):
    project_path = "request__run__project"

    list_display = ["id", "request", "channel", "kind", "created_at", "sent_at", "error"]
    list_filter = ["channel", "kind"]
    search_fields = ["=request__id", "error"]


@admin.register(AllowRule)
class AllowRuleAdmin(ReadOnlyScopedAdmin):
    """Listed and revocable here; created through the API (the checks and the audit live in one place)."""

    project_path = "project"
    list_display = [
        "id",
        "project",
        "tool",
        "arguments",
        "agent",
        "run",
        "covers_irreversible",
        "created_by",
        "expires_at",
        "revoked_at",
    ]
    list_filter = ["tool", "covers_irreversible", "project"]
    search_fields = ["tool", "note", "created_by__username"]
    actions = ["revoke"]

    @admin.action(description="Revoke the selected allow rules")
    def revoke(self, request, queryset):
        from .rules import allow_rule_revoke

        for rule in queryset:
            try:
                allow_rule_revoke(user=request.user, rule_id=rule.id, request=request)
            except WardenError as exc:
                self.message_user(request, f"{rule}: {exc}", messages.ERROR)


class SuperusersOnly:
    """People and the queue's own records: a superuser's (a staff member with every permission on users
    could otherwise make themselves a superuser)."""

    def _root(self, request) -> bool:
        return request.user.is_active and request.user.is_superuser

    def has_module_permission(self, request):
        return self._root(request)

    def has_view_permission(self, request, obj=None):
        return self._root(request) and super().has_view_permission(request, obj)

    def has_change_permission(self, request, obj=None):
        return self._root(request) and super().has_change_permission(request, obj)

    def has_add_permission(self, request):
        return self._root(request) and super().has_add_permission(request)

    def has_delete_permission(self, request, obj=None):
        return self._root(request) and super().has_delete_permission(request, obj)


# People, the queue's records of its messages (its admin keeps them read-only) and the login lockouts (a
# superuser unlocks by deleting the attempt; axes' own "clean up" action needs a login request, so it goes).
for _model in (User, Group, DramatiqTask, AccessAttempt, AccessLog, AccessFailureLog):
    _admin = type(admin.site._registry[_model])
    _extra = {"actions": []} if _model is AccessAttempt else {}
    admin.site.unregister(_model)
    admin.site.register(_model, type(_admin.__name__, (SuperusersOnly, _admin), _extra))
