"""An operator's actions on a run: cancel, resume, compensate, retry a task (from a step), resolve an
ambiguous operation.

GET shows what the action would do and asks to confirm; it changes nothing. POST does it through the same
services as the API and the admin, writes the audit row in the same transaction, and sends the browser
back to the run page (303) with a message. A refusal (the engine's, or bad input) re-renders the page
with the reason, and nothing has changed. Plain forms: everything works with JavaScript off.
"""

import json

from django.conf import settings
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.db import transaction
from django.http import Http404, HttpResponseRedirect
from django.shortcuts import render
from django.urls import reverse
from django.views.decorators.http import require_http_methods

from approvals.audit import audit
from approvals.models import ApprovalRequest
from runs.errors import Conflict, Forbidden, InvalidInput, NotFound, WardenError
from runs.models import Run, Task
from runs.services import run_cancel, run_resume, task_retry_from, task_retry_preview
from runs.services import task_retry as task_retry_service
from runs.transitions import RUN_TRANSITIONS, TransitionNotAllowed
from tools.models import ToolOperation
from tools.registry import TOOLS
from tools.saga import COMPENSABLE_FROM, compensation_plan, operation_resolve, run_compensate

from .common import run_for_view

OS = ToolOperation.Status
_methods = require_http_methods(["GET", "POST"])


class _Done:
    """What a POST did, for the audit log and the message on the run page."""

    def __init__(self, action: str, target: str, message: str, **detail):
        self.action, self.target, self.message, self.detail = action, target, message, detail


def _status(exc: Exception) -> int:
    if isinstance(exc, InvalidInput):
        return 400
    if isinstance(exc, NotFound):
        return 404
    if isinstance(exc, Forbidden):
        return 403
    return 409  # a conflict with the run's state, or a transition the state machine refuses


def _describe(exc: Exception) -> str:
    details = "; ".join(f"{e['field']}: {e['message']}" for e in getattr(exc, "errors", None) or [])
    return f"{exc} ({details})" if details else str(exc)


def _see_other(url: str) -> HttpResponseRedirect:
    response = HttpResponseRedirect(url)
    response.status_code = 303  # after a POST, the browser GETs the run page
    return response


def _required(request, field: str, what: str) -> str:
    value = request.POST.get(field, "").strip()
    if not value:
        raise InvalidInput(f"{what} is required", [{"field": field, "message": "required"}])
    if len(value) > 1000:
        raise InvalidInput(f"{what} is too long", [{"field": field, "message": "at most 1000 characters"}])
    return value


def _confirm(request, run: Run, template: str, context, act):
    """GET: the confirmation page. POST: ``act()`` (which raises on refusal) and its audit row in one
    transaction, then back to the run. ``context()`` builds the page's preview from the current state."""
    error, status = "", 200
    if request.method == "POST":
        try:
            with transaction.atomic():
                done = act()
                audit(
                    actor=request.user,
                    action=done.action,
                    run=run,
                    target=done.target,
                    detail=done.detail,
                    request=request,
                )
        except (WardenError, TransitionNotAllowed) as exc:
            error, status = _describe(exc), _status(exc)
            run.refresh_from_db()
        else:
            messages.success(request, done.message)
            return _see_other(reverse("runs:detail", args=[run.id]))
    page = {"run": run, "error": error, "posted": request.POST if request.method == "POST" else {}}
    return render(request, template, {**page, **context()}, status=status)


def _allowed(run: Run, to: str) -> str:
    """Why the run cannot go to ``to`` now ("" if it can)."""
    return "" if to in RUN_TRANSITIONS[run.status] else f"run {run.id} is {run.status}: it cannot go to {to}"


# --- cancel ---------------------------------------------------------------------------------------------


def _cancel_preview(run: Run) -> dict:
    tasks = list(run.tasks.select_related("agent").order_by("id"))
    return {
        "refusal": _allowed(run, Run.Status.CANCELLING),
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
@_methods
def cancel(request, run_id: int):
    run = run_for_view(request, run_id, "operate")

    def act():
        reason = _required(request, "reason", "a reason")
        done = run_cancel(run_id=run.id, reason=reason)
        if done.status == Run.Status.CANCELLED:
            message = f"Run {run.id} is cancelled."
        else:
            message = f"Run {run.id} is cancelling: running tasks stop at their next step."
        return _Done("run_cancel", f"run {run.id}", message, reason=reason)

    return _confirm(request, run, "runs/cancel.html", lambda: _cancel_preview(run), act)


# --- resume -----------------------------------------------------------------------------------------------


def _resume_refusal(run: Run) -> str:
    if run.status != Run.Status.NEEDS_ATTENTION:
        return f"run {run.id} is {run.status}; only a run that needs attention can be resumed"
    return ""


def _resume_preview(run: Run) -> dict:
    tasks = list(run.tasks.select_related("agent").order_by("id"))
    return {
        "refusal": _resume_refusal(run),
        "failed": [t for t in tasks if t.status == Task.Status.FAILED],
        "blocked": [t for t in tasks if t.status == Task.Status.PENDING],
        "sent_again": [t for t in tasks if t.status in (Task.Status.READY, Task.Status.RETRY_WAIT)],
        "waiting": [t for t in tasks if t.status == Task.Status.WAITING_FOR_APPROVAL],
        "code_version": settings.WARDEN["CODE_VERSION"],
    }


@login_required
@_methods
def resume(request, run_id: int):
    run = run_for_view(request, run_id, "operate")

    def act():
        reason = request.POST.get("reason", "").strip()[:1000] or f"resumed by {request.user} from the dashboard"
        # Checked under the run's lock, in the transaction run_resume joins: a run waiting for a decision
        # or already running is not "resumed" by an operator.
        locked = Run.objects.select_for_update().get(id=run.id)
        refusal = _resume_refusal(locked)
        if refusal:
            raise Conflict(refusal)
        run_resume(run_id=run.id, reason=reason)
        return _Done("run_resume", f"run {run.id}", f"Run {run.id} is running again.", reason=reason)

    return _confirm(request, run, "runs/resume.html", lambda: _resume_preview(run), act)


# --- compensate -------------------------------------------------------------------------------------------


def _compensate_preview(run: Run) -> dict:
    plan = compensation_plan(run.id)
    running = list(run.tasks.filter(status=Task.Status.RUNNING).values_list("key", flat=True))
    refusal = ""
    if run.status not in COMPENSABLE_FROM:
        refusal = f"run {run.id} is {run.status}; only a run that needs attention, failed or was cancelled"
        refusal += " can be compensated"
    elif running:
        refusal = f"tasks {', '.join(running)} are still running; compensate when they have stopped"
    elif plan["unresolved"]:
        refusal = "some operations may or may not have happened: resolve them first"
    unresolved = ToolOperation.objects.filter(id__in=plan["unresolved"]).select_related("task").order_by("id")
    return {"plan": plan, "unresolved": list(unresolved), "refusal": refusal}


@login_required
@_methods
def compensate(request, run_id: int):
    run = run_for_view(request, run_id, "operate")

    def act():
        reason = _required(request, "reason", "a reason")
        plan = compensation_plan(run.id)
        run_compensate(run_id=run.id, reason=reason)
        message = f"Run {run.id} is being compensated: {len(plan['undo'])} to undo"
        message += f", {len(plan['correct'])} correction(s) waiting for a reviewer." if plan["correct"] else "."
        return _Done(
            "run_compensate",
            f"run {run.id}",
            message,
            reason=reason,
            undo=[item["operation"] for item in plan["undo"]],
            correct=[item["operation"] for item in plan["correct"]],
        )

    return _confirm(request, run, "runs/compensate.html", lambda: _compensate_preview(run), act)


# --- retry a task -----------------------------------------------------------------------------------------


def _step(raw: str) -> int | None:
    raw = raw.strip()
    if not raw:
        return None
    try:
        return int(raw)
    except ValueError:
        raise InvalidInput(
            f"the step to retry from must be a whole number, not {raw[:40]!r}",
            [{"field": "from_step", "message": "a whole number"}],
        ) from None


@login_required
@_methods
def task_retry(request, run_id: int, task_id: int):
    run = run_for_view(request, run_id, "operate")
    task = Task.objects.filter(id=task_id, run=run).first()
    if task is None:
        raise Http404(f"run {run.id} has no task {task_id}")
    source = request.POST if request.method == "POST" else request.GET
    try:
        step, step_error = _step(source.get("from_step", "")), ""
    except InvalidInput as exc:
        step, step_error = None, _describe(exc)

    def context():
        task.refresh_from_db()
        # With a step that is not a number, the page shows the plain retry's journal to pick from.
        preview = task_retry_preview(task_id=task.id, step=None if step_error else step)
        return {"task": task, "step_error": step_error, "preview": preview, "failed": task.status == "failed"}

    def act():
        if step_error:
            raise InvalidInput(step_error)
        reason = request.POST.get("reason", "").strip()[:1000] or f"retried by {request.user} from the dashboard"
        if step is None:
            task_retry_service(task_id=task.id, reason=reason)
            return _Done("task_retry", f"task {task.id}", f"Task {task.key} is retried.", reason=reason)
        preview = task_retry_preview(task_id=task.id, step=step)
        repeated = [op["id"] for op in preview["repeated_effects"]]
        if repeated and request.POST.get("repeat_effects") != "yes":
            raise InvalidInput(
                f"confirm that {len(repeated)} committed effect(s) will happen a second time",
                [{"field": "repeat_effects", "message": "required"}],
            )
        retried = task_retry_from(task_id=task.id, step=step, reason=reason)
        return _Done(
            "task_retry_from",
            f"task {task.id}",
            f"Task {task.key} is retried from step {step}.",
            reason=reason,
            from_step=step,
            journal_epoch=retried.journal_epoch,
            re_executed=[s["step"] for s in preview["re_executed"]],
            repeated_operations=repeated,
        )

    return _confirm(request, run, "runs/task_retry.html", context, act)


# --- resolve an ambiguous operation ----------------------------------------------------------------------


@login_required
@_methods
def operation_resolve(request, run_id: int, operation_id: int):
    run = run_for_view(request, run_id, "operate")
    op = ToolOperation.objects.filter(id=operation_id, run=run).select_related("task").first()
    if op is None:
        raise Http404(f"run {run.id} has no operation {operation_id}")

    def context():
        op.refresh_from_db()
        spec = TOOLS.get(op.tool)
        refusal = ""
        if op.status not in (OS.AMBIGUOUS, OS.EXECUTING):
            refusal = f"operation {op.id} is {op.status}; only an ambiguous one can be resolved"
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
                "say whether the effect is in the outside system",
                [{"field": "committed", "message": "yes or no"}],
            )
        note = _required(request, "note", "a note on what you found")
        operation_resolve(operation_id=op.id, committed=verdict == "yes", note=note)
        found = "committed" if verdict == "yes" else "not committed"
        return _Done(
            "operation_resolve",
            f"operation {op.id}",
            f"Operation {op.id} ({op.tool}) is resolved as {found}.",
            committed=verdict == "yes",
            note=note,
        )

    return _confirm(request, run, "runs/operation_resolve.html", context, act)
