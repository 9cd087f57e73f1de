"""The broker: the only path from a model's chosen tool call to an external system.

For every call, in this order: look the tool up, check the task's allowlist (trusted configuration),
validate the arguments, check the tool's rate limit and circuit breaker, classify, apply the run's
mode and the approval policy, derive the idempotency key from run, task and step (never the attempt),
commit the intent row, call with a deadline, commit the receipt, validate and sanitise the result.
A refused or invalid call returns a structured tool error to the model and calls nothing.

A call the system itself refuses (ToolRefused: an HTTP 4xx, an MCP error result, a Python tool's refusal)
changed nothing. As the tool's ``on_refusal`` says (by default: as the agent, ``model`` for a model-driven
one), it is either the model's answer, ``{"error": {"code", "message"}}``, recorded in the ledger as
``refused`` and journaled like any result, or the task's permanent failure (``fail``). Either way it says
nothing about the system's health: it never counts towards the tool's breaker.

Between the intent and the receipt the outcome is unknown to us. A retry that finds an intent without a
receipt reconciles first (the tool's lookup by key): committed → the stored answer; not committed → the
call is made again with the same key; no lookup → a human decides. Never a blind retry.
"""

import contextvars
import json
import logging
import re
import threading
from dataclasses import dataclass

from django.db import connections, transaction
from django.db.models import Q
from django.utils import timezone
from django.utils.crypto import salted_hmac
from pydantic import ValidationError

from core import bus, hooks, sql
from core.circuit import CLOSED, Breaker, BreakerRef, breaker_reason, rate_wait
from core.errors import LeaseLost, StepFailure, TransientFailure
from core.faults import faults
from core.logs import log_context
from policy.services import approval_request_for_operation

from .catalog import tool_spec
from .failures import ON_REFUSAL_FAIL, ON_REFUSAL_MODEL
from .gate import REFUSE, Origin, Verdict, gate, gate_satisfied
from .human import ASK
from .installation import run_key_prefix
from .kit import (
    ArgumentsInvalid,
    ToolCutOff,
    ToolFailure,
    ToolMisconfigured,
    ToolRefused,
    ToolTimeout,
    ToolUnavailable,
)
from .ledger import operation_record
from .models import SealedArguments, ToolOperation
from .registry import REDACTED, TOOLS, ToolClass, ToolSpec, redact
from .replaying import LIVE, NOT_RECORDED, ReplayAnswer, replay_answer
from .secrets import scrub, scrub_failure, secrets_for
from .transitions import OPERATION

log = logging.getLogger("warden.tools")
OS = ToolOperation.Status
RESULT_TEXT_LIMIT = 4000
_CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")


class TaskParked(Exception):
    """The call waits for a human decision (or a person's answer to human.ask); the task is parked until it
    arrives."""

    def __init__(self, operation_id: int, reason: str):
        super().__init__(reason)
        self.operation_id = operation_id


@dataclass
class ToolOutcome:
    result: dict | None = None
    error: dict | None = None  # {"code": ..., "message": ..., "fields": [...]}
    refused: bool = False  # the error is the system's refusal (counted by the task's bound on them)
    replay: dict | None = None  # a replay run's record of how the call was answered (tools/replaying.py)

    @property
    def body(self) -> dict:
        # "refused" and "replay" are the journal's (the loop's count, the replay's differences); the model
        # is shown the result or the error alone.
        body = {"result": self.result} if self.error is None else {"error": self.error}
        if self.error is not None and self.refused:
            body["refused"] = True
        if self.replay is not None:
            body["replay"] = self.replay
        return body


def _refuse(code: str, message: str, **extra) -> ToolOutcome:
    return ToolOutcome(error={"code": code, "message": message, **extra})


def idempotency_key(*, run_id: int, task_key: str, step: int, epoch: int = 0) -> str:
    """Derived from the installation, run, task and step, never from the attempt: a retry reuses it.
    ``epoch`` is the task's journal epoch: after a retry from an earlier step, the steps executed again
    get keys of their own."""
    key = f"{run_key_prefix(run_id)}{task_key}:{step}"
    return f"{key}:e{epoch}" if epoch else key


def arguments_hash(name: str, arguments: dict) -> str:
    # Keyed, so that the hash of a low-entropy secret argument cannot be guessed back.
    canonical = json.dumps([name, arguments], sort_keys=True, default=str)
    return salted_hmac("warden.tools.arguments", canonical, algorithm="sha256").hexdigest()


# --- secrets in the journal ------------------------------------------------------------------------


def tool_call_for_journal(*, task_id: int, step: int, tool_call: dict | None) -> dict | None:
    """The model's tool call as the journal may hold it: secret argument values are sealed apart
    (SealedArguments) and replaced by a marker. Returns the call to journal."""
    if not tool_call:
        return tool_call
    spec = TOOLS.get(str(tool_call.get("name")))
    arguments = tool_call.get("arguments")
    if spec is None or not spec.secret_fields or not isinstance(arguments, dict):
        return tool_call
    secrets = {k: arguments[k] for k in spec.secret_fields if arguments.get(k) is not None}
    if not secrets:
        return tool_call
    SealedArguments.objects.update_or_create(task_id=task_id, step=step, defaults={"values": secrets})
    return {**tool_call, "arguments": redact(spec, arguments)}


def arguments_unseal(spec: ToolSpec, task_id: int, step: int, arguments: dict) -> dict:
    if not spec.secret_fields or not any(arguments.get(k) == REDACTED for k in spec.secret_fields):
        return arguments
    sealed = SealedArguments.objects.filter(task_id=task_id, step=step).values_list("values", flat=True).first()
    if not sealed:  # never send the placeholder in place of a credential
        raise StepFailure(f"{spec.name}: the sealed secret arguments of step {step} are missing", "permanent")
    return {**arguments, **sealed}


# --- rate limit and circuit breaker (shared by all workers through the cache) ---------------------
# Per tool of a project for the tools a project declared (HTTP, MCP: spec.project_id), so that another
# project's tool of the same name never opens its breaker nor uses up its calls; one for the deployment
# for Warden's registry tools.


BREAKER = Breaker(what="tool", prefix="warden:circuit", failures_setting="TOOL_CIRCUIT_FAILURES",
                  open_setting="TOOL_CIRCUIT_OPEN_SECONDS")  # fmt: skip


def _breaker_of(spec: ToolSpec) -> BreakerRef:
    return BREAKER.ref(spec.name, spec.project_id)


def _circuit_record(spec: ToolSpec, *, ok: bool) -> None:
    BREAKER.record(spec.name, ok, project_id=spec.project_id)


def _parked(spec: ToolSpec, run, wait: float) -> StepFailure:
    """The failure that parks a task on the tool's open breaker (breaker_close finds it by its reason)."""
    project = run.project.slug if spec.project_id is not None else ""
    return StepFailure(breaker_reason(_breaker_of(spec), wait, project=project), "breaker")


def circuit_reset(tool: str | None = None) -> None:
    """A registry tool's breaker closed by hand; with no name, every tool breaker (tests)."""
    if tool:
        BREAKER.reset([tool])
    else:
        BREAKER.reset(TOOLS)
        BREAKER.reset_all()


def _rate_limited(spec: ToolSpec) -> float:
    """Seconds until the next call may go, or 0. A fixed one-minute window per breaker (tool of a project)."""
    return rate_wait(_breaker_of(spec).key, spec.rate_per_minute)


# --- the agent's path --------------------------------------------------------------------------------


def replay_outcome(answer: ReplayAnswer) -> ToolOutcome:
    """A replay's answer, as the task's journal takes it (tools/replaying.py)."""
    return ToolOutcome(result=answer.result, error=answer.error, replay=answer.record)


def _replay_call(run, task, spec: ToolSpec, args: dict, digest: str, *, key: str, fence) -> ToolOutcome:
    answer = replay_answer(run=run, task=task, spec=spec, args=args, digest=digest)
    if answer.record["answered"] == LIVE:
        return _replay_live_read(spec, args, answer.record, key=key, fence=fence)
    return replay_outcome(answer)


def _replay_live_read(spec: ToolSpec, args: dict, record: dict, *, key: str, fence) -> ToolOutcome:
    """A replay's read sent to the system (tools/replaying.py said it may be): within the tool's rate and
    deadline, with its project's secrets, scrubbed; but no ledger row, and its failure is the replay's
    alone: it neither opens nor closes the tool's breaker for the live runs, and an open breaker or a
    spent rate answers it "not sent" instead of waiting."""
    if BREAKER.state(spec.name, project_id=spec.project_id).state != CLOSED or _rate_limited(spec):
        error = {"code": "not_recorded", "message": f"{spec.name}: the system is busy; a replay does not wait"}
        return ToolOutcome(error=error, replay={**record, "answered": NOT_RECORDED})
    _fenced(fence)  # a replay's read leaves like any call: only while the attempt holds its lease
    try:
        result = _external(spec, args, key=key, fault=None, count=False)
    except (ToolTimeout, ToolUnavailable, ToolRefused) as exc:
        error = {"code": "unavailable" if not isinstance(exc, ToolRefused) else "refused", "message": str(exc)}
        return ToolOutcome(error=error, replay=record)
    outcome = _validated(spec, result)
    return ToolOutcome(result=outcome.result, error=outcome.error, replay=record)


def tool_call(*, run, task, step: int, call_number: int, name: str, arguments, resumed: bool = False, fence=None,
              on_refusal: str = ON_REFUSAL_FAIL) -> ToolOutcome:  # fmt: skip
    """One tool call asked for by a task's model. ``resumed``: the model asked for it in an earlier
    attempt (replayed from the journal); the ledger row of that attempt, if any, is found by key.
    ``fence``: the attempt's lease (a TaskFence), checked just before a write leaves. ``on_refusal``: what
    the system's refusal becomes for this agent (``model`` or ``fail``) when the tool does not say."""
    spec = tool_spec(name, run.project_id)
    if spec is None or spec.internal:
        return _refuse("unknown_tool", f"there is no tool named {name!r}", available=sorted(task.allowed_tools))
    if not isinstance(arguments, dict):
        return _refuse("invalid_arguments", f"the arguments of {name} must be an object")
    arguments = arguments_unseal(spec, task.id, step, arguments)
    try:
        args = spec.arguments_validated(arguments)
    except ArgumentsInvalid as exc:
        return _refuse("invalid_arguments", f"invalid arguments for {name}", fields=exc.fields)

    digest = arguments_hash(name, args)
    if run.mode != "live":  # a replay: answered from its original's ledger, never sent (a shadow may wait)
        return _replay_call(run, task, spec, args, digest, key=f"replay-{run.id}-{task.key}-{step}", fence=fence)
    key = idempotency_key(run_id=run.id, task_key=task.key, step=step, epoch=task.journal_epoch)
    to_model = (spec.on_refusal or on_refusal) == ON_REFUSAL_MODEL
    existing = ToolOperation.objects.filter(idempotency_key=key).first()
    if existing is not None:  # judged when its intent was written: its stored verdict stands
        if existing.arguments_hash != digest:
            if existing.original_hash != digest:
                raise StepFailure(f"{name}: idempotency key {key} was used before with other arguments", "permanent")
            # A reviewer approved edited arguments: those run, with the sealed secrets the agent gave.
            args = {**args, **{k: v for k, v in existing.arguments.items() if k not in spec.secret_fields}}
        with faults.around_call(run.input, run_id=run.id, task_key=task.key, call=call_number):
            return _resume_operation(existing, spec, args, fence=fence, to_model=to_model)

    repeats = None
    if task.journal_epoch and spec.is_write:  # retried from an earlier step, or forked: a receipt may answer
        earlier = earlier_receipt(task_id=task.id, step=step, digest=digest)
        if earlier is not None and not earlier.repeat_chosen:
            log.info("step %s of task %s answered by the receipt of operation %s", step, task.id, earlier.id)
            return _answer(earlier)
        repeats = earlier.id if earlier is not None else None
    propose = spec.is_write and name in (run.input or {}).get("propose_tools", [])
    verdict = gate(
        run_id=run.id,
        tool=name,
        arguments=args,
        origin=Origin.PROPOSAL if propose else Origin.AGENT,
        agent_id=task.agent_id,
        allowed_tools=task.allowed_tools,
        repeats=repeats,
    )
    stopped = _stopped(spec, run, task, verdict)
    if stopped is not None:
        return stopped

    call = _Call(run=run, task=task, step=step, call_number=call_number, spec=spec, args=args, key=key, digest=digest,
                 to_model=to_model)  # fmt: skip
    with faults.around_call(run.input, run_id=run.id, task_key=task.key, call=call_number):
        return _call_out_or_park(call, verdict, propose=propose, fence=fence)


def _stopped(spec: ToolSpec, run, task, verdict: Verdict) -> ToolOutcome | None:
    """What keeps a call the model asked for from going out: the gate's refusal or the rate limit (told
    to the model), or an open breaker (the task parks; half-open, one call goes as its probe)."""
    name = spec.name
    if verdict.decision == REFUSE:
        if name not in task.allowed_tools:
            message = f"tool {name!r} is not allowed for this task"
            return _refuse("not_allowed", message, available=sorted(task.allowed_tools))
        return _refuse("refused", f"{name} may not be called: {'; '.join(verdict.reasons)}")
    wait = BREAKER.admit(name, project_id=spec.project_id)
    if wait:
        # Not the model's problem to work around: the task parks, needing attention, until the breaker
        # closes: by a probe that succeeds (the sweeper makes one), or by a person (the inbox).
        raise _parked(spec, run, wait)
    wait = _rate_limited(spec)
    if wait:
        return _refuse("rate_limited", f"{name} is over its rate limit", retry_after=round(wait, 1))
    return None


def earlier_receipt(*, task_id: int, step: int, digest: str) -> ToolOperation | None:
    """The committed write this step of the task made before a retry from an earlier step (under an
    earlier epoch's key), or that a fork inherited for it: it answers the same call (same arguments, or
    those a reviewer's edit replaced) instead of a second effect. The latest one, if several."""
    same_call = Q(arguments_hash=digest) | Q(original_hash=digest)
    return (
        ToolOperation.objects.filter(same_call, task_id=task_id, step=step, kind=ToolOperation.Kind.ACTION)
        .filter(status=OS.COMMITTED)
        .exclude(tool_class=ToolClass.READ_ONLY)
        .order_by("-id")
        .first()
    )


def _answer(op: ToolOperation) -> ToolOutcome:
    """What a committed operation answers the step that asks for it again."""
    if op.result is None:  # an operator resolved it as committed: the system's answer was never seen
        return ToolOutcome(result={"status": "committed", "note": op.status_reason[:500]})
    return ToolOutcome(result=op.result)


def _call_out_or_park(call: "_Call", verdict: Verdict, *, propose: bool, fence) -> ToolOutcome:
    """_call_out. A transient failure that opened the tool's breaker, or was its failed probe, parks the
    task beside the others the breaker parked (they resume together) rather than spend its attempts
    against an open breaker."""
    try:
        return _call_out(call, verdict, propose=propose, fence=fence)
    except TransientFailure as exc:
        wait = BREAKER.open_for(call.spec.name, project_id=call.spec.project_id)
        if wait:
            raise _parked(call.spec, call.run, wait) from exc
        raise


def _call_out(call: "_Call", verdict: Verdict, *, propose: bool, fence) -> ToolOutcome:
    """A call the gate let through (or parked): a read goes out; a write's intent is written first."""
    spec, args, name = call.spec, call.args, call.spec.name
    if name == ASK:
        raise TaskParked(_ask(call, verdict), f"{ASK} waits for a person's answer")
    if not spec.is_write and not verdict.waits:
        return _read(call, verdict)
    status = OS.PROPOSED if propose else OS.AWAITING_APPROVAL if verdict.waits else OS.EXECUTING
    with transaction.atomic():
        op = _operation_create(
            call,
            verdict,
            proposed=propose,
            status=status,
            status_reason=f"allowed without review by allow rule {verdict.allow_rule}" if verdict.allow_rule else "",
            compensation=_undo_plan(spec),
            attempts=1 if status == OS.EXECUTING else 0,
            started_at=timezone.now() if status == OS.EXECUTING else None,
        )
        if status == OS.AWAITING_APPROVAL:
            starter = ToolOperation.objects.filter(id=op.id).values_list("run__started_by_id", flat=True).get()
            approval_request_for_operation(op, requested_by_id=starter)
    if status == OS.PROPOSED:
        return _proposed(op)
    if status == OS.AWAITING_APPROVAL:
        raise TaskParked(op.id, f"{name} waits for a reviewer's approval")
    faults.crash("after_intent")
    return _call_and_receipt(op, spec, args, fence=fence, to_model=call.to_model)


def _ask(call: "_Call", verdict: Verdict) -> int:
    """human.ask: the call goes to a person. Its intent and the question are written together; the receipt
    is the answer (or the question's expiry), recorded by the approvals app. A reviewer's approval is not
    asked for: a person answers it anyway. Returns the intent's id, for the task to park on."""
    with transaction.atomic():
        op = _operation_create(
            call,
            verdict,
            status=OS.EXECUTING,
            status_reason="waits for a person's answer",
            attempts=1,
            started_at=timezone.now(),
        )
        hooks.call(hooks.QUESTION_FOR_OPERATION, op, arguments=call.args)
    return op.id


def _asked(op: ToolOperation) -> ToolOutcome:
    """A human.ask call found by key: the answer, still waiting, or what its expiry's policy says."""
    if op.status == OS.EXECUTING:
        raise TaskParked(op.id, f"{ASK} waits for a person's answer")
    if op.status == OS.COMMITTED:
        return ToolOutcome(result=op.result)
    if op.status == OS.FAILED:  # the run's policy says an unanswered question fails the task
        raise StepFailure(f"{ASK}: {op.status_reason}", "policy")
    return _refuse("unanswered", op.status_reason or "nobody answered the question")


@dataclass(frozen=True)
class TaskFence:
    """An agent's attempt: it holds its task's lease while the task is running with its token."""

    task_id: int
    token: int

    def lost(self) -> bool:
        return not sql.fetchone(
            "SELECT EXISTS (SELECT 1 FROM runs_task WHERE id = %s AND fencing_token = %s AND status = 'running')",
            [self.task_id, self.token],
        )[0]

    def __str__(self) -> str:
        return f"task {self.task_id}: token {self.token}"


def _fenced(fence) -> None:
    """Just before a call leaves, the caller must still hold its lease (a TaskFence, or the supervisor's
    executor's lease on the run). One frozen after it wrote the intent may wake after another took over and
    reconciled or made the call; it must not make the call a second time (a system that does not dedupe
    by key would do it twice)."""
    if isinstance(fence, tuple):
        fence = TaskFence(*fence)
    if fence is not None and fence.lost():
        raise LeaseLost(f"{fence} no longer holds the lease; the call is not made")


@dataclass
class _Call:
    """One validated call of an agent's step: where it comes from, what it asks, under which key."""

    run: object
    task: object
    step: int
    call_number: int
    spec: ToolSpec
    args: dict
    key: str
    digest: str
    to_model: bool = False  # the system's refusal is the model's answer (on_refusal), not a failure


def _undo_plan(spec: ToolSpec) -> dict | None:
    """Recorded with the intent: what would undo (or correct) this effect, before it exists."""
    if spec.undo is None:
        return None
    kind = "compensation" if spec.reversibility == "reversible" else "correction"
    return {"kind": kind, "by": spec.undo.__name__.lstrip("_")}


def _proposed(op: ToolOperation) -> ToolOutcome:
    return ToolOutcome(
        result={
            "status": "proposed",
            "operation": op.id,
            "note": "proposed, not done: the supervisor executes proposals after the run's other work, once approved",
        }
    )


def _read(call: _Call, verdict: Verdict) -> ToolOutcome:
    """A read has no effect to protect: it is called, then recorded (one write, not two)."""
    spec = call.spec
    if spec.cacheable:
        cached = (
            ToolOperation.objects.filter(
                run_id=call.run.id, tool=spec.name, arguments_hash=call.digest, status=OS.COMMITTED
            )
            .values_list("id", "result")
            .first()
        )
        if cached is not None:
            _record_read(call, verdict, cached[1], f"cached from {cached[0]}")
            return ToolOutcome(result=cached[1])
    faults.crash("after_intent")  # a read has no intent row: this is just before the call
    try:
        result = _external(spec, call.args, key=call.key, fault=faults.system)
    except (ToolTimeout, ToolUnavailable) as exc:  # a read is safe to try again
        raise TransientFailure(f"{spec.name}: {exc}") from exc
    except ToolRefused as exc:
        if not _told(exc, call.to_model):
            raise StepFailure(f"{spec.name}: {exc}", "permanent") from exc
        error = _refusal(exc)
        now = timezone.now()
        _operation_create(call, verdict, status=OS.REFUSED, status_reason=error["message"][:1000],
                          result={"error": error}, attempts=1, started_at=now, ended_at=now)  # fmt: skip
        return ToolOutcome(error=error, refused=True)
    faults.crash("after_call")
    outcome = _validated(spec, result)
    _record_read(call, verdict, outcome.result, "")
    faults.crash("after_receipt")
    return outcome


def _record_read(call: _Call, verdict: Verdict, result, reason: str) -> None:
    now = timezone.now()
    _operation_create(
        call,
        verdict,
        status=OS.COMMITTED,
        status_reason=reason,
        result=result,
        attempts=0 if reason else 1,
        started_at=now,
        committed_at=now,
        ended_at=now,
    )


def _operation_create(call: _Call, verdict: Verdict, **fields) -> ToolOperation:
    """A ledger row for an agent's call, with its verdict; its arguments are stored redacted."""
    return operation_record(
        verdict=verdict,
        run_id=call.run.id,
        task_id=call.task.id,
        step=call.step,
        call_number=call.call_number,
        tool=call.spec.name,
        idempotency_key=call.key,
        arguments_hash=call.digest,
        arguments=redact(call.spec, call.args),
        declaration=call.spec.declaration,
        **fields,
    )


def _resume_operation(
    op: ToolOperation, spec: ToolSpec, args: dict, *, fence: tuple[int, int] | None, to_model: bool = False
) -> ToolOutcome:
    """The step's call has a ledger row already: a retry, a resumed attempt or a duplicate delivery."""
    if op.tool == ASK:
        return _asked(op)
    if op.status in (OS.COMMITTED, OS.COMPENSATING, OS.COMPENSATED, OS.COMPENSATION_FAILED):
        return _answer(op)
    if op.status == OS.REFUSED:  # the system's answer to this very call: told again, never asked again
        error = (op.result or {}).get("error") or {"code": ToolRefused.code, "message": op.status_reason}
        if not to_model:
            raise StepFailure(f"{op.tool}: {error['message']}", "permanent")
        return ToolOutcome(error=error, refused=True)
    if op.status == OS.PROPOSED or (op.proposed and op.status in (OS.AWAITING_APPROVAL, OS.APPROVED)):
        return _proposed(op)
    if op.status == OS.REJECTED:
        message = f"{op.tool} was not done: {op.status_reason or 'a reviewer rejected it'}"
        if Verdict.from_json(op.verdict).fail_on_reject:
            raise StepFailure(message, "policy")  # a policy that matched says a rejection fails the task
        return _refuse("rejected", message)
    if op.status == OS.AWAITING_APPROVAL:
        raise TaskParked(op.id, f"{op.tool} waits for a reviewer's approval")
    if op.status in (OS.EXECUTING, OS.AMBIGUOUS):
        found = reconcile(op, spec)
        if found is not None:
            return found
    return operation_execute(op, spec, args, fence=fence, to_model=to_model)


def approval_recheck(op: ToolOperation, spec: ToolSpec | None = None, args: dict | None = None) -> ToolOutcome | None:
    """Just before an operation's call: do the decisions recorded on it satisfy its verdict? One whose
    approval no longer stands (or never did) is rejected and not made. One whose tool's declaration
    changed since it was judged (another URL, method, header, server or class) is judged again, and waits
    for a new approval when the new verdict asks for one."""
    if spec is not None and spec.declaration != (op.declaration or ""):
        return _judged_again(op, spec, op.arguments if args is None else args)
    why = gate_satisfied(op)
    if not why:
        return None
    _set(op, OS.REJECTED, status_reason=f"not done: {why}"[:1000], ended_at=timezone.now())
    log.warning("operation %s not executed: %s", op.id, why)
    return _refuse("rejected", f"{op.tool} was not done: {why}")


_ORIGINS = {ToolOperation.Kind.COMPENSATION: Origin.COMPENSATION, ToolOperation.Kind.CORRECTION: Origin.CORRECTION}


def _judged_again(op: ToolOperation, spec: ToolSpec, args: dict) -> ToolOutcome | None:
    """The declaration changed under an operation: what was approved (or allowed) was another call. It
    gets the verdict of the tool as it is now; whatever approval it had no longer counts."""
    origin = _ORIGINS.get(op.kind) or (Origin.PROPOSAL if op.proposed else Origin.AGENT)
    agent_id = op.task.agent_id if op.task_id else None
    verdict = gate(run_id=op.run_id, tool=op.tool, arguments=args, origin=origin, agent_id=agent_id)
    why = "its tool's declaration changed since it was judged"
    if verdict.decision == REFUSE:
        _set(op, OS.REJECTED, status_reason=f"not done: {why}; now refused"[:1000], ended_at=timezone.now())
        return _refuse("rejected", f"{op.tool} was not done: {why}, and the gate now refuses it")
    fields = {"declaration": spec.declaration, "gate": verdict.decision, "verdict": verdict.to_json(),
              "tool_class": verdict.tool_class, "reversibility": verdict.reversibility}  # fmt: skip
    if not verdict.waits:
        ToolOperation.objects.filter(id=op.id).update(
            declaration=spec.declaration,
            gate=verdict.decision,
            verdict=fields["verdict"],
            tool_class=verdict.tool_class,
            reversibility=verdict.reversibility,
        )
        for name, value in fields.items():
            setattr(op, name, value)
        return None
    with transaction.atomic():
        OPERATION.move(op, OS.AWAITING_APPROVAL, status_reason=f"{why}: it waits for a new approval", **fields)
        starter = ToolOperation.objects.filter(id=op.id).values_list("run__started_by_id", flat=True).get()
        approval_request_for_operation(op, requested_by_id=starter)
    bus.run_changed(op.run_id)
    log.warning("operation %s: %s; it waits for a new approval", op.id, why)
    if op.kind == ToolOperation.Kind.ACTION and not op.proposed and op.task_id:
        raise TaskParked(op.id, f"{op.tool} waits for a new approval: {why}")
    return _refuse("awaiting_approval", f"{op.tool} waits for a new approval: {why}")


def reconcile(op: ToolOperation, spec: ToolSpec, *, in_flight: bool = False) -> ToolOutcome | None:
    """An intent without a receipt: ask the system by key. Committed → its answer (recorded as the
    receipt); not committed → None, and the caller may call again with the same key. ``in_flight``: the
    broker cut the call off, which may still land: "not found" is not "not done" for a system that does
    not deduplicate by key, so a person decides rather than a second call."""
    if spec.lookup is None or faults.no_lookup:
        _set(op, OS.AMBIGUOUS, status_reason="no receipt, and the tool has no status lookup: a human must check")
        raise StepFailure(
            f"{op.tool} ({op.idempotency_key}) may or may not have happened: a human must check", "ambiguous"
        )
    found = spec.lookup(op.idempotency_key)
    if found is None and in_flight and spec.tool_class == ToolClass.NON_IDEMPOTENT_WRITE:
        reason = "cut off at its deadline and not found yet; it may still land: a human must check"
        _set(op, OS.AMBIGUOUS, status_reason=reason)
        raise StepFailure(f"{op.tool} ({op.idempotency_key}) was {reason}", "ambiguous")
    if found is None:
        _set(op, OS.APPROVED, status_reason="reconciled: not committed; calling again with the same key")
        log.info("reconciled %s %s: not committed", op.tool, op.idempotency_key)
        return None
    log.info("reconciled %s %s: committed", op.tool, op.idempotency_key)
    return _receipt(op, spec, found, reason="reconciled: committed")


def operations_decided(*, approval_ids, approved: bool, reason: str, now) -> int:
    """The ledger side of a decision (approval, rejection, withdrawal, expiry): the operations waiting on
    these requests may go, or are recorded as not done. Call inside the deciding transaction."""
    return OPERATION.move_where(
        ToolOperation.objects.filter(approval_id__in=list(approval_ids)),
        OS.APPROVED if approved else OS.REJECTED,
        sources=[OS.AWAITING_APPROVAL],
        status_reason=reason[:1000],
        ended_at=None if approved else now,
    )


def operations_withdrawn(*, run_id: int, approval_ids, reason: str, now) -> None:
    """The ledger side of a run that moved on (cancelled, compensated): the calls its withdrawn requests
    were about, its proposals not bundled yet and its approved agent calls nobody has started will not be
    done. Run locked, in the transaction that withdrew the requests (policy/services.py)."""
    why = f"not done: {reason}"[:1000]
    operations_decided(approval_ids=approval_ids, approved=False, reason=why, now=now)
    OPERATION.move_where(
        ToolOperation.objects.filter(run_id=run_id, kind="action"),
        OS.REJECTED,
        sources=[OS.PROPOSED, OS.APPROVED],
        status_reason=why,
        ended_at=now,
    )


def _set(op: ToolOperation, to: str, **changes) -> None:
    if to == OS.AMBIGUOUS and op.status != OS.AMBIGUOUS:  # announced once, when it becomes ambiguous
        with transaction.atomic():  # the status and its webhook commit together, or neither does
            OPERATION.move(op, to, **changes)
            operation_ambiguous_announce(op)
    else:
        OPERATION.move(op, to, **changes)
    bus.run_changed(op.run_id)


def operation_ambiguous_announce(op: ToolOperation) -> None:
    """Announce that a write may or may not have happened (a person may have to look): the integrations
    write the project's webhooks in this transaction."""

    project_id = ToolOperation.objects.filter(id=op.id).values_list("run__project_id", flat=True).first()
    data = {
        "operation": op.id,
        "run": op.run_id,
        "tool": op.tool,
        "key": op.idempotency_key,
        "reason": op.status_reason,
    }
    bus.announce(bus.OperationAmbiguous(project_id=project_id, data=data))


def operation_execute(
    op: ToolOperation, spec: ToolSpec, args: dict, *, fence=None, to_model: bool = False
) -> ToolOutcome:
    """Make the call of an operation that may go (approved, or failed and being retried), if its verdict
    is satisfied and the caller still holds its lease (``fence``). ``to_model``: the system's refusal is
    the calling model's answer (an agent's on_refusal), not a failure."""
    refused = approval_recheck(op, spec, args)
    if refused is not None:
        return refused
    _fenced(fence)  # before the intent is marked again: a stale caller leaves the row as its successor found it
    now = timezone.now()
    # A compare-and-set on attempts: of two callers of the same intent, one makes the call.
    fields = {"attempts": op.attempts + 1, "started_at": now, "status_reason": ""}
    changed = OPERATION.move_where(ToolOperation.objects.filter(id=op.id, attempts=op.attempts), OS.EXECUTING, **fields)
    if not changed:
        raise TransientFailure(f"{op.tool} ({op.idempotency_key}) is being executed elsewhere")
    OPERATION.assign(op, OS.EXECUTING, **fields)
    faults.crash("after_intent")
    return _call_and_receipt(op, spec, args, fence=fence, to_model=to_model)


def _call_and_receipt(
    op: ToolOperation, spec: ToolSpec, args: dict, *, fence=None, to_model: bool = False
) -> ToolOutcome:
    """The one place an operation's call leaves: its verdict satisfied, for the declaration it was judged
    on, its caller's lease held."""
    why = gate_satisfied(op) or ("its tool's declaration changed" if spec.declaration != op.declaration else "")
    if why:  # never reached by a correct caller; the last line of defence of the promise
        _set(op, OS.REJECTED, status_reason=f"not done: {why}"[:1000], ended_at=timezone.now())
        return _refuse("rejected", f"{op.tool} was not done: {why}")
    _fenced(fence)
    try:
        with log_context(operation=op.id):
            result = _external(spec, args, key=op.idempotency_key, fault=faults.system)
    except (ToolTimeout, ToolUnavailable) as exc:
        if spec.is_write and isinstance(exc, ToolTimeout):
            return _timed_out(op, spec, exc)
        _set(op, OS.FAILED, status_reason=str(exc), ended_at=timezone.now())
        raise TransientFailure(f"{op.tool}: {exc}") from exc
    except ToolRefused as exc:
        if _told(exc, to_model):
            error = _refusal(exc)
            _set(op, OS.REFUSED, status_reason=error["message"][:1000], result={"error": error},
                 ended_at=timezone.now())  # fmt: skip
            return ToolOutcome(error=error, refused=True)
        _set(op, OS.FAILED, status_reason=str(exc), ended_at=timezone.now())
        raise StepFailure(f"{op.tool}: {exc}", "permanent") from exc
    faults.crash("after_call")
    outcome = _receipt(op, spec, result)
    faults.crash("after_receipt")
    return outcome


def _told(exc: ToolRefused, to_model: bool) -> bool:
    """Is this refusal the model's answer? Only the system's refusal of these arguments, and only when
    the tool (or the agent) says so: a call that cannot be made as the tool is set up fails the task."""
    return to_model and not isinstance(exc, ToolMisconfigured)


def _refusal(exc: ToolRefused) -> dict:
    """The refusal as the model reads it and the ledger keeps it. Its text was scrubbed of the tool's
    secrets when it was raised (``_external``), then bounded and stripped like any result."""
    return {"code": exc.code, "message": _sanitised(str(exc)) or "the system refused the request"}


def _timed_out(op: ToolOperation, spec: ToolSpec, exc: Exception) -> ToolOutcome:
    """A write that timed out may have happened: ask the system before anything else."""
    _set(op, OS.AMBIGUOUS, status_reason=str(exc))
    found = reconcile(op, spec, in_flight=isinstance(exc, ToolCutOff))
    if found is not None:
        return found
    raise TransientFailure(f"{op.tool} timed out and did not take effect; it will be tried again") from exc


def _within_deadline(spec: ToolSpec, call):
    """The call in a thread of its own; at the tool's deadline the broker stops waiting (ToolCutOff) and
    a late answer is dropped: the operation is then reconciled, never simply called again."""
    box: dict = {}
    done = threading.Event()
    context = contextvars.copy_context()

    def run():
        try:
            box["result"] = context.run(call)
        except BaseException as exc:  # handed to the caller's thread as it is
            box["error"] = exc
        finally:
            connections.close_all()  # this thread's own connections, if the tool opened any
            done.set()

    threading.Thread(target=run, name=f"tool {spec.name}", daemon=True).start()
    if not done.wait(spec.timeout_seconds):
        raise ToolCutOff(f"{spec.name} did not answer within {spec.timeout_seconds:g}s: cut off")
    if "error" in box:
        raise box["error"]
    return box["result"]


def _external(spec: ToolSpec, args: dict, *, key: str, fault: str | None, count: bool = True) -> dict:
    """The call itself, with the tool's deadline; feeds the circuit breaker (unless ``count`` is False: a
    replay's read, which must not change what live runs meet)."""
    # By name, now, and only those granted to the tool's project: never from the model, never recorded.
    # A refused one refuses the call without counting against the tool's circuit (the system was not asked).
    secrets = secrets_for(spec.secrets, project_id=spec.project_id)
    try:

        def call():
            logged = redact(spec, args)
            return spec.execute(
                args, key=key, logged=logged, fault=fault, deadline=spec.timeout_seconds, secrets=secrets
            )

        result = _within_deadline(spec, call) if spec.cut_off else call()
    except ToolRefused as exc:
        # An answer to these arguments (or to the tool's setup), not a sign of the system's health: it
        # neither opens the breaker nor closes it, and a probe it was gives its turn back.
        if count:
            BREAKER.probe_release(spec.name, project_id=spec.project_id)
        raise scrub_failure(exc, secrets.values())
    except ToolFailure as exc:  # unavailable, timed out: these count
        if count:
            _circuit_record(spec, ok=False)
        raise scrub_failure(exc, secrets.values())  # a careless service may quote the credential in its error
    except Exception as exc:  # a tool's own bug: its text may quote the credential too
        raise scrub_failure(exc, secrets.values())
    if count:
        _circuit_record(spec, ok=True)
    # Whatever shape a system echoes its credential in (a key, base64, ...): not in the ledger, the
    # journal or the prompt.
    return scrub(result, secrets.values())


def _receipt(op: ToolOperation, spec: ToolSpec, result: dict, reason: str = "") -> ToolOutcome:
    outcome = _validated(spec, result)
    now = timezone.now()
    external_id = ""
    if spec.external_id and isinstance(outcome.result, dict):
        external_id = str(outcome.result.get(spec.external_id) or "")[:200]
    plan = op.compensation
    if outcome.error is None and plan is not None and spec.undo is not None:
        tool, undo_args = spec.undo(op.arguments, outcome.result)
        plan = {**plan, "tool": tool, "arguments": undo_args}  # the concrete undo, now that it is known
    # One write: the receipt and the concrete undo land together.
    _set(
        op,
        OS.COMMITTED,
        status_reason=(reason or op.status_reason)
        if outcome.error is None
        else f"{reason} {outcome.error['message']}".strip(),
        result=outcome.result if outcome.error is None else {"invalid": True},
        external_id=external_id,
        compensation=plan,
        committed_at=now,
        ended_at=now,
    )
    return outcome


def _validated(spec: ToolSpec, result) -> ToolOutcome:
    """The result as the model may see it: checked against the tool's result model, extra keys dropped,
    text bounded and stripped of control characters. An invalid result is an error, not data."""
    try:
        clean = spec.result.model_validate(result).model_dump()
    except ValidationError as exc:
        return _refuse(
            "invalid_result",
            f"{spec.name} returned a result that does not match its schema: {exc.error_count()} errors",
        )
    return ToolOutcome(result=_sanitised(clean))


def _sanitised(value):
    if isinstance(value, str):
        return _CONTROL.sub("", value)[:RESULT_TEXT_LIMIT]
    if isinstance(value, dict):
        return {str(k)[:200]: _sanitised(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_sanitised(v) for v in value[:200]]
    return value
