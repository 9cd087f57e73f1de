"""Runs of agents that run elsewhere (LangGraph, the OpenAI Agents SDK, plain code).

The agent opens a run of an external workflow, opens its tasks, reports each model call and step as a
span (usage counted on the task and the run, as the engine counts its own), and sends every
side-effecting call through the ledger *before* making it: Warden answers with the idempotency key to
pass to the provider and whether a reviewer must approve first (the workflow's tool policies and the
admin's approval rules, as for any run). The agent waits for the decision (long-poll), calls its
provider with the key, and records the receipt or the failure. Asking again for the same step with
the same arguments returns the same operation — a rerun of the agent finds what is already done.

With each intent the agent may say how its effect is undone (``undo``: a tool and its arguments). If an
operator compensates the run, Warden plans it like any other run's (reverse commit order; a correction
of an irreversible effect waits for a reviewer) and the agent carries out each step it is given: it
lists the approved undo operations, starts each, makes the call with the key Warden gives it, and
reports the outcome; the last report settles the run as compensated.
"""

from django.db import transaction
from django.utils import timezone
from django.utils.text import slugify

from agents.models import Agent, Workflow
from core import bus, hooks
from core.errors import BudgetExceeded, BudgetRefused, Conflict, Forbidden, InvalidInput, NotFound
from policy.services import approval_request_for_operation
from runs.models import Run, Span, Task
from runs.selectors import run_gate_facts
from runs.services import sql
from runs.services.hot import Usage
from runs.services.runs import run_transition
from runs.transitions import TASK
from tools.broker import arguments_hash, idempotency_key, operation_ambiguous_announce
from tools.gate import REFUSE, Origin, gate, gate_satisfied
from tools.ledger import operation_record
from tools.models import ToolOperation
from tools.transitions import OPERATION

OS = ToolOperation.Status


def _external_run(run_id: int) -> Run:
    """Call inside transaction.atomic(): the run, locked, if it is an external one still going."""
    run = Run.objects.select_for_update().select_related("workflow").filter(id=run_id).first()
    if run is None:
        raise NotFound(f"run {run_id} does not exist")
    if run.workflow.planner != Workflow.Planner.EXTERNAL:
        raise Conflict(f"run {run_id} is run by Warden's own workers, not reported from outside")
    return run


def _external_operation(operation_id: int) -> ToolOperation:
    """Call inside transaction.atomic(): the operation, locked after its run (lock order: run, then
    operations), if its run is an external one. An agent reports only on its own run's calls."""
    run_id = ToolOperation.objects.filter(id=operation_id).values_list("run_id", flat=True).first()
    if run_id is None:
        raise NotFound(f"operation {operation_id} does not exist")
    _external_run(run_id)
    return ToolOperation.objects.select_for_update().get(id=operation_id)


def _running(run: Run) -> None:
    if run.status != Run.Status.RUNNING:
        why = f" ({run.status_reason[:300]})" if run.status_reason else ""
        raise Conflict(f"run {run.id} is {run.status}{why}: nothing more can be reported to it")


def external_task_open(*, run_id: int, key: str, agent: str, objective: str = "") -> Task:
    """A task of the external agent (idempotent: the same key returns the same task)."""
    with transaction.atomic():
        run = _external_run(run_id)
        task = Task.objects.filter(run=run, key=key).first()
        if task is not None:
            return task
        _running(run)
        slug = f"external-{slugify(agent)[:50]}" or "external-agent"
        agent_row, _ = Agent.objects.get_or_create(
            slug=slug, defaults={"name": agent[:200], "provider": Agent.Provider.EXTERNAL, "model": "external"}
        )
        now = timezone.now()
        task = Task.objects.create(
            run=run,
            key=key,
            agent=agent_row,
            objective=objective or key,
            status=Task.Status.RUNNING,
            attempts=1,
            started_at=now,
        )
        root = Span.objects.filter(run=run, kind=Span.Kind.RUN).values_list("id", flat=True).first()
        Span.objects.create(
            run=run, task=task, parent_id=root, kind=Span.Kind.TASK, name=f"task {key}", status=Span.Status.RUNNING,
            started_at=now, attempt=1, attributes={"agent": agent_row.slug, "external": True},
        )  # fmt: skip
        bus.run_changed(run.id)
        return task


def _task(run: Run, key: str) -> Task:
    task = Task.objects.filter(run=run, key=key).first()
    if task is None:
        raise NotFound(f"run {run.id} has no task {key}; open it first")
    return task


def budget_breach(run: Run, *, asking_to_call: bool = False) -> str:
    """The budget this external run is past, as the engine says it for its own runs; "" when none.
    ``asking_to_call``: the agent asks for one more call, which must fit too."""
    usage = Usage.of(run)
    try:
        if asking_to_call:
            usage.check_before_step("run", tool_call=True)
        usage.check_after_step("run")
    except BudgetExceeded as exc:
        return str(exc)
    if run.deadline is not None and timezone.now() > run.deadline:
        return f"run budget exceeded: deadline ({run.deadline:%Y-%m-%d %H:%M:%S} UTC passed)"
    return ""


def budget_stop(run: Run, why: str) -> None:
    """Past a budget: the run waits for a person (raise the budget and resume, or cancel). Run locked."""
    run_transition(run=run, to=Run.Status.NEEDS_ATTENTION, reason=why)


def external_span_report(
    *, run_id: int, task: str, kind: str, name: str, started_at, ended_at, status: str = "ok",
    tokens_in: int = 0, tokens_out: int = 0, cost_micros: int = 0, step: int | None = None,
) -> Span:  # fmt: skip
    """One model call or step of the agent, with its usage, under its task."""
    if kind not in (Span.Kind.MODEL_CALL, Span.Kind.TOOL_CALL, Span.Kind.PLAN):
        raise InvalidInput("a reported span is a model_call, tool_call or plan", [{"field": "kind", "message": kind}])
    if ended_at and ended_at < started_at:
        raise InvalidInput("a span ends after it starts", [{"field": "ended_at", "message": "before started_at"}])
    with transaction.atomic():
        run = _external_run(run_id)
        _running(run)
        owner = _task(run, task)
        parent = Span.objects.filter(task=owner, kind=Span.Kind.TASK).values_list("id", flat=True).first()
        span = Span.objects.create(
            run=run, task=owner, parent_id=parent, kind=kind, name=name[:200], status=status, step=None,
            started_at=started_at, ended_at=ended_at or started_at, tokens_in=tokens_in, tokens_out=tokens_out,
            cost_micros=cost_micros, attributes={"external": True, "reported_step": step},
        )  # fmt: skip
        usage = dict(
            steps=1, tokens=tokens_in + tokens_out, tool_calls=int(kind == Span.Kind.TOOL_CALL), cost=cost_micros
        )
        sql.add_usage("runs_task", owner.id, **usage)
        sql.add_usage("runs_run", run.id, **usage)
        run.refresh_from_db()
        why = budget_breach(run)
        if why:  # what happened is recorded; what comes next waits for a person
            budget_stop(run, why)
        bus.run_changed(run.id)
        return span


def _undo_plan(undo: dict | None, verdict) -> dict | None:
    """The agent's word for how its effect is undone, used if an operator compensates the run: unless the
    tool is reversible (by Warden's classification) it is a correction, which waits for a reviewer."""
    if not undo or verdict.tool_class == ToolOperation.ToolClass.READ_ONLY:
        return None
    kind = "compensation" if verdict.reversibility == "reversible" else "correction"
    return {"kind": kind, "by": "the agent", "tool": undo["tool"], "arguments": undo.get("arguments", {})}


def external_operation_intent(
    *,
    run_id: int,
    task: str,
    step: int,
    tool: str,
    arguments: dict,
    tool_class: str,
    reversibility: str = "",
    undo: dict | None = None,
) -> ToolOperation:
    """The intent row, before the agent calls its provider: the key to pass it, and whether a reviewer
    must approve first. The same step with the same arguments finds the same row; other arguments, 409.
    The gate judges the call; the class the agent claims for its tool can only make the verdict stricter
    (Warden's registry and the project's classification say what a tool does). A refused call: 403."""

    if tool_class not in ToolOperation.ToolClass.values:
        raise InvalidInput("unknown tool class", [{"field": "tool_class", "message": tool_class}])
    with transaction.atomic():
        run = _external_run(run_id)
        owner = _task(run, task)
        key = idempotency_key(run_id=run.id, task_key=owner.key, step=step, epoch=owner.journal_epoch)
        digest = arguments_hash(tool, arguments)
        existing = ToolOperation.objects.filter(idempotency_key=key).first()
        if existing is not None:
            if existing.arguments_hash != digest or existing.tool != tool:
                raise Conflict(f"step {step} of task {task} was already asked for with another call ({key})")
            return existing
        _running(run)
        why = budget_breach(run, asking_to_call=True)
        if why:
            budget_stop(run, why)
        else:
            call = {"tool": tool, "arguments": arguments, "tool_class": tool_class, "reversibility": reversibility}
            return _intent_record(run, owner, step=step, key=key, digest=digest, undo=undo, **call)
    raise BudgetRefused(f"{tool} may not be called: {why}; the run needs attention")  # the status is committed


def _intent_record(
    run: Run, owner: Task, *, step: int, key: str, digest: str, tool: str, arguments: dict, tool_class: str,
    reversibility: str, undo: dict | None,
) -> ToolOperation:  # fmt: skip
    """The gate's verdict on an external agent's call, and its intent row (and approval request)."""
    verdict = gate(
        run_id=run.id,
        facts=run_gate_facts(run.id, tool),
        tool=tool,
        arguments=arguments,
        origin=Origin.EXTERNAL,
        agent_id=owner.agent_id,
        claimed_class=tool_class,
        claimed_reversibility=reversibility,
    )
    if verdict.decision == REFUSE:
        raise Forbidden(f"{tool} may not be called: {'; '.join(verdict.reasons)}")
    op = operation_record(
        verdict=verdict,
        run_id=run.id,
        project_id=run.project_id,
        task=owner,
        step=step,
        call_number=step,
        tool=tool[:64],
        idempotency_key=key,
        arguments_hash=digest,
        arguments=arguments,
        status=OS.AWAITING_APPROVAL if verdict.waits else OS.EXECUTING,
        started_at=None if verdict.waits else timezone.now(),
        attempts=0 if verdict.waits else 1,
        compensation=_undo_plan(undo, verdict),
    )
    if verdict.waits:
        approval_request_for_operation(op, requested_by_id=run.started_by_id)
    op.created = True  # this request recorded it (the API says so: a rerun finds it there already)
    return op


def external_operation_started(*, operation_id: int) -> ToolOperation:
    """The agent is about to call its provider for an approved operation (its verdict re-checked now)."""

    with transaction.atomic():
        op = _external_operation(operation_id)
        if op.status == OS.EXECUTING or op.status in (OS.COMMITTED, OS.FAILED):
            return op  # already under way or done: the agent retried its own call
        if op.status != OS.APPROVED:
            raise Conflict(f"operation {operation_id} is {op.status}; only an approved one may be carried out")
        why = gate_satisfied(op)
        if why:
            raise Conflict(f"operation {operation_id} may not be carried out: {why}")
        OPERATION.move(op, OS.EXECUTING, started_at=timezone.now(), attempts=op.attempts + 1)
        bus.run_changed(op.run_id)
        return op


def external_operation_outcome(
    *, operation_id: int, committed: bool, result=None, external_id: str = "", error: str = "", ambiguous: bool = False
) -> ToolOperation:
    """The receipt (committed, with the provider's result) or the failure (or: the agent does not know)."""
    with transaction.atomic():
        op = _external_operation(operation_id)
        final = OS.COMMITTED if committed else OS.AMBIGUOUS if ambiguous else OS.FAILED
        if op.status == final:
            return op  # the same report again
        if op.status != OS.EXECUTING:
            raise Conflict(f"operation {operation_id} is {op.status}: start it (after its approval) before reporting")
        now = timezone.now()
        receipt = {"result": result, "external_id": external_id[:200], "committed_at": now} if committed else {}
        OPERATION.move(op, final, ended_at=now, status_reason=error[:4000], **receipt)
        bus.run_changed(op.run_id)
        if final == OS.AMBIGUOUS:
            operation_ambiguous_announce(op)
        op.refresh_from_db()
        if op.compensates_id:
            # The saga records the step and settles the run (saga/executor.py), in this transaction.
            failure = error or ("the agent cannot tell whether it happened" if ambiguous else "failed")
            hooks.call(hooks.COMPENSATION_STEP_REPORTED, op, failure=failure)
        return op


def external_run_finish(*, run_id: int, completed: bool, reason: str = "") -> Run:
    """The agent is done: its tasks end, the run completes (or needs a human, with the reason)."""
    with transaction.atomic():
        run = _external_run(run_id)
        _running(run)
        now = timezone.now()
        status = Task.Status.COMPLETED if completed else Task.Status.FAILED
        open_tasks = Task.objects.filter(run=run, status=Task.Status.RUNNING)
        Span.objects.filter(task__in=open_tasks, ended_at__isnull=True).update(
            ended_at=now, status=Span.Status.OK if completed else Span.Status.ERROR
        )
        TASK.move_where(open_tasks, status, sources=[Task.Status.RUNNING], finished_at=now, status_reason=reason[:4000])
        to = Run.Status.COMPLETED if completed else Run.Status.NEEDS_ATTENTION
        run_transition(run=run, to=to, reason=reason or ("completed by the agent" if completed else "failed"), now=now)
        return run
