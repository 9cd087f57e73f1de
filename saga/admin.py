"""The saga's admin actions: compensating runs (the Runs page) and resolving ambiguous operations (the
ledger's page). The pages themselves are the engine's (runs/admin.py); these add the saga's services to them,
so each action calls the service that audits it."""

from django.contrib import admin, messages
from django.template.response import TemplateResponse

from core.errors import WardenError
from runs import admin as runs_admin
from runs.admin import RunData, admin_action_apply
from runs.models import Run
from tenancy.access import authorize
from tools.models import ToolOperation

from .compensation import compensation_plan, operation_resolve, run_compensate

admin.site.unregister(Run)


@admin.register(Run)
class RunAdmin(runs_admin.RunAdmin):
    actions = [*runs_admin.RunAdmin.actions, "compensate_runs"]

    @admin.action(description="Compensate the selected runs (undo committed effects; corrections need approval)")
    def compensate_runs(self, request, queryset):
        if request.POST.get("confirm") == "yes":
            reason = f"compensation requested by {request.user}"
            admin_action_apply(self, request, queryset, run_compensate, reason=reason)
            return None
        # First show exactly what would be undone or corrected; nothing changes until confirmed.

        allowed = []
        for run in queryset:
            try:
                authorize(request.user, run.project_id, "operate", what=f"run {run.id}", request=request)
                allowed.append(run)
            except WardenError as exc:
                self.message_user(request, f"{run}: {exc}", messages.ERROR)
        if not allowed:
            return None
        queryset = allowed
        context = {
            **self.admin_site.each_context(request),
            "title": "Compensate runs",
            "plans": [(run, compensation_plan(run.id)) for run in queryset],
            "selected": [run.id for run in queryset],
            "action_checkbox_name": admin.helpers.ACTION_CHECKBOX_NAME,
            "opts": self.model._meta,
        }
        return TemplateResponse(request, "admin/runs/compensate_confirm.html", context)


# The ledger: statuses change only through the broker and the saga (the actions below); secret argument
# values never appear here.
@admin.register(ToolOperation)
class ToolOperationAdmin(RunData):
    list_display = [
        "id",
        "run",
        "task",
        "step",
        "kind",
        "tool",
        "status",
        "tool_class",
        "reversibility",
        "gate",
        "committed_at",
    ]
    list_filter = ["status", "gate", "kind", "tool", "tool_class", "reversibility", "proposed"]
    search_fields = ["=id", "=run__id", "idempotency_key", "tool", "external_id", "status_reason"]
    list_select_related = ["run", "task"]
    actions = ["resolve_committed", "resolve_not_committed"]

    def _resolve(self, request, queryset, committed: bool):
        note = f"checked by {request.user}"
        admin_action_apply(
            self, request, queryset, operation_resolve, id_arg="operation_id", committed=committed, note=note
        )

    @admin.action(description="Resolve the selected ambiguous operations: the effect happened")
    def resolve_committed(self, request, queryset):
        self._resolve(request, queryset, committed=True)

    @admin.action(description="Resolve the selected ambiguous operations: the effect did not happen")
    def resolve_not_committed(self, request, queryset):
        self._resolve(request, queryset, committed=False)
