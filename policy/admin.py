"""The admin of the policy app's models that need nothing above it: decisions (read-only) and allow rules
(listed and revoked here; created through the API). Approval requests and approval policies register in
approvals/admin.py, whose actions (deciding, the four-eyes rules) are the reviewer's work. All of them
are under /admin/policy/; the old /admin/approvals/… URLs redirect (config/urls.py)."""

from django.contrib import admin, messages

from core.errors import WardenError
from tenancy.admin_scope import ReadOnlyScopedAdmin, ScopedInline

from .models import AllowRule, Decision
from .rules import allow_rule_revoke


class DecisionInline(ScopedInline, admin.TabularInline):
    model = Decision
    fields = ["reviewer", "verdict", "comment", "arguments_hash", "edited_arguments", "at"]
    readonly_fields = fields
    extra = 0
    can_delete = False

    def has_add_permission(self, request, obj=None):
        return False


@admin.register(Decision)
class DecisionAdmin(ReadOnlyScopedAdmin):
    project_path = "request__run__project"
    delete_action = None
    list_display = ["id", "request", "reviewer", "verdict", "at"]
    list_filter = ["verdict"]
    search_fields = ["=request__id", "reviewer__username", "comment"]
    readonly_fields = ["request", "reviewer", "verdict", "comment", "arguments_hash", "edited_arguments", "at"]


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
        for rule in queryset:
            try:
                allow_rule_revoke(user=request.user, rule_id=rule.id, request=request)
            except WardenError as exc:
                self.message_user(request, f"{rule}: {exc}", messages.ERROR)
