"""The hot path's statements: each hand-written PostgreSQL statement beside its portable twin, both
returning the same named rows. The engine picks one by the database it runs on (``connection.vendor``);
tests/runs/test_sql_parity.py runs both on PostgreSQL, on the same fixtures, and compares what they did.

- claim_fresh_pg / claim_fresh_portable: a task's first attempt (lease, fencing token, task and attempt spans).
- finish_pg / finish_portable: a task's final answer (usage, completion, span, artifact, dependents).
- journal_step_pg / journal_step_portable: one journaled step counted on the task and the run.
- dependents_count_down: the same statement on both.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, NamedTuple

from django.db import transaction
from django.utils import timezone

from core import bus
from core.errors import BudgetExceeded, LeaseLost

from ..models import Payload, Run, Span, Task
from ..transitions import TASK
from . import sql

if TYPE_CHECKING:
    from .leases import Lease

INLINE_BODY_LIMIT = 16_000  # bytes of JSON kept in the span row; larger bodies go to Payload


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
    def of(cls, obj) -> Usage:
        return cls(
            getattr(obj, "status", ""),
            obj.steps_used,
            obj.tokens_used,
            obj.tool_calls_used,
            obj.cost_micros,
            obj.max_steps,
            obj.max_tokens,
            obj.max_tool_calls,
            obj.max_cost_micros,
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


class Claimed(NamedTuple):
    task_span_id: int
    span_id: int  # the attempt's


class ReadyRow(NamedTuple):
    """A task a completion made ready, with what claiming it needs."""

    id: int
    status: str
    key: str
    fencing_token: int
    attempts: int
    continuing: bool
    agent_id: int


class Finished(NamedTuple):
    usage: Usage  # the run's, after this step
    plan_version: int
    held_back: int
    ready: list[ReadyRow]
    missed: list[int]  # dependents the statement could not count down (added by a re-plan meanwhile)


class StepCounted(NamedTuple):
    run: Usage
    task: Usage


_CLAIMED = TASK.edge(Task.Status.READY, Task.Status.RUNNING)  # a first claim: its task was ready
_PG_CLAIM_FRESH = f"""
WITH c AS (
    UPDATE runs_task SET status = '{_CLAIMED}', attempts = 1, fencing_token = %(token)s, lease_owner = %(owner)s,
        lease_expires_at = %(expires)s, heartbeat_at = %(now)s, continuing = false,
        started_at = COALESCE(started_at, %(now)s), not_before = NULL
    WHERE id = %(task)s AND fencing_token = %(old)s AND status = %(status)s
    RETURNING id
), ts AS (
    INSERT INTO runs_span (run_id, task_id, parent_id, kind, name, status, attempt, step, fencing_token, started_at,
        ended_at, tokens_in, tokens_out, cost_micros, attributes, body, payload_id)
    SELECT %(run)s, c.id, (SELECT id FROM runs_span WHERE run_id = %(run)s AND kind = 'run' ORDER BY id LIMIT 1),
        'task', %(task_name)s, 'running', NULL, NULL, NULL, %(now)s, NULL, 0, 0, 0,
        %(task_attrs)s::jsonb, NULL, NULL FROM c
    RETURNING id
), a AS (
    INSERT INTO runs_span (run_id, task_id, parent_id, kind, name, status, attempt, step, fencing_token, started_at,
        ended_at, tokens_in, tokens_out, cost_micros, attributes, body, payload_id)
    SELECT %(run)s, %(task)s, ts.id, 'attempt', 'attempt 1', 'running', 1, NULL, %(token)s, %(now)s, NULL, 0, 0, 0,
        %(attempt_attrs)s::jsonb, NULL, NULL FROM ts
    RETURNING id
)
SELECT (SELECT id FROM ts), (SELECT id FROM a)
"""


def claim_fresh_pg(task: Task, *, owner: str, now, token: int, expires) -> Claimed | None:
    """A first attempt's claim and its two spans in one statement (the hop between chained tasks). None
    when the task moved meanwhile (another claim, a cancel). Call with the run row locked."""
    TASK.check(task.status, _CLAIMED)
    task_span_id, span_id = sql.fetchone(
        _PG_CLAIM_FRESH,
        {
            "token": token,
            "owner": owner,
            "expires": expires,
            "now": now,
            "task": task.id,
            "old": task.fencing_token,
            "status": task.status,
            "run": task.run_id,
            "task_name": f"task {task.key}",
            "task_attrs": sql.dumps({"agent": task.agent_id}),
            "attempt_attrs": sql.dumps({"worker": owner}),
        },
    )
    return None if span_id is None else Claimed(task_span_id, span_id)


def claim_fresh_portable(task: Task, *, owner: str, now, token: int, expires) -> Claimed | None:
    """claim_fresh_pg's twin, in three statements of the caller's transaction."""
    running = TASK.edge(task.status, Task.Status.RUNNING)
    claimed = sql.execute(
        "UPDATE runs_task SET status = %s, attempts = 1, fencing_token = %s, lease_owner = %s, "
        "lease_expires_at = %s, heartbeat_at = %s, continuing = %s, started_at = COALESCE(started_at, %s), "
        "not_before = NULL WHERE id = %s AND fencing_token = %s AND status = %s",
        [running, token, owner, sql.ts(expires), sql.ts(now), False, sql.ts(now), task.id, task.fencing_token,
         task.status],
    )  # fmt: skip
    if claimed != 1:
        return None
    task_span_id = sql.insert_span(
        run_id=task.run_id,
        task_id=task.id,
        parent_id=sql.RUN_ROOT,
        kind=Span.Kind.TASK,
        name=f"task {task.key}",
        status=Span.Status.RUNNING,
        started_at=now,
        attributes={"agent": task.agent_id},
    )
    span_id = sql.insert_span(
        run_id=task.run_id,
        task_id=task.id,
        parent_id=task_span_id,
        kind=Span.Kind.ATTEMPT,
        name="attempt 1",
        status=Span.Status.RUNNING,
        attempt=1,
        fencing_token=token,
        started_at=now,
        attributes={"worker": owner},
    )
    return Claimed(task_span_id, span_id)


# The fast paths' moves, named from the table: the module does not load if the table stops allowing them.
_RUNNING, _COMPLETED = Task.Status.RUNNING, TASK.edge(Task.Status.RUNNING, Task.Status.COMPLETED)
_PENDING, _READY = Task.Status.PENDING, TASK.edge(Task.Status.PENDING, Task.Status.READY)

_PG_FINISH = f"""
WITH r AS (
    UPDATE runs_run SET steps_used = steps_used + 1, tokens_used = tokens_used + %(tokens)s,
        cost_micros = cost_micros + %(cost)s
    WHERE id = %(run)s
    RETURNING {sql.USAGE_COLUMNS}, plan_version, held_back
), t AS (
    UPDATE runs_task SET status = '{_COMPLETED}', finished_at = %(now)s, lease_owner = '', lease_expires_at = NULL,
        status_reason = '', steps_used = steps_used + 1, tokens_used = tokens_used + %(tokens)s,
        cost_micros = cost_micros + %(cost)s, tokens_reserved = 0, cost_reserved_micros = 0
    WHERE id = %(task)s AND fencing_token = %(token)s AND status = '{_RUNNING}'
        AND EXISTS (SELECT 1 FROM r WHERE r.status <> 'cancelling')
    RETURNING id, dependents
), s AS (
    INSERT INTO runs_span (run_id, task_id, parent_id, kind, name, status, attempt, step, fencing_token,
        started_at, ended_at, tokens_in, tokens_out, cost_micros, attributes, body, payload_id)
    SELECT %(run)s, t.id, %(parent)s, 'model_call', %(model)s, 'ok', %(attempt)s, %(step)s, %(token)s,
        %(started)s, %(now)s, %(tokens_in)s, %(tokens_out)s, %(cost)s, '{{}}'::jsonb, %(body)s::jsonb, NULL FROM t
), a AS (
    INSERT INTO runs_artifact (run_id, task_id, key, schema, content, provenance, verification, version, created_at)
    SELECT %(run)s, t.id, %(key)s, %(schema)s::jsonb, %(content)s::jsonb, %(provenance)s::jsonb, 'unverified', 1,
        %(now)s FROM t
), e AS (
    UPDATE runs_span SET ended_at = %(now)s, status = 'ok'
    WHERE id = ANY(%(spans)s) AND EXISTS (SELECT 1 FROM t)
), d AS (
    UPDATE runs_task SET pending_deps = pending_deps - 1,
        status = CASE WHEN pending_deps <= 1 THEN '{_READY}' ELSE status END,
        ready_at = CASE WHEN pending_deps <= 1 THEN %(now)s ELSE ready_at END
    WHERE id = ANY(%(dependents)s) AND status = '{_PENDING}' AND EXISTS (SELECT 1 FROM t)
    RETURNING id, status, key, fencing_token, attempts, continuing, agent_id
)
SELECT r.*, (SELECT count(*) FROM t),
    (SELECT coalesce(json_agg(json_build_array(id, status, key, fencing_token, attempts, continuing, agent_id)), '[]')
     FROM d),
    (SELECT dependents FROM t)
FROM r
"""


def finish_pg(lease: Lease, run: Run, task: Task, *, step, response, started, now, body, provenance) -> Finished:
    """A completion in one statement: usage counted, task completed, model span, artifact, spans ended,
    dependents counted down. The task-to-task hop is mostly round trips."""
    tokens, cost = response.tokens_in + response.tokens_out, response.cost_micros
    *usage, plan_version, held_back, completed, ready_rows, dependents = sql.fetchone(
        _PG_FINISH,
        {
            "run": run.id,
            "task": task.id,
            "token": lease.token,
            "tokens": tokens,
            "cost": cost,
            "now": now,
            "started": started,
            "parent": lease.span_id,
            "model": response.model,
            "attempt": lease.attempt,
            "step": step,
            "tokens_in": response.tokens_in,
            "tokens_out": response.tokens_out,
            "body": sql.dumps(body),
            "key": task.key,
            "schema": sql.dumps(task.output_schema),
            "content": sql.dumps(response.final),
            "provenance": sql.dumps(provenance),
            "spans": [i for i in (lease.span_id, lease.task_span_id) if i],
            "dependents": [int(i) for i in task.dependents],
        },
    )
    if not completed:
        raise LeaseLost(f"task {task.id}: token {lease.token} no longer holds the lease")
    bus.run_changed(run.id)
    ready = [ReadyRow(*r) for r in sql.loads(ready_rows) if r[1] == Task.Status.READY]
    # A re-plan that committed while this statement waited for the run's lock may have added dependents
    # this statement's snapshot cannot see: the caller counts them down in a statement of its own.
    known = {str(d) for d in task.dependents}
    missed = [int(i) for i in sql.loads(dependents) if str(i) not in known]
    return Finished(Usage(*usage), plan_version, held_back, ready, missed)


def _artifact_insert(run: Run, task: Task, content, provenance, now) -> None:
    sql.execute(
        "INSERT INTO runs_artifact (run_id, task_id, key, schema, content, provenance, verification, version, "
        "created_at) VALUES (%s, %s, %s, %s, %s, %s, %s, 1, %s)",
        [
            run.id,
            task.id,
            task.key,
            sql.dumps(task.output_schema),
            sql.dumps(content),
            sql.dumps(provenance),
            "unverified",
            sql.ts(now),
        ],
    )


def finish_portable(lease: Lease, run: Run, task: Task, *, step, response, started, now, body, provenance) -> Finished:
    """finish_pg's twin, in several statements of one transaction (the caller's)."""
    tokens, cost = response.tokens_in + response.tokens_out, response.cost_micros
    # The usage update takes the run's row lock first (lock order: run, then tasks).
    *usage, plan_version, held_back = sql.add_usage(
        "runs_run",
        run.id,
        steps=1,
        tokens=tokens,
        tool_calls=0,
        cost=cost,
        returning=f"{sql.USAGE_COLUMNS}, plan_version, held_back",
    )
    run_usage = Usage(*usage)
    if run_usage.status == Run.Status.CANCELLING:
        raise LeaseLost("run cancelled")
    # Its dependents as they are now, under the run's lock: a re-plan may have added some since this
    # attempt started.
    completed = sql.fetchone(
        "UPDATE runs_task SET status = %s, finished_at = %s, lease_owner = '', lease_expires_at = NULL, "
        "status_reason = '', steps_used = steps_used + 1, tokens_used = tokens_used + %s, "
        "cost_micros = cost_micros + %s, tokens_reserved = 0, cost_reserved_micros = 0 "
        "WHERE id = %s AND fencing_token = %s AND status = %s RETURNING dependents",
        [_COMPLETED, sql.ts(now), tokens, cost, task.id, lease.token, _RUNNING],
    )
    if completed is None:
        raise LeaseLost(f"task {task.id}: token {lease.token} no longer holds the lease")
    sql.insert_span(
        run_id=run.id,
        task_id=task.id,
        parent_id=lease.span_id,
        kind=Span.Kind.MODEL_CALL,
        name=response.model,
        attempt=lease.attempt,
        step=step,
        fencing_token=lease.token,
        started_at=started,
        ended_at=now,
        tokens_in=response.tokens_in,
        tokens_out=response.tokens_out,
        cost_micros=cost,
        body=body,
    )
    _artifact_insert(run, task, response.final, provenance, now)
    sql.end_spans([lease.span_id, lease.task_span_id], now=now, status=Span.Status.OK)
    bus.run_changed(run.id)
    dependents = [int(i) for i in sql.loads(completed[0])]
    ready = dependents_count_down(dependents, now) if dependents else []
    return Finished(run_usage, plan_version, held_back, ready, missed=[])


def dependents_count_down(ids: list[int], now) -> list[ReadyRow]:
    """One dependency of each of ``ids`` completed; those with none left become ready (returned). One
    statement, the same on both databases."""
    where, params = sql.in_list("id", ids)
    # SET expressions see the row before the update: pending_deps = 1 means this was the last one.
    rows = sql.fetchall(
        "UPDATE runs_task SET pending_deps = pending_deps - 1, "
        "status = CASE WHEN pending_deps <= 1 THEN %s ELSE status END, "
        "ready_at = CASE WHEN pending_deps <= 1 THEN %s ELSE ready_at END "
        f"WHERE {where} AND status = %s "
        "RETURNING id, status, key, fencing_token, attempts, continuing, agent_id",
        [_READY, sql.ts(now), *params, _PENDING],
    )
    return [ReadyRow(*r) for r in rows if r[1] == Task.Status.READY]


_PG_JOURNAL_STEP = f"""
WITH t AS (
    UPDATE runs_task SET steps_used = steps_used + 1, tokens_used = tokens_used + %(tokens)s,
        tool_calls_used = tool_calls_used + %(tool_calls)s, cost_micros = cost_micros + %(cost)s,
        heartbeat_at = %(now)s, tokens_reserved = 0, cost_reserved_micros = 0
    WHERE id = %(task)s AND fencing_token = %(token)s AND status = 'running'
    RETURNING {sql.USAGE_COLUMNS}
), r AS (
    UPDATE runs_run SET steps_used = steps_used + 1, tokens_used = tokens_used + %(tokens)s,
        tool_calls_used = tool_calls_used + %(tool_calls)s, cost_micros = cost_micros + %(cost)s
    WHERE id = %(run)s AND EXISTS (SELECT 1 FROM t)
    RETURNING {sql.USAGE_COLUMNS}
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


def step_params(lease: Lease, *, step: int, kind: str, name: str, started, response=None, tool_call=False) -> dict:
    """What journal_step_pg and journal_step_portable take: one step of ``lease``'s attempt."""
    now = timezone.now()
    return {
        "run": lease.run_id,
        "task": lease.task_id,
        "token": lease.token,
        "parent": lease.span_id,
        "attempt": lease.attempt,
        "step": step,
        "kind": kind,
        "name": name,
        "started": sql.ts(started),
        "now": sql.ts(now),
        "started_dt": started,
        "now_dt": now,
        "tool_calls": int(tool_call),
        "tokens": (response.tokens_in + response.tokens_out) if response else 0,
        "tokens_in": response.tokens_in if response else 0,
        "tokens_out": response.tokens_out if response else 0,
        "cost": response.cost_micros if response else 0,
    }


def journal_step_pg(p: dict, body_json: str) -> StepCounted:
    """One step journaled and counted on the task and the run in one statement (one round trip, one
    commit), as a compare-and-set on the lease. Bodies up to INLINE_BODY_LIMIT only."""
    row = sql.fetchone(_PG_JOURNAL_STEP, {**p, "body": body_json})
    if row is None:
        raise LeaseLost(f"task {p['task']}: token {p['token']} no longer holds the lease")
    width = len(Usage.__dataclass_fields__)
    return StepCounted(Usage(*row[:width]), Usage(*row[width:]))


def journal_step_portable(p: dict, body, body_json: str) -> StepCounted:
    """journal_step_pg's twin, in one transaction; a large body goes to a Payload row."""
    with transaction.atomic():
        task_row = sql.add_usage(
            "runs_task",
            p["task"],
            steps=1,
            tokens=p["tokens"],
            tool_calls=p["tool_calls"],
            cost=p["cost"],
            extra_set=", heartbeat_at = %s, tokens_reserved = 0, cost_reserved_micros = 0",
            extra_set_params=(p["now"],),
            extra_where="AND fencing_token = %s AND status = %s",
            extra_params=(p["token"], Task.Status.RUNNING),
        )
        if task_row is None:
            raise LeaseLost(f"task {p['task']}: token {p['token']} no longer holds the lease")
        run_row = sql.add_usage(
            "runs_run", p["run"], steps=1, tokens=p["tokens"], tool_calls=p["tool_calls"], cost=p["cost"]
        )
        large = len(body_json) > INLINE_BODY_LIMIT
        payload_id = Payload.objects.create(body=body, size=len(body_json)).id if large else None
        sql.insert_span(
            run_id=p["run"],
            task_id=p["task"],
            parent_id=p["parent"],
            kind=p["kind"],
            name=p["name"],
            attempt=p["attempt"],
            step=p["step"],
            fencing_token=p["token"],
            started_at=p["started_dt"],
            ended_at=p["now_dt"],
            tokens_in=p["tokens_in"],
            tokens_out=p["tokens_out"],
            cost_micros=p["cost"],
            body=None if large else body,
            payload_id=payload_id,
        )
    return StepCounted(Usage(*run_row), Usage(*task_row))
