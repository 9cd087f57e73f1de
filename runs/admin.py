"""Admin for data fixes. Statuses are read-only here: state changes go through the engine's services
(the actions below), so the admin cannot make a transition the engine would refuse."""

from django import forms
from django.contrib import admin, messages
from django.urls import reverse
from django.utils.html import format_html, format_html_join
from django.utils.safestring import mark_safe

from agents.models import Workflow
from core.errors import WardenError
from core.outbound import url_refusal
from tenancy.access import authorize, default_project
from tenancy.admin_scope import ReadOnlyScopedAdmin, ScopedAdmin, ScopedInline, SuperuserAdmin, SuperuserReadOnlyAdmin
from tenancy.audit import audit
from tenancy.models import AuditEvent
from tools.models import SealedArguments, ToolOperation

from .evals import checks_refusal, rerun_on_refusal
from .models import (
    Annotation,
    Artifact,
    BlackboardEntry,
    EvalCase,
    EvalResult,
    EvalRun,
    EvalSuite,
    FaultFiring,
    IdempotencyKey,
    OtlpExportCursor,
    OtlpTrace,
    Outbox,
    Payload,
    QuarantinedResult,
    Run,
    Span,
    Task,
    WebhookDelivery,
    WebhookEndpoint,
    WorkerProcess,
)
from .saga import compensation_plan, operation_resolve, run_compensate
from .services import run_cancel, run_resume, run_start, task_retry
from .services.runs import RUN_BUDGET_FIELDS, run_budget_set
from .transitions import TransitionNotAllowed
from .webhooks import webhook_endpoint_save


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
    actions = ["cancel_runs", "resume_runs", "compensate_runs"]

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

    @admin.action(description="Compensate the selected runs (undo committed effects; corrections need approval)")
    def compensate_runs(self, request, queryset):
        from django.template.response import TemplateResponse

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
        from .services.artifacts import artifact_reject

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


@admin.register(OtlpExportCursor)
class OtlpExportCursorAdmin(SuperuserReadOnlyAdmin):
    """How far the live OTLP export has gone (a superuser may delete it to start again from now)."""

    list_display = ["last_span_id", "since"]


@admin.register(OtlpTrace)
class OtlpTraceAdmin(RunData):
    """Which run each OpenTelemetry trace sent to Warden became (runs/otlp_ingest.py)."""

    list_display = ["trace_id", "run", "project", "created_at"]
    search_fields = ["trace_id"]


@admin.register(FaultFiring)
class FaultFiringAdmin(RunData):
    list_display = ["id", "run", "task_key", "point", "mode", "created_at"]
    list_filter = ["mode"]


@admin.register(Payload)
class PayloadAdmin(SuperuserReadOnlyAdmin):
    list_display = ["id", "size", "created_at"]


@admin.register(IdempotencyKey)
class IdempotencyKeyAdmin(SuperuserReadOnlyAdmin):
    list_display = ["key", "status", "response_status", "created_at", "locked_at"]
    list_filter = ["status"]
    search_fields = ["key"]
    exclude = ["scope"]  # a hash of the caller's credentials: nothing to read in it


class DeliveryInline(ScopedInline, admin.TabularInline):
    model = WebhookDelivery
    fields = ["event", "status", "attempts", "last_status_code", "delivered_at", "created_at"]
    readonly_fields = fields
    extra = 0
    max_num = 0
    ordering = ["-id"]
    show_change_link = True


class WebhookEndpointForm(forms.ModelForm):
    url = forms.URLField(max_length=500, assume_scheme="https")

    class Meta:
        model = WebhookEndpoint
        fields = ["url", "secret", "project", "events", "active"]

    def clean_url(self):
        url = self.cleaned_data["url"]
        why = url_refusal(url)
        if why:
            raise forms.ValidationError(why)
        return url


@admin.register(WebhookEndpoint)
class WebhookEndpointAdmin(SuperuserAdmin):
    """Only superusers: an endpoint receives every event of the projects it covers."""

    form = WebhookEndpointForm
    list_display = ["url", "project", "events", "active", "created_at"]
    list_filter = ["active", "project"]
    inlines = [DeliveryInline]

    def get_readonly_fields(self, request, obj=None):
        return ["secret_hint"] if obj else []

    def get_fields(self, request, obj=None):
        # The secret is written once; afterwards only its first characters are shown.
        return ["url", "project", "events", "active", "secret_hint"] if obj else ["url", "secret", "project", "events"]

    @admin.display(description="secret")
    def secret_hint(self, obj):
        return f"{obj.secret[:4]}…"

    def save_through_service(self, request, obj, form, change):
        webhook_endpoint_save(endpoint=obj, actor=request.user, created=not change, request=request)


@admin.register(WebhookDelivery)
class WebhookDeliveryAdmin(SuperuserReadOnlyAdmin):
    """The delivery log; "send again" requeues a delivery with a fresh count of attempts."""

    list_display = ["id", "event", "endpoint", "status", "attempts", "last_status_code", "delivered_at", "created_at"]
    list_filter = ["status", "event"]
    search_fields = ["event", "endpoint__url", "last_error"]
    actions = ["redeliver"]

    @admin.action(description="Send the selected deliveries again")
    def redeliver(self, request, queryset):

        from .webhooks import webhook_redeliver

        for delivery in queryset:
            webhook_redeliver(delivery_id=delivery.id)
            audit(actor=request.user, action="webhook_redeliver", target=f"delivery {delivery.id}", request=request)
        self.message_user(request, f"{queryset.count()} queued again", messages.SUCCESS)


class EvalCaseForm(forms.ModelForm):
    """Checks are validated as the API validates them: a bad one is refused here, not found failing later."""

    class Meta:
        model = EvalCase
        fields = ["name", "workflow", "baseline_workflow", "goal", "input", "checks"]

    def clean_checks(self):
        checks = self.cleaned_data["checks"]
        errors = checks_refusal(checks)
        if errors:
            raise forms.ValidationError([error["message"] for error in errors])
        return checks


class EvalCaseInline(ScopedInline, admin.StackedInline):
    model = EvalCase
    form = EvalCaseForm
    extra = 0
    fields = ["name", "workflow", "baseline_workflow", "goal", "input", "checks"]


class EvalSuiteForm(forms.ModelForm):
    class Meta:
        model = EvalSuite
        fields = ["slug", "name", "description", "project", "rerun_on", "quarantine"]
        widgets = {"quarantine": forms.CheckboxSelectMultiple}

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        # Only this suite's own cases can be its known failures (a new suite has none yet).
        if "quarantine" in self.fields:  # absent where the admin shows the suite read-only
            self.fields["quarantine"].queryset = (
                self.instance.cases.all() if self.instance.pk else EvalCase.objects.none()
            )

    def clean_rerun_on(self):
        rerun_on = self.cleaned_data["rerun_on"]
        errors = rerun_on_refusal(rerun_on)
        if errors:
            raise forms.ValidationError([error["message"] for error in errors])
        return rerun_on


@admin.register(EvalSuite)
class EvalSuiteAdmin(ScopedAdmin):
    """Suites are a project's configuration: its admins write them (and their cases)."""

    form = EvalSuiteForm
    project_path = "project"
    change_action = add_action = delete_action = "administer"
    list_display = ["slug", "name", "project", "rerun_on"]
    list_filter = ["project"]
    search_fields = ["slug", "name", "description"]
    inlines = [EvalCaseInline]


@admin.register(EvalCase)
class EvalCaseAdmin(ScopedAdmin):
    project_path = "suite__project"
    change_action = add_action = delete_action = "administer"
    form = EvalCaseForm
    list_display = ["name", "suite", "workflow", "from_run"]
    list_filter = ["suite"]


@admin.register(EvalRun)
class EvalRunAdmin(RunData):
    project_path = "suite__project"
    list_display = ["id", "suite", "version", "baseline", "trigger", "started_by", "created_at", "accepted"]
    list_filter = ["suite"]


@admin.register(EvalResult)
class EvalResultAdmin(RunData):
    project_path = "run__project"
    list_display = ["eval_run", "case", "run", "passed", "judge_cost_micros"]
    list_filter = ["passed"]


@admin.register(Annotation)
class AnnotationAdmin(RunData):
    """Reviewers' scores and comments: written from the run page or the API (annotation_create), kept."""

    list_display = ["run", "target", "target_id", "score", "author", "created_at"]
    list_filter = ["target"]
    search_fields = ["=run__id", "comment"]


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
        from .blackboard import entry_decide

        note = f"{verdict} in the admin by {request.user.get_username()} (operator)"
        admin_action_apply(self, request, queryset, entry_decide, id_arg="entry_id", verdict=verdict, note=note)


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
