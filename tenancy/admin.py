"""The admin of projects, memberships, API tokens and the audit log; people and the queue's own records are
a superuser's."""

from axes.models import AccessAttempt, AccessFailureLog, AccessLog
from django.contrib import admin, messages
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group, User
from django.core.exceptions import PermissionDenied
from django_dramatiq.models import Task as DramatiqTask

from core.errors import Forbidden, WardenError

from .access import membership_grant, membership_revoke
from .admin_scope import SUPERUSER, ReadOnlyScopedAdmin, ScopedAdmin, ScopedInline
from .audit import audit
from .models import ApiToken, AuditEvent, ChangeRequest, Membership, Project
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
    list_display = ["slug", "name", "governance", "created_at"]
    search_fields = ["slug", "name"]
    inlines = [MembershipInline]

    def get_readonly_fields(self, request, obj=None):
        # Single-admin governance lets one admin loosen the rules alone: the deployment's owner decides.
        return ["slug", "governance"] if obj and not request.user.is_superuser else []


@admin.register(ChangeRequest)
class ChangeRequestAdmin(ReadOnlyScopedAdmin):
    """Changes that loosen a project's rules, waiting for (or decided by) a second admin: decided on the
    reviewer queue (/approvals/) or through the API, listed here for the record."""

    project_path = "project"
    view_action = "administer"
    list_display = ["id", "project", "label", "action", "status", "requested_by", "requested_at", "decided_by"]
    list_filter = ["status", "project", "subject"]
    search_fields = ["label", "requested_by__username"]
    readonly_fields = ["project", "subject", "object_id", "action", "label", "before", "after", "loosens", "status",
                       "requested_by", "requested_at", "decided_by", "decided_at", "note"]  # fmt: skip


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
