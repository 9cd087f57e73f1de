"""Executing one task: reserve an attempt, run the agent loop over the step journal, finish.

Every write of an attempt is a compare-and-set on the task's fencing token, so a worker whose lease
was taken over can change nothing: what it brings back is quarantined. Lock order is always run row,
then task rows, so concurrent completions, claims and steps of one run never deadlock.
"""

import functools
import json
import logging
import os
import random
import socket
import threading
import time
from dataclasses import dataclass, field

import jsonschema
from django.conf import settings
from django.db import connection, transaction
from django.db.models import F
from django.utils import timezone
from dramatiq.middleware import TimeLimitExceeded

from agents.gateway import ModelRequest, ModelResponse, model_complete
from agents.prompts import build_prompt

from ..errors import BudgetExceeded, LeaseLost, StepFailure, TransientFailure
from ..faults import crash_now, fault_fire_once, faults_at
from ..heartbeat import lease_keeper
from ..models import Artifact, Payload, QuarantinedResult, Run, Span, Task
from ..transitions import check_task_transition
from .outbox import outbox_add
from .runs import EXECUTE, run_finish_cancel_if_idle, run_transition, task_set_ready

log = logging.getLogger("warden.engine")
INLINE_BODY_LIMIT = 16_000  # bytes of JSON kept in the span row; larger bodies go to Payload
CRASH = "crash"


def worker_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{threading.get_ident()}"


@dataclass
class Lease:
    task_id: int
    run_id: int
    token: int
    attempt: int
    span_id: int
    owner: str
    task_span_id: int | None = None
    fresh: bool = False  # a first attempt: nothing journaled yet
    claimed_at: float = field(default_factory=time.monotonic)


@dataclass
class Usage:
    """A run's or task's usage and limits, as the last write returned them."""

    status: str = ""
    steps: int = 0
    tokens: int = 0
    tool_calls: int = 0
    cost_micros: int = 0
    max_steps: int | None = None
    max_tokens: int | None = None
    max_tool_calls: int | None = None
    max_cost_micros: int | None = None

    @classmethod
    def of(cls, obj) -> "Usage":
        return cls(
            getattr(obj, "status", ""), obj.steps_used, obj.tokens_used, obj.tool_calls_used, obj.cost_micros,
            obj.max_steps, obj.max_tokens, obj.max_tool_calls, obj.max_cost_micros,
        )

    def check_before_step(self, scope: str, *, tool_call: bool = False) -> None:
        if self.max_steps is not None and self.steps >= self.max_steps:
            raise BudgetExceeded("steps", self.steps, self.max_steps, scope)
        if tool_call and self.max_tool_calls is not None and self.tool_calls >= self.max_tool_calls:
            raise BudgetExceeded("tool_calls", self.tool_calls, self.max_tool_calls, scope)

    def check_after_step(self, scope: str) -> None:
        if self.max_tokens is not None and self.tokens > self.max_tokens:
            raise BudgetExceeded("tokens", self.tokens, self.max_tokens, scope)
        if self.max_cost_micros is not None and self.cost_micros > self.max_cost_micros:
            raise BudgetExceeded(
                "cost_usd", f"{self.cost_micros / 1e6:.6f}", f"{self.max_cost_micros / 1e6:.6f}", scope
            )
        if self.max_steps is not None and self.steps > self.max_steps:
            raise BudgetExceeded("steps", self.steps, self.max_steps, scope)
        if self.max_tool_calls is not None and self.tool_calls > self.max_tool_calls:
            raise BudgetExceeded("tool_calls", self.tool_calls, self.max_tool_calls, scope)


_USAGE_COLUMNS = "status, steps_used, tokens_used, tool_calls_used, cost_micros, max_steps, max_tokens, max_tool_calls, max_cost_micros"


def _add_usage(table: str, row_id: int, *, steps: int, tokens: int, tool_calls: int, cost: int,
               extra_set: str = "", extra_set_params=(), extra_where: str = "", extra_params=()) -> Usage | None:
    """Add usage to a run or task row and return its new totals (UPDATE … RETURNING, one round trip)."""
    with connection.cursor() as cursor:
        cursor.execute(
            f"UPDATE {table} SET steps_used = steps_used + %s, tokens_used = tokens_used + %s, "
            f"tool_calls_used = tool_calls_used + %s, cost_micros = cost_micros + %s {extra_set} "
            f"WHERE id = %s {extra_where} RETURNING {_USAGE_COLUMNS}",
            [steps, tokens, tool_calls, cost, *extra_set_params, row_id, *extra_params],
        )
        row = cursor.fetchone()
    return None if row is None else Usage(*row)


def _lease_expiry(now):
    return now + timezone.timedelta(seconds=settings.WARDEN["LEASE_SECONDS"])


def _body_fields(body) -> dict:
    text = json.dumps(body, default=str)
    if len(text) <= INLINE_BODY_LIMIT:
        return {"body": body}
    return {"body": None, "payload": Payload.objects.create(body=body, size=len(text))}


# --- Claiming -------------------------------------------------------------------------------------


def _claim(task: Task, *, owner: str, now) -> Lease | None:
    """Move a claimable task to running under a new fencing token. Call with the run row locked."""
    continuing = task.continuing
    attempt = task.attempts if continuing else task.attempts + 1
    token = task.fencing_token + 1
    claimed = Task.objects.filter(id=task.id, fencing_token=task.fencing_token, status=task.status).update(
        status=Task.Status.RUNNING, attempts=attempt, fencing_token=token, lease_owner=owner,
        lease_expires_at=_lease_expiry(now), heartbeat_at=now, continuing=False,
        started_at=task.started_at or now, not_before=None,
    )
    if claimed != 1:
        return None
    fresh = attempt == 1 and not continuing
    if fresh:
        task_span_id = Span.objects.create(
            run_id=task.run_id, task_id=task.id, kind=Span.Kind.TASK, name=f"task {task.key}",
            status=Span.Status.RUNNING, started_at=now, attributes={"agent": task.agent_id},
        ).id
    else:
        task_span_id = Span.objects.filter(task_id=task.id, kind=Span.Kind.TASK).values_list("id", flat=True).first()
    if continuing:
        span_id = (
            Span.objects.filter(task_id=task.id, kind=Span.Kind.ATTEMPT, attempt=attempt)
            .values_list("id", flat=True).last()
        )
    else:
        span_id = Span.objects.create(
            run_id=task.run_id, task_id=task.id, parent_id=task_span_id, kind=Span.Kind.ATTEMPT,
            name=f"attempt {attempt}", status=Span.Status.RUNNING, attempt=attempt, fencing_token=token,
            started_at=now, attributes={"worker": owner},
        ).id
    return Lease(task_id=task.id, run_id=task.run_id, token=token, attempt=attempt, span_id=span_id, owner=owner,
                 task_span_id=task_span_id, fresh=fresh)


def _start_crash_due(run: Run, task: Task) -> bool:
    return CRASH in faults_at(run.input, task.key, at="start") and fault_fire_once(
        run_id=run.id, task_key=task.key, point="start", mode=CRASH
    )


def _claimable(task: Task, now) -> bool:
    if task.status == Task.Status.READY:
        return True
    if task.status == Task.Status.RETRY_WAIT:
        return task.not_before is None or task.not_before <= now
    if task.status == Task.Status.RUNNING:
        return task.lease_expires_at is not None and task.lease_expires_at < now
    return False


def task_reserve(*, run_id: int, task_id: int, owner: str):
    """Reserve an attempt: lease, fencing token, attempt number and budget check, in one transaction.

    Returns a Lease, None when there is nothing to do (a duplicate or stale message), or CRASH when a
    drill fault says this worker dies before starting the task.
    """
    now = timezone.now()
    with transaction.atomic():
        run = Run.objects.select_for_update(of=("self",)).select_related("workflow").filter(id=run_id).first()
        task = Task.objects.select_for_update().filter(id=task_id, run_id=run_id).first()
        if run is None or task is None or not _claimable(task, now):
            return None
        if run.status != Run.Status.RUNNING:
            return None  # paused or finishing: resume re-drives, cancel's reaper finishes it
        problem = _run_precondition(run, now)
        if problem:
            run_transition(run=run, to=Run.Status.NEEDS_ATTENTION, reason=problem, now=now)
            return None
        try:
            Usage.of(run).check_before_step("run")
        except BudgetExceeded as exc:
            _fail_task(task=task, run=run, failure_class=exc.failure_class, reason=str(exc), now=now)
            return None
        running = Task.objects.filter(run=run, status=Task.Status.RUNNING).exclude(id=task.id).count()
        if running >= (run.workflow.max_concurrent_tasks or settings.WARDEN["MAX_CONCURRENT_TASKS_PER_RUN"]):
            # Held back: a finishing sibling (or the sweeper) sends it again.
            Task.objects.filter(id=task.id, status=Task.Status.READY).update(ready_at=now)
            return None
        if task.status == Task.Status.RUNNING:
            _record_lease_expiry(task=task, now=now)
        if not task.continuing and task.attempts >= task.max_attempts + task.recoveries:
            _fail_task(task=task, run=run, failure_class=task.failure_class or "permanent",
                       reason=f"no attempts left ({task.attempts} made)", now=now)
            return None
        if _start_crash_due(run, task):
            return CRASH
        return _claim(task, owner=owner, now=now)


def _run_precondition(run: Run, now) -> str:
    current = settings.WARDEN["CODE_VERSION"]
    if run.code_version != current:
        return f"code version changed from {run.code_version} to {current}; resume to continue under it"
    if run.deadline is not None and run.deadline < now:
        return "run budget exceeded: deadline"
    return ""


def _record_lease_expiry(*, task: Task, now) -> None:
    task.recoveries += 1
    Task.objects.filter(id=task.id).update(recoveries=F("recoveries") + 1)
    Span.objects.filter(task=task, kind=Span.Kind.ATTEMPT, ended_at__isnull=True).update(
        ended_at=now, status=Span.Status.ERROR
    )
    Span.objects.create(
        run_id=task.run_id, task=task, kind=Span.Kind.RECOVERY, name=f"lease expired: {task.key}",
        started_at=now, ended_at=now,
        attributes={"previous_owner": task.lease_owner, "fencing_token": task.fencing_token, "attempt": task.attempts},
    )


# --- Executing --------------------------------------------------------------------------------------


def task_execute(*, run_id: int, task_id: int, owner: str | None = None) -> None:
    """The actor's body: run this task, then keep going with a successor it claimed directly."""
    owner = owner or worker_id()
    lease = task_reserve(run_id=run_id, task_id=task_id, owner=owner)
    if lease == CRASH:
        crash_now()
    while isinstance(lease, Lease):
        current = lease
        lease_keeper.hold(current.task_id, current.token)
        try:
            lease = _attempt(current)
        except LeaseLost:
            lease = None
        finally:
            lease_keeper.release(current.task_id)
        if lease == CRASH:
            crash_now()


@dataclass
class _LoopState:
    journal: list[dict]
    pending_tool: dict | None = None  # the last model response asked for this tool, not yet called
    model_turns: int = 0
    tool_calls: int = 0
    tool_hashes: dict = field(default_factory=dict)
    last_result: dict | None = None

    @classmethod
    def replay(cls, journal: list[dict]) -> "_LoopState":
        state = cls(journal=journal)
        for entry in journal:
            state.apply(entry)
        return state

    def apply(self, entry: dict) -> None:
        if entry["kind"] == Span.Kind.MODEL_CALL:
            self.model_turns += 1
            self.pending_tool = (entry["body"] or {}).get("tool_call")
            if self.pending_tool:
                digest = json.dumps(
                    [self.pending_tool.get("name"), self.pending_tool.get("arguments")], sort_keys=True, default=str
                )
                self.tool_hashes[digest] = self.tool_hashes.get(digest, 0) + 1
        else:
            self.tool_calls += 1
            self.pending_tool = None
            self.last_result = (entry["body"] or {}).get("result")

    @property
    def next_step(self) -> int:
        return len(self.journal) + 1


def _load_journal(task_id: int) -> list[dict]:
    rows = Span.objects.filter(task_id=task_id, step__isnull=False).order_by("step")
    return [
        {"step": s.step, "kind": s.kind, "name": s.name, "body": s.body if s.payload_id is None else s.payload.body}
        for s in rows.select_related("payload")
    ]


def _attempt(lease: Lease):
    task = Task.objects.select_related("agent", "run", "run__workflow").get(id=lease.task_id)
    run, agent = task.run, task.agent
    state = _LoopState.replay([] if lease.fresh else _load_journal(task.id))
    deps = {
        a.task.key: a.content
        for a in Artifact.objects.filter(run=run, task__key__in=task.depends_on).select_related("task")
    }
    run_usage, task_usage = Usage.of(run), Usage.of(task)
    slice_ends = lease.claimed_at + settings.WARDEN["SLICE_SECONDS"]
    try:
        while True:
            if state.pending_tool is not None:
                run_usage.check_before_step("run", tool_call=True)
                task_usage.check_before_step("task", tool_call=True)
                run_usage, task_usage = _tool_step(lease, run, task, state)
            else:
                if time.monotonic() > slice_ends:
                    return _yield(lease)
                run_usage.check_before_step("run")
                task_usage.check_before_step("task")
                request = ModelRequest(
                    agent_slug=agent.slug, instructions=agent.instructions, turn=state.model_turns + 1,
                    attempt=lease.attempt,
                    prompt=build_prompt(objective=task.objective, output_schema=task.output_schema,
                                        dependencies=deps, journal=state.journal),
                    context={"deps": deps, "last": state.last_result or {}, "input": run.input, "task": task.key},
                )
                started = timezone.now()
                try:
                    response = model_complete(provider=agent.provider, script=agent.script, model=agent.model, request=request)
                except StepFailure as exc:
                    _error_span(lease, task, kind=Span.Kind.MODEL_CALL, name=agent.model, started=started, message=str(exc))
                    raise
                if response.final is not None:
                    return _finish(lease, run, task, state, response, started)
                run_usage, task_usage = _journal(
                    lease, task, step=state.next_step, kind=Span.Kind.MODEL_CALL, name=agent.model,
                    body=response.as_journal(), started=started, response=response, state=state,
                )
                if response.tool_call:
                    _loop_guard(state, response.tool_call)
            if run_usage.status == Run.Status.CANCELLING:
                return _stop_cancelled(lease)
            run_usage.check_after_step("run")
            task_usage.check_after_step("task")
    except StepFailure as exc:
        return _fail_or_retry(lease, exc)
    except TimeLimitExceeded:
        return _fail_or_retry(lease, TransientFailure("the attempt ran past the worker's time limit"))


def _loop_guard(state: _LoopState, tool_call: dict) -> None:
    """Stop a task that keeps making the same tool call with the same arguments."""
    digest = json.dumps([tool_call.get("name"), tool_call.get("arguments")], sort_keys=True, default=str)
    limit = settings.WARDEN["LOOP_GUARD_REPEATS"]
    if state.tool_hashes[digest] >= limit:
        raise StepFailure(f"loop guard: {tool_call.get('name')} called {limit} times with the same arguments", "loop")


def _tool_step(lease: Lease, run: Run, task: Task, state: _LoopState):
    from tools.broker import tool_call  # the tools app builds on the engine, not the other way round

    call = state.pending_tool
    started = timezone.now()
    try:
        outcome = tool_call(
            run=run, task=task, step=state.next_step, call_number=state.tool_calls + 1,
            name=str(call.get("name")), arguments=call.get("arguments") or {},
        )
    except StepFailure as exc:
        _error_span(lease, task, kind=Span.Kind.TOOL_CALL, name=str(call.get("name")), started=started, message=str(exc))
        raise
    return _journal(
        lease, task, step=state.next_step, kind=Span.Kind.TOOL_CALL, name=str(call.get("name")),
        body=outcome.body, started=started, state=state, tool_call=True,
    )


_PG_JOURNAL_STEP = f"""
WITH t AS (
    UPDATE runs_task SET steps_used = steps_used + 1, tokens_used = tokens_used + %(tokens)s,
        tool_calls_used = tool_calls_used + %(tool_calls)s, cost_micros = cost_micros + %(cost)s,
        heartbeat_at = %(now)s
    WHERE id = %(task)s AND fencing_token = %(token)s AND status = 'running'
    RETURNING {_USAGE_COLUMNS}
), r AS (
    UPDATE runs_run SET steps_used = steps_used + 1, tokens_used = tokens_used + %(tokens)s,
        tool_calls_used = tool_calls_used + %(tool_calls)s, cost_micros = cost_micros + %(cost)s
    WHERE id = %(run)s AND EXISTS (SELECT 1 FROM t)
    RETURNING {_USAGE_COLUMNS}
), s AS (
    INSERT INTO runs_span (run_id, task_id, parent_id, kind, name, status, attempt, step, fencing_token,
        started_at, ended_at, tokens_in, tokens_out, cost_micros, attributes, body, payload_id)
    SELECT %(run)s, %(task)s, %(parent)s, %(kind)s, %(name)s, 'ok', %(attempt)s, %(step)s, %(token)s,
        %(started)s, %(now)s, %(tokens_in)s, %(tokens_out)s, %(cost)s, '{{}}'::jsonb, %(body)s::jsonb, NULL
    WHERE EXISTS (SELECT 1 FROM t)
    RETURNING id
)
SELECT r.*, t.* FROM r, t
"""


def _journal(lease: Lease, task: Task, *, step: int, kind: str, name: str, body, started, state: _LoopState,
             response: ModelResponse | None = None, tool_call: bool = False) -> tuple[Usage, Usage]:
    """Journal one step and count it on the task and the run, atomically, as a compare-and-set on the
    lease. On PostgreSQL this is one statement (one round trip, one commit); elsewhere one transaction."""
    now = timezone.now()
    params = {
        "run": lease.run_id, "task": lease.task_id, "token": lease.token, "parent": lease.span_id,
        "attempt": lease.attempt, "step": step, "kind": kind, "name": name, "started": started, "now": now,
        "tool_calls": int(tool_call),
        "tokens": (response.tokens_in + response.tokens_out) if response else 0,
        "tokens_in": response.tokens_in if response else 0, "tokens_out": response.tokens_out if response else 0,
        "cost": response.cost_micros if response else 0,
    }
    body_json = json.dumps(body, default=str)
    try:
        if connection.vendor == "postgresql" and len(body_json) <= INLINE_BODY_LIMIT:
            with connection.cursor() as cursor:
                cursor.execute(_PG_JOURNAL_STEP, {**params, "body": body_json})
                row = cursor.fetchone()
            if row is None:
                raise LeaseLost(f"task {lease.task_id}: token {lease.token} no longer holds the lease")
            width = len(Usage.__dataclass_fields__)
            run_usage, task_usage = Usage(*row[:width]), Usage(*row[width:])
        else:
            run_usage, task_usage = _journal_generic(params, body)
    except LeaseLost:
        _quarantine(lease, task, step=step, body=body)
        raise
    entry = {"step": step, "kind": kind, "name": name, "body": body}
    state.journal.append(entry)
    state.apply(entry)
    return run_usage, task_usage


def _journal_generic(p: dict, body) -> tuple[Usage, Usage]:
    with transaction.atomic():
        task_usage = _add_usage(
            "runs_task", p["task"], steps=1, tokens=p["tokens"], tool_calls=p["tool_calls"], cost=p["cost"],
            extra_set=", heartbeat_at = %s", extra_set_params=(p["now"],),
            extra_where="AND fencing_token = %s AND status = %s", extra_params=(p["token"], Task.Status.RUNNING),
        )
        if task_usage is None:
            raise LeaseLost(f"task {p['task']}: token {p['token']} no longer holds the lease")
        run_usage = _add_usage("runs_run", p["run"], steps=1, tokens=p["tokens"], tool_calls=p["tool_calls"], cost=p["cost"])
        Span.objects.create(
            run_id=p["run"], task_id=p["task"], parent_id=p["parent"], kind=p["kind"], name=p["name"],
            attempt=p["attempt"], step=p["step"], fencing_token=p["token"], started_at=p["started"],
            ended_at=p["now"], tokens_in=p["tokens_in"], tokens_out=p["tokens_out"], cost_micros=p["cost"],
            **_body_fields(body),
        )
    return run_usage, task_usage


def _quarantine(lease: Lease, task: Task, *, step: int | None, body) -> None:
    current = Task.objects.select_related("run").get(id=lease.task_id)
    if current.run.status in (Run.Status.CANCELLING, Run.Status.CANCELLED):
        reason = QuarantinedResult.Reason.RUN_CANCELLED
    elif current.plan_version != current.run.plan_version:
        reason = QuarantinedResult.Reason.PLAN_SUPERSEDED
    else:
        reason = QuarantinedResult.Reason.LEASE_LOST
    QuarantinedResult.objects.create(
        run_id=lease.run_id, task_id=lease.task_id, reason=reason, fencing_token=lease.token,
        plan_version=task.plan_version, step=step, body=body, worker=lease.owner,
    )
    log.warning("quarantined step %s of task %s (token %s): %s", step, lease.task_id, lease.token, reason)


def _error_span(lease: Lease, task: Task, *, kind: str, name: str, started, message: str) -> None:
    Span.objects.create(
        run_id=lease.run_id, task_id=lease.task_id, parent_id=lease.span_id, kind=kind, name=name,
        status=Span.Status.ERROR, attempt=lease.attempt, fencing_token=lease.token, started_at=started,
        ended_at=timezone.now(), attributes={"error": message[:2000]},
    )


def _lock_own_task(lease: Lease):
    """Lock the run, then check this lease still holds the task. Call inside transaction.atomic()."""
    run = Run.objects.select_for_update().get(id=lease.run_id)
    task = Task.objects.select_for_update().get(id=lease.task_id)
    if task.fencing_token != lease.token or task.status != Task.Status.RUNNING:
        raise LeaseLost(f"task {lease.task_id}: token {lease.token} no longer holds the lease")
    return run, task


def _close_spans(lease: Lease, *, now, ok: bool, final: bool, reason: str = "") -> None:
    """End the attempt's span (and, when the task is done, the task's span)."""
    status = Span.Status.OK if ok else Span.Status.ERROR
    attrs = {} if ok else {"error": reason[:2000]}
    ids = [lease.span_id, lease.task_span_id] if final else [lease.span_id]
    Span.objects.filter(id__in=[i for i in ids if i]).update(ended_at=now, status=status, attributes=attrs)


@functools.lru_cache(maxsize=256)
def _validator(schema_json: str):
    schema = json.loads(schema_json)
    validator_class = jsonschema.validators.validator_for(schema)
    validator_class.check_schema(schema)
    return validator_class(schema)


def _finish(lease: Lease, run: Run, task: Task, state: _LoopState, response: ModelResponse, started):
    """Journal the final answer, validate it, store the artifact and advance the DAG, in one transaction.
    Returns the Lease of a successor this worker claimed for itself, if any."""
    output = response.final
    try:
        _validator(json.dumps(task.output_schema or {}, sort_keys=True)).validate(output)
    except jsonschema.ValidationError as exc:
        _journal(lease, task, step=state.next_step, kind=Span.Kind.MODEL_CALL, name=response.model,
                 body=response.as_journal(), started=started, response=response, state=state)
        raise StepFailure(f"output does not match the schema: {exc.message} at {list(exc.absolute_path)}", "validation")
    planned = None
    if task.agent.is_planner:
        from agents.planning import plan_validate

        from ..errors import InvalidInput

        try:
            planned = plan_validate(
                output, max_tasks=run.workflow.max_tasks or settings.WARDEN["MAX_TASKS_PER_RUN"],
                existing_keys=frozenset(run.tasks.values_list("key", flat=True)),
            )
        except InvalidInput as exc:
            details = "; ".join(f"{e['field']}: {e['message']}" for e in exc.errors)
            raise StepFailure(f"invalid plan: {exc}{' (' + details + ')' if details else ''}", "validation") from exc
        if task.depth + 1 > settings.WARDEN["MAX_PLANNING_DEPTH"]:
            raise StepFailure(f"planning depth {task.depth + 1} is over the cap", "policy")

    now = timezone.now()
    tokens, cost = response.tokens_in + response.tokens_out, response.cost_micros
    step = state.next_step
    body = response.as_journal()
    try:
        with transaction.atomic():
            # The usage update takes the run's row lock first (lock order: run, then tasks).
            with connection.cursor() as cursor:
                cursor.execute(
                    f"UPDATE runs_run SET steps_used = steps_used + 1, tokens_used = tokens_used + %s, "
                    f"cost_micros = cost_micros + %s WHERE id = %s RETURNING {_USAGE_COLUMNS}, plan_version",
                    [tokens, cost, run.id],
                )
                *usage, plan_version = cursor.fetchone()
            run_usage = Usage(*usage)
            if plan_version != task.plan_version:
                raise LeaseLost("plan superseded")
            if run_usage.status == Run.Status.CANCELLING:
                raise LeaseLost("run cancelled")
            check_task_transition(Task.Status.RUNNING, Task.Status.COMPLETED)
            completed = Task.objects.filter(id=task.id, fencing_token=lease.token, status=Task.Status.RUNNING).update(
                status=Task.Status.COMPLETED, finished_at=now, lease_owner="", lease_expires_at=None, status_reason="",
                steps_used=F("steps_used") + 1, tokens_used=F("tokens_used") + tokens, cost_micros=F("cost_micros") + cost,
            )
            if completed != 1:
                raise LeaseLost(f"task {task.id}: token {lease.token} no longer holds the lease")
            Span.objects.create(
                run_id=run.id, task_id=task.id, parent_id=lease.span_id, kind=Span.Kind.MODEL_CALL, name=response.model,
                attempt=lease.attempt, step=step, fencing_token=lease.token, started_at=started, ended_at=now,
                tokens_in=response.tokens_in, tokens_out=response.tokens_out, cost_micros=cost, **_body_fields(body),
            )
            Artifact.objects.create(
                run_id=run.id, task_id=task.id, key=task.key, schema=task.output_schema, content=output,
                provenance={"task": task.key, "agent": task.agent_id, "attempt": lease.attempt,
                            "fencing_token": lease.token, "model": response.model, "step": step,
                            "inputs": sorted(task.depends_on)},
            )
            _close_spans(lease, now=now, ok=True, final=True)
            run.status = run_usage.status
            if planned is not None:
                from .runs import tasks_create

                run.plan_version = plan_version
                tasks_create(run=run, planned=planned[0], agents=planned[1], depth=task.depth + 1)
            try:
                # The answer that crossed the budget is kept; nothing more starts.
                run_usage.check_after_step("run")
                over_budget = ""
            except BudgetExceeded as exc:
                over_budget = str(exc)
            return _advance(run, owner=lease.owner, now=now, stop_reason=over_budget)
    except LeaseLost:
        _quarantine(lease, task, step=step, body=body)
        return None


def _advance(run: Run, *, owner: str, now, stop_reason: str = ""):
    """Make tasks whose dependencies are done ready; claim one for this worker (the task-to-task hop
    without a broker round trip) and send the others; finish the run when all is done.
    With ``stop_reason`` (a budget crossed), the run waits for a human instead. Call with the run locked."""
    tasks = list(Task.objects.filter(run_id=run.id).values_list("id", "key", "status", "depends_on", named=True))
    done = {t.key for t in tasks if t.status == Task.Status.COMPLETED}
    if len(done) == len(tasks):
        if run.status in (Run.Status.RUNNING, Run.Status.NEEDS_ATTENTION):
            run_transition(run=run, to=Run.Status.COMPLETED, reason="all tasks completed", now=now)
        return None
    if stop_reason and run.status == Run.Status.RUNNING:
        run_transition(run=run, to=Run.Status.NEEDS_ATTENTION, reason=stop_reason, now=now)
    newly_ready = [t for t in tasks if t.status == Task.Status.PENDING and all(d in done for d in t.depends_on)]
    if newly_ready:
        check_task_transition(Task.Status.PENDING, Task.Status.READY)
    if newly_ready:
        Task.objects.filter(id__in=[t.id for t in newly_ready]).update(status=Task.Status.READY, ready_at=now)
    if run.status != Run.Status.RUNNING:
        return None  # paused: resume sends the ready ones
    ready_ids = [t.id for t in newly_ready] + [t.id for t in tasks if t.status == Task.Status.READY]
    mine = None
    for task_id in ready_ids:
        if mine is None:
            candidate = Task.objects.select_for_update().get(id=task_id)
            if _start_crash_due(run, candidate):
                # No message for it: no sibling thread may start it before this process dies.
                # It stays ready and the sweeper of the next worker re-drives it.
                mine = CRASH
                continue
            mine = _claim(candidate, owner=owner, now=now)
            if mine is not None:
                continue
        outbox_add(actor=EXECUTE, kwargs={"run_id": run.id, "task_id": task_id})
    return mine


def _fail_task(*, task: Task, run: Run, failure_class: str, reason: str, now) -> None:
    """Fail a task for good and hand its run to a human. Call with the run (and task) locked."""
    check_task_transition(task.status, Task.Status.FAILED)
    Task.objects.filter(id=task.id).update(
        status=Task.Status.FAILED, failure_class=failure_class, status_reason=reason[:4000], finished_at=now,
        lease_owner="", lease_expires_at=None,
    )
    Span.objects.filter(task=task, kind=Span.Kind.TASK, ended_at__isnull=True).update(
        ended_at=now, status=Span.Status.ERROR, attributes={"error": reason[:2000]}
    )
    if run.status in (Run.Status.RUNNING, Run.Status.WAITING_FOR_APPROVAL):
        what = reason if failure_class == "budget" else f"task {task.key} failed ({failure_class}): {reason}"
        run_transition(run=run, to=Run.Status.NEEDS_ATTENTION, reason=what, now=now)


def retry_delay_seconds(attempt: int) -> float:
    """Exponential backoff with equal jitter and a cap."""
    cfg = settings.WARDEN
    ceiling = min(cfg["RETRY_CAP_SECONDS"], cfg["RETRY_BASE_SECONDS"] * 2 ** max(0, attempt - 1))
    return ceiling / 2 + random.uniform(0, ceiling / 2)


def _fail_or_retry(lease: Lease, exc: StepFailure):
    now = timezone.now()
    reason = str(exc)
    try:
        with transaction.atomic():
            run, task = _lock_own_task(lease)
            _close_spans(lease, now=now, ok=False, final=False, reason=reason)
            retryable = isinstance(exc, TransientFailure) or exc.failure_class == "transient"
            if retryable and task.attempts < task.max_attempts + task.recoveries and run.status == Run.Status.RUNNING:
                delay = retry_delay_seconds(task.attempts)
                check_task_transition(task.status, Task.Status.RETRY_WAIT)
                Task.objects.filter(id=task.id).update(
                    status=Task.Status.RETRY_WAIT, failure_class=exc.failure_class, status_reason=reason[:4000],
                    not_before=now + timezone.timedelta(seconds=delay), lease_owner="", lease_expires_at=None,
                )
                outbox_add(actor=EXECUTE, kwargs={"run_id": run.id, "task_id": task.id}, delay_ms=int(delay * 1000))
            elif run.status == Run.Status.CANCELLING:
                _cancel_own(task, run, now)
            else:
                _fail_task(task=task, run=run, failure_class=exc.failure_class, reason=reason, now=now)
    except LeaseLost:
        pass
    return None


def _cancel_own(task: Task, run: Run, now) -> None:
    check_task_transition(task.status, Task.Status.CANCELLED)
    Task.objects.filter(id=task.id).update(
        status=Task.Status.CANCELLED, status_reason="run cancelled", finished_at=now, lease_owner="", lease_expires_at=None
    )
    Span.objects.filter(task=task, ended_at__isnull=True).update(ended_at=now, status=Span.Status.ERROR)
    run_finish_cancel_if_idle(run=run, now=now)


def _stop_cancelled(lease: Lease):
    """Cooperative cancellation, checked between steps."""
    try:
        with transaction.atomic():
            run, task = _lock_own_task(lease)
            _cancel_own(task, run, timezone.now())
    except LeaseLost:
        pass
    return None


def _yield(lease: Lease):
    """This attempt has run a whole slice: hand the rest to a fresh message (same attempt)."""
    now = timezone.now()
    try:
        with transaction.atomic():
            run, task = _lock_own_task(lease)
            Task.objects.filter(id=task.id).update(
                status=Task.Status.READY, continuing=True, ready_at=now, lease_owner="", lease_expires_at=None
            )
            outbox_add(actor=EXECUTE, kwargs={"run_id": run.id, "task_id": task.id})
    except LeaseLost:
        pass
    return None
