"""Admin for data fixes. Statuses are read-only here: state changes go through the engine's services
(the actions below), so the admin cannot make a transition the engine would refuse."""

from django.contrib import admin, messages
from django.urls import reverse
from django.utils.html import format_html, format_html_join
from django.utils.safestring import mark_safe

from tools.models import ToolOperation

from .errors import WardenError
from .models import (
    Artifact,
    BlackboardEntry,
    EvalCase,
    EvalResult,
    EvalRun,
    EvalSuite,
    FaultFiring,
    IdempotencyKey,
    Outbox,
    Payload,
    QuarantinedResult,
    Run,
    Span,
    Task,
    WebhookDelivery,
    WebhookEndpoint,
)
from .services import run_cancel, run_resume, task_retry
from .transitions import TransitionNotAllowed


class ReadOnlyAdmin(admin.ModelAdmin):
    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False


class ProjectScoped:
    """A staff member who is not a superuser sees only rows of the projects they belong to."""

    project_path = "run__project"

    def get_queryset(self, request):
        from approvals.access import project_ids

        rows = super().get_queryset(request)
        visible = project_ids(request.user, "view")
        return rows if visible is None else rows.filter(**{f"{self.project_path}__in": visible})

    def has_delete_permission(self, request, obj=None):
        return request.user.is_superuser  # deleting a run's records is a superuser's data fix, not a role's


def _project_id(obj) -> int:
    return obj.project_id if isinstance(obj, Run) else obj.run.project_id


def _apply(modeladmin, request, queryset, service, id_arg="run_id", access="operate", **kwargs):
    """Run a service on each selected row the user's role allows, and record each in the audit log."""
    from approvals.access import authorize
    from approvals.audit import audit

    done = 0
    for obj in queryset:
        what = f"{obj._meta.model_name} {obj.id}"
        run = obj if isinstance(obj, Run) else obj.run
        try:
            authorize(request.user, _project_id(obj), access, what=what, request=request)
            service(**{id_arg: obj.id, **kwargs})
            audit(actor=request.user, action=service.__name__, run=run, target=what, request=request)
            done += 1
        except (TransitionNotAllowed, WardenError) as exc:
            modeladmin.message_user(request, f"{obj}: {exc}", messages.ERROR)
    if done:
        modeladmin.message_user(request, f"{done} done", messages.SUCCESS)


class TaskInline(admin.TabularInline):
    model = Task
    fields = ["key", "agent", "status", "attempts", "max_attempts", "fencing_token", "lease_owner", "lease_expires_at"]
    readonly_fields = fields
    extra = 0
    can_delete = False
    show_change_link = True

    def has_add_permission(self, request, obj=None):
        return False


@admin.register(Run)
class RunAdmin(ProjectScoped, admin.ModelAdmin):
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
    readonly_fields = [
        "workflow",
        "status",
        "status_reason",
        "plan_version",
        "steps_used",
        "tokens_used",
        "tool_calls_used",
        "cost_micros",
        "started_by",
        "code_version",
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
    actions = ["cancel_runs", "resume_runs", "compensate_runs"]

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
        from approvals.models import AuditEvent

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
        _apply(self, request, queryset, run_cancel, reason=f"cancelled by {request.user} in the admin")

    @admin.action(description="Resume the selected runs (needs attention → running)")
    def resume_runs(self, request, queryset):
        _apply(self, request, queryset, run_resume, reason=f"resumed by {request.user} in the admin")

    @admin.action(description="Compensate the selected runs (undo committed effects; corrections need approval)")
    def compensate_runs(self, request, queryset):
        from django.template.response import TemplateResponse

        from tools.saga import compensation_plan, run_compensate  # the tools app builds on the engine

        if request.POST.get("confirm") == "yes":
            _apply(self, request, queryset, run_compensate, reason=f"compensation requested by {request.user}")
            return None
        # First show exactly what would be undone or corrected; nothing changes until confirmed.
        from approvals.access import authorize

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


@admin.register(Task)
class TaskAdmin(ProjectScoped, admin.ModelAdmin):
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
        _apply(self, request, queryset, task_retry, id_arg="task_id", reason=f"retried by {request.user} in the admin")


@admin.register(Span)
class SpanAdmin(ProjectScoped, ReadOnlyAdmin):
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
class ArtifactAdmin(ProjectScoped, ReadOnlyAdmin):
    list_display = ["id", "run", "key", "version", "verification", "created_at"]
    list_filter = ["verification"]
    search_fields = ["key", "=run__id"]
    actions = ["reject_artifacts"]

    @admin.action(description="Reject: tasks that join it stop instead of using it (the run needs attention)")
    def reject_artifacts(self, request, queryset):
        from .services.artifacts import artifact_reject

        _apply(self, request, queryset, artifact_reject, id_arg="artifact_id")


@admin.register(QuarantinedResult)
class QuarantinedResultAdmin(ProjectScoped, ReadOnlyAdmin):
    list_display = ["id", "run", "task", "reason", "fencing_token", "step", "worker", "created_at"]
    list_filter = ["reason"]
    search_fields = ["=run__id", "worker"]


@admin.register(Outbox)
class OutboxAdmin(ReadOnlyAdmin):
    list_display = ["id", "actor", "kwargs", "delay_ms", "created_at"]
    search_fields = ["actor"]


@admin.register(FaultFiring)
class FaultFiringAdmin(ReadOnlyAdmin):
    list_display = ["id", "run", "task_key", "point", "mode", "created_at"]
    list_filter = ["mode"]


@admin.register(Payload)
class PayloadAdmin(ReadOnlyAdmin):
    list_display = ["id", "size", "created_at"]


@admin.register(IdempotencyKey)
class IdempotencyKeyAdmin(ReadOnlyAdmin):
    list_display = ["key", "status", "response_status", "created_at", "locked_at"]
    list_filter = ["status"]
    search_fields = ["key"]
    exclude = ["scope"]  # a hash of the caller's credentials: nothing to read in it


class DeliveryInline(admin.TabularInline):
    model = WebhookDelivery
    fields = ["event", "status", "attempts", "last_status_code", "delivered_at", "created_at"]
    readonly_fields = fields
    extra = 0
    max_num = 0
    ordering = ["-id"]
    show_change_link = True


@admin.register(WebhookEndpoint)
class WebhookEndpointAdmin(admin.ModelAdmin):
    """Only superusers: an endpoint receives every event of the projects it covers."""

    list_display = ["url", "project", "events", "active", "created_at"]
    list_filter = ["active", "project"]
    inlines = [DeliveryInline]

    def has_module_permission(self, request):
        return request.user.is_superuser

    has_view_permission = has_change_permission = has_add_permission = has_delete_permission = (
        lambda self, request, obj=None: request.user.is_superuser
    )

    def get_readonly_fields(self, request, obj=None):
        return ["secret_hint"] if obj else []

    def get_fields(self, request, obj=None):
        # The secret is written once; afterwards only its first characters are shown.
        return ["url", "project", "events", "active", "secret_hint"] if obj else ["url", "secret", "project", "events"]

    @admin.display(description="secret")
    def secret_hint(self, obj):
        return f"{obj.secret[:4]}…"


@admin.register(WebhookDelivery)
class WebhookDeliveryAdmin(ReadOnlyAdmin):
    """The delivery log; "send again" requeues a delivery with a fresh count of attempts."""

    list_display = ["id", "event", "endpoint", "status", "attempts", "last_status_code", "delivered_at", "created_at"]
    list_filter = ["status", "event"]
    search_fields = ["event", "endpoint__url", "last_error"]
    actions = ["redeliver"]

    def has_module_permission(self, request):
        return request.user.is_superuser

    def has_view_permission(self, request, obj=None):
        return request.user.is_superuser

    @admin.action(description="Send the selected deliveries again")
    def redeliver(self, request, queryset):
        from approvals.audit import audit

        from .webhooks import webhook_redeliver

        for delivery in queryset:
            webhook_redeliver(delivery_id=delivery.id)
            audit(actor=request.user, action="webhook_redeliver", target=f"delivery {delivery.id}", request=request)
        self.message_user(request, f"{queryset.count()} queued again", messages.SUCCESS)


class EvalCaseInline(admin.StackedInline):
    model = EvalCase
    extra = 0
    fields = ["name", "workflow", "goal", "input", "checks"]


@admin.register(EvalSuite)
class EvalSuiteAdmin(ProjectScoped, admin.ModelAdmin):
    project_path = "project"
    list_display = ["slug", "name", "project"]
    list_filter = ["project"]
    search_fields = ["slug", "name", "description"]
    inlines = [EvalCaseInline]


@admin.register(EvalCase)
class EvalCaseAdmin(ProjectScoped, admin.ModelAdmin):
    project_path = "suite__project"
    list_display = ["name", "suite", "workflow"]
    list_filter = ["suite"]


@admin.register(EvalRun)
class EvalRunAdmin(ProjectScoped, ReadOnlyAdmin):
    project_path = "suite__project"
    list_display = ["id", "suite", "version", "started_by", "created_at"]
    list_filter = ["suite"]


@admin.register(EvalResult)
class EvalResultAdmin(ProjectScoped, ReadOnlyAdmin):
    project_path = "run__project"
    list_display = ["eval_run", "case", "run", "passed"]
    list_filter = ["passed"]


@admin.register(BlackboardEntry)
class BlackboardEntryAdmin(ProjectScoped, ReadOnlyAdmin):
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
        from .blackboard import entry_decide

        by = f"{request.user.get_username()} (operator)"

        def blackboard_decide(*, entry_id):
            entry_decide(entry_id=entry_id, verdict=verdict, note=f"{verdict} in the admin by {by}", by=by)

        _apply(self, request, queryset, blackboard_decide, id_arg="entry_id")
