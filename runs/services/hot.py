"""The hot path, written once: a task's first claim, a journaled step and a completion, each a compare-and-set
on the attempt's fencing token, returning named rows (``Claimed``, ``StepCounted``, ``Finished``).

Which statements each takes on which database is runs/services/hot_sql.py's business (one statement on
PostgreSQL, a few plain ones elsewhere); here is only what is done with what they return.
tests/runs/test_sql_parity.py plays both dialects on PostgreSQL, on the same fixtures, and compares them.

- claim_fresh: a task's first attempt (lease, fencing token, task and attempt spans).
- journal_step: one journaled step counted on the task and the run.
- finish: a task's final answer (usage, completion, span, artifact, dependents counted down).
- dependents_count_down: dependents a completion's statement could not see (a re-plan meanwhile).
"""

from __future__ import annotations

import time
from contextlib import nullcontext
from dataclasses import dataclass, field
from typing import NamedTuple

from django.db import transaction
from django.utils import timezone

from core import bus
from core.errors import BudgetExceeded, LeaseLost

from ..models import Payload, Run, Task
from ..transitions import TASK
from . import sql
from .hot_sql import CLAIMED, hot_sql

INLINE_BODY_LIMIT = 16_000  # bytes of JSON kept in the span row; larger bodies go to Payload


@dataclass
class Lease:
    """An attempt's hold on its task (runs/services/leases.py takes it): every write of the attempt is a
    compare-and-set on ``token``."""

    task_id: int
    run_id: int
    token: int
    attempt: int
    span_id: int
    owner: str
    task_span_id: int | None = None
    fresh: bool = False  # a first attempt: nothing journaled yet
    claimed_at: float = field(default_factory=time.monotonic)
    context: tuple | None = None  # the task's context row, when the claim's statement returned it
    # The inputs the attempt checked, marked verified by its first journal statement (then emptied).
    verify: list[int] = field(default_factory=list)


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
    context: tuple | None  # the task's context row (PostgreSQL: in the claim's statement), else None


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


def _lost(task_id: int, token: int) -> LeaseLost:
    return LeaseLost(f"task {task_id}: token {token} no longer holds the lease")


def claim_fresh(task: Task, *, owner: str, now, token: int, expires, dialect: str | None = None) -> Claimed | None:
    """A first attempt's claim and its task and attempt spans (the hop between chained tasks). None when
    the task moved meanwhile (another claim, a cancel). Call with the run row locked."""
    TASK.check(task.status, CLAIMED)
    p = {
        "token": token,
        "owner": owner,
        "expires": sql.ts(expires),
        "now": sql.ts(now),
        "task": task.id,
        "old": task.fencing_token,
        "status": task.status,
        "run": task.run_id,
        "task_name": f"task {task.key}",
        "task_attrs": sql.dumps({"agent": task.agent_id}),
        "attempt_attrs": sql.dumps({"worker": owner}),
    }
    if not sql.play(hot_sql(dialect).claim_fresh, p):
        return None
    bus.run_changed(task.run_id)
    context = p.get("context")
    return Claimed(p["task_span"], p["span"], context if context and context[0] is not None else None)


def _verify_params(lease: Lease) -> dict:
    """The attempt's checked inputs, for its first journal statement to mark verified (once)."""
    ids, lease.verify = lease.verify, []
    return {"verify": sql.any_of_ids(ids), "verifying": bool(ids)}


def step_params(lease: Lease, *, step: int, kind: str, name: str, started, response=None, tool_call=False) -> dict:
    """What journal_step takes: one step of ``lease``'s attempt."""
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
        "now": sql.ts(timezone.now()),
        "tool_calls": int(tool_call),
        "tokens": (response.tokens_in + response.tokens_out) if response else 0,
        "tokens_in": response.tokens_in if response else 0,
        "tokens_out": response.tokens_out if response else 0,
        "cost": response.cost_micros if response else 0,
        **_verify_params(lease),
    }


def journal_step(p: dict, body, body_json: str, *, dialect: str | None = None) -> StepCounted:
    """One step journaled and counted on the task and the run, as a compare-and-set on the lease: on
    PostgreSQL one statement (one round trip, one commit), elsewhere one transaction. A body larger than
    INLINE_BODY_LIMIT goes to a Payload row, written in the same transaction."""
    statements = hot_sql(dialect).journal_step
    large = len(body_json) > INLINE_BODY_LIMIT
    with transaction.atomic() if large or len(statements) > 1 else nullcontext():
        p["payload"] = Payload.objects.create(body=body, size=len(body_json)).id if large else None
        p["body"] = None if large else body_json
        if not sql.play(statements, p):
            raise _lost(p["task"], p["token"])
    return StepCounted(Usage(*p["run_usage"]), Usage(*p["task_usage"]))


def finish(
    lease: Lease, run: Run, task: Task, *, step, response, started, now, body, provenance, dialect: str | None = None
) -> Finished:
    """A completion: usage counted, task completed, model span, artifact, spans ended, dependents counted
    down (on PostgreSQL one statement: the task-to-task hop is mostly round trips). Call in a transaction."""
    known = [int(i) for i in task.dependents]
    p = {
        "run": run.id,
        "task": task.id,
        "token": lease.token,
        "tokens": response.tokens_in + response.tokens_out,
        "tool_calls": 0,
        "cost": response.cost_micros,
        "now": sql.ts(now),
        "started": sql.ts(started),
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
        "span": lease.span_id,
        "task_span": lease.task_span_id,
        "counted": sql.any_of_ids(known),
        "has_dependents": bool(known),
        **_verify_params(lease),
    }
    if not sql.play(hot_sql(dialect).finish, p) or not p["completed"]:
        run_usage = Usage(*p["run_usage"])
        raise LeaseLost("run cancelled") if run_usage.status == Run.Status.CANCELLING else _lost(task.id, lease.token)
    bus.run_changed(run.id)
    ready = [ReadyRow(*r) for r in sql.loads(p.get("ready", [])) if r[1] == Task.Status.READY]
    # A re-plan that committed while the statements waited for the run's lock may have added dependents
    # they did not count down (the caller's ``task`` predates it): the caller counts them in a statement
    # of its own.
    missed = [int(i) for i in sql.loads(p["dependents"]) if int(i) not in known]
    return Finished(Usage(*p["run_usage"]), p["plan_version"], p["held_back"], ready, missed)


def dependents_count_down(ids: list[int], now) -> list[ReadyRow]:
    """One dependency of each of ``ids`` completed; those with none left become ready (returned). One
    statement, the same on both databases."""
    p = {"counted": sql.any_of_ids(ids), "now": sql.ts(now)}
    sql.play(hot_sql().count_down, p)
    return [ReadyRow(*r) for r in p["ready"] if r[1] == Task.Status.READY]
