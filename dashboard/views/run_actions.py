"""An operator's actions on a run: cancel, resume, compensate, retry a task (from a step), fork the run
from a task's step, resolve an ambiguous operation, verify or reject a blackboard entry.

GET shows what the action would do and asks to confirm; it changes nothing. POST does it through the same
services as the API and the admin, writes the audit row in the same transaction, and sends the browser
back to the run page (303) with a message. A refusal (the engine's, or bad input) re-renders the page
with the reason, and nothing has changed. Plain forms: everything works with JavaScript off.
"""

import json

from django.conf import settings
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import Http404, HttpResponseRedirect
from django.shortcuts import render
from django.urls import reverse
from django.views.decorators.http import require_http_methods

from core.errors import Forbidden, InvalidInput, NotFound, WardenError
from policy.models import ApprovalRequest
from runs import blackboard, services
from runs.models import Artifact, BlackboardEntry, Run, Span, Task
from runs.refusals import run_cancel_refusal, run_resume_refusal
from runs.transitions import TransitionNotAllowed
from saga import compensation as saga
from tools.catalog import tool_spec
from tools.models import ToolOperation

from .common import run_for_view

OS = ToolOperation.Status
_get_or_post = require_http_methods(["GET", "POST"])


def _status(exc: Exception) -> int:
    if isinstance(exc, InvalidInput):
        return 400
    if isinstance(exc, NotFound):
        return 404
    if isinstance(exc, Forbidden):
        return 403
    return 409  # a conflict with the run's state, or a transition its state machine refuses


def _describe(exc: Exception) -> str:
    details = "; ".join(f"{e['field']}: {e['message']}" for e in getattr(exc, "errors", None) or [])
    return f"{exc} ({details})" if details else str(exc)


def _see_other(url: str) -> HttpResponseRedirect:
    response = HttpResponseRedirect(url)
    response.status_code = 303  # after a POST, the browser GETs the run page
    return response


def _reason(request, *, required: bool, default: str = "") -> str:
    value = request.POST.get("reason", "").strip()
    if required and not value:
        raise InvalidInput("a reason is required", [{"field": "reason", "message": "required"}])
    if len(value) > 1000:
        raise InvalidInput("the reason is too long", [{"field": "reason", "message": "at most 1000 characters"}])
    return value or default


def _confirm(request, run: Run, template: str, context, act, *, get_status: int = 200):
    """GET: the confirmation page, with ``context()`` (the preview, from the current state). POST:
    ``act()``, which calls one service (it records its outcome in the audit log, refusals included, and
    raises on refusal) and returns its message (and the run to go to, when it made another), then back
    to the run."""
    error, status = "", get_status
    if request.method == "POST":
        try:
            message = act()
        except (WardenError, TransitionNotAllowed) as exc:
            error, status = _describe(exc), _status(exc)
            run.refresh_from_db()
        else:
            message, to = message if isinstance(message, tuple) else (message, run.id)
            messages.success(request, message)
            return _see_other(reverse("runs:detail", args=[to]))
    page = {"run": run, "error": error, "posted": request.POST if request.method == "POST" else {}}
    return render(request, template, {**page, **context()}, status=status)


def _by(request) -> dict:
    """Who acts, for the services' audit rows."""
    return {"actor": request.user, "via": "page", "request": request}


# --- cancel ---------------------------------------------------------------------------------------------


def _cancel_preview(run: Run) -> dict:
    tasks = list(run.tasks.select_related("agent").order_by("id"))
    refused = run_cancel_refusal(run)
    return {
        "refusal": "" if refused is None else str(refused),
        "running": [t for t in tasks if t.status == Task.Status.RUNNING],
        "queued": [t for t in tasks if t.status not in Task.TERMINAL and t.status != Task.Status.RUNNING],
        "approvals": list(
            ApprovalRequest.objects.filter(run=run, status=ApprovalRequest.Status.PENDING, parent=None).order_by("id")
        ),
        "not_done": list(
            ToolOperation.objects.filter(run=run, kind="action", status__in=[OS.PROPOSED, OS.APPROVED])
            .select_related("task")
            .order_by("id")
        ),
        "grace_seconds": settings.WARDEN["CANCEL_GRACE_SECONDS"],
    }


@login_required
@_get_or_post
def cancel(request, run_id: int):
    run = run_for_view(request, run_id, "operate")

    def act():
        reason = _reason(request, required=True)
        cancelled = services.run_cancel(run_id=run.id, reason=reason, **_by(request))
        if cancelled.status == Run.Status.CANCELLED:
            return f"Run {run.id} is cancelled."
        return f"Run {run.id} is cancelling: running tasks stop at their next step."

    context = lambda: _cancel_preview(run)  # noqa: E731
    return _confirm(request, run, "runs/cancel.html", context, act)


# --- resume -----------------------------------------------------------------------------------------------


def _resume_preview(run: Run) -> dict:
    tasks = list(run.tasks.select_related("agent").order_by("id"))
    return {
        "refusal": str(run_resume_refusal(run) or ""),
        "failed": [t for t in tasks if t.status == Task.Status.FAILED],
        "blocked": [t for t in tasks if t.status == Task.Status.PENDING],
        "sent_again": [t for t in tasks if t.status in (Task.Status.READY, Task.Status.RETRY_WAIT)],
        "waiting": [t for t in tasks if t.status == Task.Status.WAITING_FOR_APPROVAL],
        "code_version": settings.WARDEN["CODE_VERSION"],
    }


@login_required
@_get_or_post
def resume(request, run_id: int):
    run = run_for_view(request, run_id, "operate")

    def act():
        reason = _reason(request, required=False, default=f"resumed by {request.user} from the dashboard")
        services.run_resume(run_id=run.id, reason=reason, **_by(request))
        return f"Run {run.id} is running again."

    context = lambda: _resume_preview(run)  # noqa: E731
    return _confirm(request, run, "runs/resume.html", context, act)


# --- compensate -------------------------------------------------------------------------------------------


def _compensate_preview(run: Run) -> dict:
    plan = saga.compensation_plan(run.id)
    running = list(run.tasks.filter(status=Task.Status.RUNNING).values_list("key", flat=True))
    refusal = str(saga.run_compensate_refusal(run, running=running, unresolved=plan["unresolved"]) or "")
    unresolved = ToolOperation.objects.filter(id__in=plan["unresolved"]).select_related("task").order_by("id")
    return {"plan": plan, "unresolved": list(unresolved), "refusal": refusal}


@login_required
@_get_or_post
def compensate(request, run_id: int):
    run = run_for_view(request, run_id, "operate")

    def act():
        reason = _reason(request, required=True)
        plan = saga.compensation_plan(run.id)
        saga.run_compensate(run_id=run.id, reason=reason, **_by(request))
        message = f"Run {run.id} is being compensated: {len(plan['undo'])} effect(s) to undo"
        if plan["correct"]:
            message += f", {len(plan['correct'])} correction(s) waiting for a reviewer"
        return f"{message}."

    context = lambda: _compensate_preview(run)  # noqa: E731
    return _confirm(request, run, "runs/compensate.html", context, act)


# --- retry a task -----------------------------------------------------------------------------------------


def _step(raw: str, *, what: str = "the step to retry from", field: str = "from_step") -> int | None:
    raw = raw.strip()
    if not raw:
        return None
    try:
        return int(raw)
    except ValueError:
        raise InvalidInput(
            f"{what} must be a whole number, not {raw[:40]!r}", [{"field": field, "message": "a whole number"}]
        ) from None


@login_required
@_get_or_post
def task_retry(request, run_id: int, task_id: int):
    run = run_for_view(request, run_id, "operate")
    task = Task.objects.filter(id=task_id, run=run).first()
    if task is None:
        raise Http404(f"run {run.id} has no task {task_id}")
    source = request.POST if request.method == "POST" else request.GET
    try:
        step, step_error = _step(source.get("from_step", "")), ""
        repeat = [_step(v, what="a step to repeat", field="repeat") for v in source.getlist("repeat") if v.strip()]
    except InvalidInput as exc:
        step, step_error, repeat = None, _describe(exc), []

    def context():
        task.refresh_from_db()
        # With a step that is not a number, the page shows the plain retry's journal to pick from.
        plain = step_error or step is None
        preview = services.task_retry_preview(
            task_id=task.id, step=None if step_error else step, repeat=() if plain else repeat
        )
        return {"task": task, "step_error": step_error, "preview": preview, "failed": task.status == "failed"}

    def act():
        if step_error:
            raise InvalidInput(step_error)
        reason = _reason(request, required=False, default=f"retried by {request.user} from the dashboard")
        if step is None and not repeat:
            services.task_retry(task_id=task.id, reason=reason, **_by(request))
            return f"Task {task.key} is retried."
        if step is None:
            raise InvalidInput(
                "only a retry from a step repeats effects", [{"field": "repeat", "message": "pick a step"}]
            )
        services.task_retry_from(task_id=task.id, step=step, repeat=repeat, reason=reason, **_by(request))
        chosen = f"; {len(repeat)} effect(s) will happen again once a reviewer approves each" if repeat else ""
        return f"Task {task.key} is retried from step {step}{chosen}."

    return _confirm(
        request,
        run,
        "runs/task_retry.html",
        context,
        act,
        get_status=400 if step_error else 200,
    )


# --- fork from a task's step -----------------------------------------------------------------------------


def _fork_steps(run: Run, task: Task | None) -> tuple[list, int | None]:
    """The task's journal, for the step picker, and the step offered first: the one it failed at, or a
    completed task's last (its answer)."""
    if task is None:
        return [], None
    journal = list(
        Span.objects.filter(task=task, step__isnull=False).order_by("step").values("step", "kind", "name", "attempt")
    )
    last = journal[-1]["step"] if journal else 0
    return journal, (last if task.status == Task.Status.COMPLETED else last + 1) or 1


@login_required
@_get_or_post
def fork(request, run_id: int):
    run = run_for_view(request, run_id, "operate")
    source = request.POST if request.method == "POST" else request.GET
    tasks = list(run.tasks.order_by("id"))
    task_key = source.get("task", "").strip()
    task = next((t for t in tasks if t.key == task_key), None)
    journal, offered = _fork_steps(run, task)
    try:
        step, step_error = _step(source.get("step", ""), what="the step to fork from", field="step"), ""
    except InvalidInput as exc:
        step, step_error = None, _describe(exc)
    step = step or offered

    def context():
        preview = None
        if task is not None and step is not None and not step_error:
            preview = services.run_fork_preview(run_id=run.id, task_key=task.key, step=step)
        return {
            "tasks": tasks,
            "task": task,
            "task_key": task_key,
            "journal": journal,
            "step": step,
            "next_step": offered if task is not None and task.status != Task.Status.COMPLETED else None,
            "step_error": step_error,
            "preview": preview,
        }

    def act():
        if step_error:
            raise InvalidInput(step_error)
        reason = _reason(request, required=False, default=f"forked by {request.user} from the dashboard")
        forked = services.run_fork(run_id=run.id, task_key=task_key, step=step or 0, reason=reason, **_by(request))
        return f"Run {forked.id} is forked from run {run.id} at {task_key} step {step}.", forked.id

    return _confirm(request, run, "runs/fork.html", context, act, get_status=400 if step_error else 200)


# --- resolve an ambiguous operation ----------------------------------------------------------------------


@login_required
@_get_or_post
def operation_resolve(request, run_id: int, operation_id: int):
    run = run_for_view(request, run_id, "operate")
    op = ToolOperation.objects.filter(id=operation_id, run=run).select_related("task").first()
    if op is None:
        raise Http404(f"run {run.id} has no operation {operation_id}")

    def context():
        op.refresh_from_db()
        spec = tool_spec(op.tool, run.project_id)
        refusal = str(saga.operation_resolve_refusal(op) or "")
        return {
            "op": op,
            "arguments": json.dumps(op.arguments, indent=1, sort_keys=True, default=str),
            "system": spec.system if spec else "",
            "has_lookup": spec is not None and spec.lookup is not None,
            "in_flight": op.status == OS.EXECUTING and op.task_id and op.task.status == Task.Status.RUNNING,
            "refusal": refusal,
        }

    def act():
        verdict = request.POST.get("committed", "")
        if verdict not in ("yes", "no"):
            raise InvalidInput(
                "say whether the effect is in the outside system", [{"field": "committed", "message": "yes or no"}]
            )
        note = request.POST.get("note", "").strip()
        if not note:
            raise InvalidInput("a note on what you found is required", [{"field": "note", "message": "required"}])
        if len(note) > 1000:
            raise InvalidInput("the note is too long", [{"field": "note", "message": "at most 1000 characters"}])
        saga.operation_resolve(operation_id=op.id, committed=verdict == "yes", note=note, **_by(request))
        found = "committed" if verdict == "yes" else "not committed"
        message = f"Operation {op.id} ({op.tool}) is resolved as {found}."
        return message

    return _confirm(request, run, "runs/operation_resolve.html", context, act)


# --- verify or reject a blackboard entry ------------------------------------------------------------------


@login_required
@_get_or_post
def blackboard_decide(request, run_id: int, entry_id: int):
    run = run_for_view(request, run_id, "operate")
    entry = BlackboardEntry.objects.filter(id=entry_id, run=run).select_related("author_task").first()
    if entry is None:
        raise Http404(f"run {run.id} has no blackboard entry {entry_id}")

    def context():
        entry.refresh_from_db()
        latest = BlackboardEntry.objects.filter(run=run, key=entry.key).order_by("-version").first()
        sources = dict(Artifact.objects.filter(run=run, id__in=entry.sources).values_list("id", "key"))
        return {
            "entry": entry,
            "value": json.dumps(entry.value, indent=1, sort_keys=True, default=str),
            "sources": [(i, sources.get(i, "")) for i in entry.sources],
            "latest": latest.version if latest else entry.version,
        }

    def act():
        verdict = request.POST.get("verdict", "")
        note = request.POST.get("note", "")
        blackboard.entry_decide(entry_id=entry.id, verdict=verdict, note=note, **_by(request))
        return f"Blackboard entry {entry.key} v{entry.version} is {verdict}."

    return _confirm(request, run, "runs/blackboard_decide.html", context, act)
