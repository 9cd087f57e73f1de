"""Admin for data fixes. Statuses are read-only here: state changes go through the engine's services
(the actions below), so the admin cannot make a transition the engine would refuse."""

from django.contrib import admin, messages
from django.urls import reverse
from django.utils.html import format_html, format_html_join
from django.utils.safestring import mark_safe

from agents.models import Workflow
from core.errors import WardenError
from tenancy.access import authorize, default_project
from tenancy.admin_scope import ReadOnlyScopedAdmin, ScopedAdmin, ScopedInline, SuperuserReadOnlyAdmin
from tenancy.models import AuditEvent
from tools.models import SealedArguments, ToolOperation

from .blackboard import entry_decide
from .models import (
    Artifact,
    BlackboardEntry,
    FaultFiring,
    Outbox,
    Payload,
    QuarantinedResult,
    Run,
    Span,
    Task,
    WorkerProcess,
)
from .services import run_cancel, run_resume, run_start, task_retry
from .services.artifacts import artifact_reject
from .services.runs import RUN_BUDGET_FIELDS, run_budget_set
from .transitions import TransitionNotAllowed


class RunData(ReadOnlyScopedAdmin):
    """A run's records: seen by the run's project's members, changed only through the engine's services
    (the actions), deleted only by a superuser (a data fix)."""

    project_path = "run__project"


def _project_id(obj) -> int:
    return obj.project_id if isinstance(obj, Run) else obj.run.project_id


def admin_action_apply(modeladmin, request, queryset, service, id_arg="run_id", access="operate", **kwargs):
    """Run a service on each selected row the user's role allows; the service records it in the audit log."""

    done = 0
    for obj in queryset:
        what = f"{obj._meta.model_name} {obj.id}"
        try:
            authorize(request.user, _project_id(obj), access, what=what, request=request)
            service(**{id_arg: obj.id, **kwargs}, actor=request.user, via="admin", request=request)
            done += 1
        except (TransitionNotAllowed, WardenError) as exc:
            modeladmin.message_user(request, f"{obj}: {exc}", messages.ERROR)
    if done:
        modeladmin.message_user(request, f"{done} done", messages.SUCCESS)


class TaskInline(ScopedInline, admin.TabularInline):
    model = Task
    fields = ["key", "agent", "status", "attempts", "max_attempts", "fencing_token", "lease_owner", "lease_expires_at"]
    readonly_fields = fields
    extra = 0
    can_delete = False
    show_change_link = True

    def has_add_permission(self, request, obj=None):
        return False

    def has_change_permission(self, request, obj=None):
        return False  # a list: tasks change through the engine (the Tasks page's actions)


@admin.register(Run)
class RunAdmin(RunData):
    project_path = "project"
    list_display = [
        "id",
        "workflow",
        "status",
        "goal",
        "steps_used",
        "tokens_used",
        "cost_usd",
        "started_by",
        "created_at",
    ]
    list_filter = ["status", "workflow", "created_at", ("pruned_at", admin.EmptyFieldListFilter)]
    search_fields = ["=id", "goal", "status_reason", "started_by__username"]
    date_hierarchy = "created_at"
    list_select_related = ["workflow", "started_by"]
    # Only the budget is edited here (a data fix: raise it so a resumed run can finish), by the run's
    # operators, through a service that audits it; everything else changes through the actions.
    change_action = "operate"
    readonly_fields = [
        "workflow",
        "project",
        "goal",
        "input",
        "held_back",
        "status",
        "status_reason",
        "plan_version",
        "steps_used",
        "tokens_used",
        "tool_calls_used",
        "cost_micros",
        "started_by",
        "code_version",
        "workflow_version",
        "versions",
        "created_at",
        "started_at",
        "finished_at",
        "pruned_at",
        "cancel_requested_at",
        "ops_lease_owner",
        "ops_lease_expires_at",
        "ledger",
        "audit",
    ]
    inlines = [TaskInline]
    actions = ["cancel_runs", "resume_runs"]  # and compensate_runs (saga/admin.py)

    def save_through_service(self, request, obj, form, change):
        changes = {name: form.cleaned_data[name] for name in form.changed_data if name in RUN_BUDGET_FIELDS}
        run_budget_set(run_id=obj.id, changes=changes, actor=request.user, request=request)

    @admin.display(description="ledger")
    def ledger(self, run):
        """The run's tool operations (arguments redacted; see Tool operations for whole rows)."""
        ops = ToolOperation.objects.filter(run=run).select_related("task").order_by("id")
        rows = format_html_join(
            "",
            "<tr><td><a href='{}'>{}</a></td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
            (
                (
                    reverse("admin:tools_tooloperation_change", args=[op.id]),
                    op.id,
                    op.task.key if op.task_id else "",
                    op.step or "",
                    op.kind,
                    op.tool,
                    op.status,
                    op.external_id,
                )
                for op in ops
            ),
        )
        columns = ["op", "task", "step", "kind", "tool", "status", "external id"]
        head = "<tr>" + "".join(f"<th>{c}</th>" for c in columns) + "</tr>"
        return format_html("<table>{}{}</table>", mark_safe(head), rows) if ops else "no tool operation"

    @admin.display(description="audit")
    def audit(self, run):
        """Who did (or tried) what to this run."""

        events = AuditEvent.objects.filter(run_id=run.id).order_by("id")[:200]
        rows = format_html_join(
            "",
            "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
            (
                (e.at.strftime("%Y-%m-%d %H:%M:%S"), e.actor_label or "system", e.via, e.action, e.outcome, e.target)
                for e in events
            ),
        )
        return format_html("<table>{}</table>", rows) if events else "nothing yet"

    @admin.action(description="Cancel the selected runs")
    def cancel_runs(self, request, queryset):
        admin_action_apply(self, request, queryset, run_cancel, reason=f"cancelled by {request.user} in the admin")

    @admin.action(description="Resume the selected runs (needs attention → running)")
    def resume_runs(self, request, queryset):
        admin_action_apply(self, request, queryset, run_resume, reason=f"resumed by {request.user} in the admin")


@admin.register(Task)
class TaskAdmin(RunData):
    list_display = ["id", "run", "key", "agent", "status", "attempts", "max_attempts", "failure_class", "lease_owner"]
    list_filter = ["status", "failure_class", "agent"]
    search_fields = ["key", "=run__id", "status_reason", "lease_owner"]
    list_select_related = ["run", "agent"]
    readonly_fields = [
        "run",
        "key",
        "agent",
        "depends_on",
        "status",
        "status_reason",
        "failure_class",
        "attempts",
        "recoveries",
        "lease_owner",
        "lease_expires_at",
        "heartbeat_at",
        "fencing_token",
        "journal_epoch",
        "ready_at",
        "not_before",
        "continuing",
        "steps_used",
        "tokens_used",
        "tool_calls_used",
        "cost_micros",
        "plan_version",
        "depth",
        "created_at",
        "started_at",
        "finished_at",
    ]
    actions = ["retry_tasks"]

    @admin.action(description="Retry the selected failed tasks")
    def retry_tasks(self, request, queryset):
        admin_action_apply(
            self, request, queryset, task_retry, id_arg="task_id", reason=f"retried by {request.user} in the admin"
        )


@admin.register(Span)
class SpanAdmin(RunData):
    list_display = [
        "id",
        "run",
        "task",
        "kind",
        "name",
        "status",
        "attempt",
        "step",
        "tokens_in",
        "tokens_out",
        "cost_micros",
        "started_at",
    ]
    list_filter = ["kind", "status"]
    search_fields = ["name", "=run__id", "task__key"]
    list_select_related = ["run", "task"]


@admin.register(Artifact)
class ArtifactAdmin(RunData):
    list_display = ["id", "run", "key", "version", "verification", "created_at"]
    list_filter = ["verification"]
    search_fields = ["key", "=run__id"]
    actions = ["reject_artifacts"]

    @admin.action(description="Reject: tasks that join it stop instead of using it (the run needs attention)")
    def reject_artifacts(self, request, queryset):
        admin_action_apply(self, request, queryset, artifact_reject, id_arg="artifact_id")


@admin.register(QuarantinedResult)
class QuarantinedResultAdmin(RunData):
    list_display = ["id", "run", "task", "reason", "fencing_token", "step", "worker", "created_at"]
    list_filter = ["reason"]
    search_fields = ["=run__id", "worker"]


@admin.register(Outbox)
class OutboxAdmin(SuperuserReadOnlyAdmin):
    list_display = ["id", "actor", "kwargs", "delay_ms", "created_at"]
    search_fields = ["actor"]


@admin.register(WorkerProcess)
class WorkerProcessAdmin(SuperuserReadOnlyAdmin):
    """The worker registry (runs/workers.py); operators see it live at /workers/. A superuser may delete
    the row of a process that will not come back (the sweepers delete them after a day anyway)."""

    list_display = ["name", "kind", "threads", "started_at", "beat_at", "swept_at", "stopped_at"]
    search_fields = ["name", "host"]


@admin.register(FaultFiring)
class FaultFiringAdmin(RunData):
    list_display = ["id", "run", "task_key", "point", "mode", "created_at"]
    list_filter = ["mode"]


@admin.register(Payload)
class PayloadAdmin(SuperuserReadOnlyAdmin):
    list_display = ["id", "size", "created_at"]


@admin.register(BlackboardEntry)
class BlackboardEntryAdmin(RunData):
    list_display = ["run", "key", "version", "kind", "verification", "verified_by", "expires_at", "created_at"]
    list_filter = ["verification", "kind"]
    search_fields = ["key", "=run__id"]
    actions = ["verify_entries", "reject_entries"]

    @admin.action(description="Verify: the run's tasks are given these entries from their next attempt")
    def verify_entries(self, request, queryset):
        self._decide(request, queryset, BlackboardEntry.Verification.VERIFIED)

    @admin.action(description="Reject: the run's tasks are no longer given these entries")
    def reject_entries(self, request, queryset):
        self._decide(request, queryset, BlackboardEntry.Verification.REJECTED)

    def _decide(self, request, queryset, verdict):
        note = f"{verdict} in the admin by {request.user.get_username()} (operator)"
        admin_action_apply(self, request, queryset, entry_decide, id_arg="entry_id", verdict=verdict, note=note)


@admin.register(SealedArguments)
class SealedArgumentsAdmin(RunData):
    """Which calls had secret arguments; the values themselves are not shown."""

    project_path = "task__run__project"

    list_display = ["id", "task", "step", "secret_fields"]
    search_fields = ["=task__id"]
    fields = ["task", "step", "secret_fields"]

    @admin.display(description="secret fields")
    def secret_fields(self, obj):
        return ", ".join(sorted(obj.values))


@admin.register(Workflow)
class WorkflowAdmin(ScopedAdmin):
    """A project's workflows are its admins' to configure (tool policies, the agents a planner may
    assign); shared workflows (no project) are a superuser's."""

    project_path = "project"
    shared_rows = True
    change_action = add_action = delete_action = "administer"
    list_display = ["slug", "name", "project", "planner", "planner_agent", "max_tasks", "max_concurrent_tasks"]
    list_filter = ["planner", "project"]
    search_fields = ["slug", "name", "description"]
    actions = ["start_runs"]

    @admin.action(description="Start a run of each selected workflow (default goal and budget)")
    def start_runs(self, request, queryset):

        for workflow in queryset:
            project = workflow.project or default_project()
            try:
                authorize(request.user, project.id, "start", what=f"project {project.slug}", request=request)
                who = {"started_by": request.user, "via": "admin", "request": request}
                run = run_start(workflow=workflow.slug, project=project, **who)
            except WardenError as exc:
                self.message_user(request, f"{workflow.slug}: {exc}", messages.ERROR)
                continue
            self.message_user(request, f"{workflow.slug}: started run {run.id}", messages.SUCCESS)
