from django.contrib import admin, messages

from runs.admin import ProjectScoped, ReadOnlyAdmin
from runs.errors import WardenError
from runs.events import access_changed

from .access import authorize
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

    def get_readonly_fields(self, request, obj=None):
        # What a token may do is fixed when it is made: a new token is made for other rights.
        return self.readonly_fields + (["user", "scopes", "for_agent"] if obj is not None else [])

    def save_model(self, request, obj, form, change):
        if change:
            obj.save(update_fields=["name", "expires_at"])
            return
        token, raw = api_token_create(
            user=obj.user, name=obj.name, expires_at=obj.expires_at, scopes=obj.scopes or None, for_agent=obj.for_agent
        )
        obj.pk = token.pk
        obj.refresh_from_db()
        messages.warning(request, f"The new token is {raw} — copy it now, it will not be shown again.")

    @admin.action(description="Revoke the selected tokens")
    def revoke(self, request, queryset):
        for token in queryset:
            api_token_revoke(token=token)


class DecisionInline(admin.TabularInline):
    model = Decision
    fields = ["reviewer", "verdict", "comment", "arguments_hash", "edited_arguments", "at"]
    readonly_fields = fields
    extra = 0
    can_delete = False

    def has_add_permission(self, request, obj=None):
        return False


@admin.register(ApprovalRequest)
class ApprovalRequestAdmin(ProjectScoped, admin.ModelAdmin):
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
        "summary",
        "arguments_hash",
        "requested_at",
        "expires_at",
        "decided_at",
        "decided_by",
        "note",
    ]
    actions = ["approve", "reject"]

    def has_add_permission(self, request):
        return False

    def _decide(self, request, queryset, approve: bool):
        for approval in queryset:
            try:
                authorize(
                    request.user,
                    approval.run.project_id,
                    "decide",
                    what=f"approval request {approval.id}",
                    request=request,
                )
                approval_decide(
                    request_id=approval.id, user=request.user, approve=approve, note="in the admin", request=request
                )
            except WardenError as exc:
                self.message_user(request, f"{approval}: {exc}", messages.ERROR)

    @admin.action(description="Approve the selected requests")
    def approve(self, request, queryset):
        self._decide(request, queryset, True)

    @admin.action(description="Reject the selected requests")
    def reject(self, request, queryset):
        self._decide(request, queryset, False)


class MembershipInline(admin.TabularInline):
    model = Membership
    extra = 1


@admin.register(Project)
class ProjectAdmin(admin.ModelAdmin):
    list_display = ["slug", "name", "created_at"]
    search_fields = ["slug", "name"]
    inlines = [MembershipInline]


@admin.register(Membership)
class MembershipAdmin(admin.ModelAdmin):
    list_display = ["project", "user", "role", "created_at"]
    list_filter = ["role", "project"]
    search_fields = ["user__username", "project__slug"]

    # Open dashboard sockets follow membership changes at once (runs/consumers.py).
    def save_model(self, request, obj, form, change):
        super().save_model(request, obj, form, change)
        access_changed(obj.user_id)

    def delete_model(self, request, obj):
        super().delete_model(request, obj)
        access_changed(obj.user_id)

    def delete_queryset(self, request, queryset):
        users = set(queryset.values_list("user_id", flat=True))
        super().delete_queryset(request, queryset)
        for user_id in users:
            access_changed(user_id)


@admin.register(AuditEvent)
class AuditEventAdmin(ProjectScoped, admin.ModelAdmin):
    """Read-only: the log cannot be changed or deleted from here (nor anywhere else)."""

    project_path = "project"
    list_display = ["at", "actor_label", "via", "action", "outcome", "target", "run", "address"]
    list_filter = ["outcome", "via", "action"]
    search_fields = ["actor_label", "action", "target", "=run__id"]
    date_hierarchy = "at"

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False


@admin.register(Decision)
class DecisionAdmin(ProjectScoped, admin.ModelAdmin):
    project_path = "request__run__project"
    list_display = ["id", "request", "reviewer", "verdict", "at"]
    list_filter = ["verdict"]
    search_fields = ["=request__id", "reviewer__username", "comment"]
    readonly_fields = ["request", "reviewer", "verdict", "comment", "arguments_hash", "edited_arguments", "at"]

    def has_add_permission(self, request):
        return False

    def has_delete_permission(self, request, obj=None):
        return False


@admin.register(ApprovalPolicy)
class ApprovalPolicyAdmin(admin.ModelAdmin):
    list_display = ["name", "enabled", "project", "workflow", "tool", "quorum", "expires_after_seconds", "on_expiry"]
    list_filter = ["enabled", "on_expiry", "on_reject", "project"]
    search_fields = ["name", "tool"]

    def save_model(self, request, obj, form, change):
        super().save_model(request, obj, form, change)
        from .audit import audit

        audit(
            actor=request.user,
            action="policy_change" if change else "policy_add",
            target=str(obj),
            request=request,
            detail={"changed": form.changed_data},
        )


@admin.register(Notification)
class NotificationAdmin(ReadOnlyAdmin):
    list_display = ["id", "request", "channel", "kind", "created_at", "sent_at", "error"]
    list_filter = ["channel", "kind"]
    search_fields = ["=request__id", "error"]


@admin.register(AllowRule)
class AllowRuleAdmin(ProjectScoped, ReadOnlyAdmin):
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
