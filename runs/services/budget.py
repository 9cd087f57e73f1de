"""Budgets reserved before spending. Before each model call the executor holds the call's worst case
(agents/gateway.py worst_case) against the task's and the run's token and cost budgets, in one atomic
step under the run's row lock; the journal statement that counts the call's real figures drops the hold
in the same write. A call that cannot be held is not made: refused if it would not fit even alone,
otherwise it waits for its siblings' calls to settle.

A hold is also one step in flight, counted against the run's step budget beside its siblings' holds.
A hold lives on the task row (tokens_reserved, cost_reserved_micros) and counts only while the task is
running, so a worker that dies holding one frees it when its task leaves that state.
"""

import time

from django.conf import settings
from django.db import transaction

from core.errors import BudgetExceeded, LeaseLost

from ..models import Run, Task
from . import sql
from .leases import Lease

_RUNNING = Task.Status.RUNNING
_HELD_BY_OTHERS = (
    "(SELECT COALESCE(SUM(o.{column}), 0) FROM runs_task o WHERE o.run_id = r.id AND o.status = %(running)s "
    "AND o.id <> %(task)s)"
)
# A hold is also one step in flight: siblings holding one count against the run's step budget.
_STEPS_HELD = (
    "(SELECT COUNT(*) FROM runs_task o WHERE o.run_id = r.id AND o.status = %(running)s AND o.id <> %(task)s "
    "AND o.tokens_reserved > 0)"
)
_RESERVE = f"""
UPDATE runs_task SET tokens_reserved = %(tokens)s, cost_reserved_micros = %(cost)s
WHERE id = %(task)s AND fencing_token = %(token)s AND status = %(running)s
    AND (max_tokens IS NULL OR tokens_used + %(tokens)s <= max_tokens)
    AND (max_cost_micros IS NULL OR cost_micros + %(cost)s <= max_cost_micros)
    AND (max_steps IS NULL OR steps_used + 1 <= max_steps)
    AND EXISTS (SELECT 1 FROM runs_run r WHERE r.id = %(run)s
        AND (r.max_steps IS NULL OR r.steps_used + 1 + {_STEPS_HELD} <= r.max_steps)
        AND (r.max_tokens IS NULL
             OR r.tokens_used + %(tokens)s + {_HELD_BY_OTHERS.format(column="tokens_reserved")} <= r.max_tokens)
        AND (r.max_cost_micros IS NULL
             OR r.cost_micros + %(cost)s + {_HELD_BY_OTHERS.format(column="cost_reserved_micros")}
                <= r.max_cost_micros))
"""


class BudgetBusy(Exception):
    """The call would fit, but not beside what its siblings hold now: the task gives its slice back."""


def limited(run: Run, task: Task) -> bool:
    budgets = (
        run.max_tokens,
        run.max_cost_micros,
        run.max_steps,
        task.max_tokens,
        task.max_cost_micros,
        task.max_steps,
    )
    return any(v is not None for v in budgets)


def budget_reserve(lease: Lease, run: Run, task: Task, *, tokens: int, cost: int) -> None:
    """Hold ``tokens`` and ``cost`` for the next model call of ``lease``'s task, or raise: BudgetExceeded
    when the call would not fit even with nothing else held, BudgetBusy after waiting BUDGET_WAIT_SECONDS
    for siblings to settle. Nothing to hold when neither the run nor the task has a token or cost budget."""
    if not limited(run, task):
        return
    params = {
        "task": lease.task_id,
        "run": lease.run_id,
        "token": lease.token,
        "running": _RUNNING,
        "tokens": tokens,
        "cost": cost,
    }
    deadline = time.monotonic() + settings.WARDEN["BUDGET_WAIT_SECONDS"]
    pause = 0.05
    while True:
        with transaction.atomic():
            # The run's row lock orders the holds of a run's tasks: the statement after it sees every
            # hold committed before (PostgreSQL, read committed); SQLite's writers are serial anyway.
            Run.objects.select_for_update().filter(id=lease.run_id).values_list("id", flat=True).first()
            held = sql.execute(_RESERVE, params)
        if held:
            return
        _refuse_if_it_cannot_fit(lease, tokens=tokens, cost=cost)
        if time.monotonic() > deadline:
            raise BudgetBusy()
        time.sleep(pause)
        pause = min(0.5, pause * 2)


def _refuse_if_it_cannot_fit(lease: Lease, *, tokens: int, cost: int) -> None:
    task = Task.objects.filter(id=lease.task_id).values(*_FIGURES, "fencing_token", "status").first()
    if task is None or task["fencing_token"] != lease.token or task["status"] != _RUNNING:
        raise LeaseLost(f"task {lease.task_id}: token {lease.token} no longer holds the lease")
    run = Run.objects.filter(id=lease.run_id).values(*_FIGURES).get()
    for scope, figures in (("task", task), ("run", run)):
        if figures["max_steps"] is not None and figures["steps_used"] >= figures["max_steps"]:
            raise BudgetExceeded("steps", figures["steps_used"], figures["max_steps"], scope)
        _check(scope, "tokens", figures["tokens_used"], tokens, figures["max_tokens"], str)
        _check(scope, "cost_usd", figures["cost_micros"], cost, figures["max_cost_micros"], _usd)


_FIGURES = ("tokens_used", "max_tokens", "cost_micros", "max_cost_micros", "steps_used", "max_steps")


def _usd(micros: int) -> str:
    return f"{micros / 1e6:.6f}"


def _check(scope: str, budget: str, used: int, worst: int, limit: int | None, show) -> None:
    if limit is not None and used + worst > limit:
        raise BudgetExceeded(budget, f"{show(used)} used + up to {show(worst)} for the next call", show(limit), scope)


def budget_release(lease: Lease) -> None:
    """Drop the hold of a call that was not made or not counted (a failure, a lost lease)."""
    Task.objects.filter(id=lease.task_id, fencing_token=lease.token).exclude(
        tokens_reserved=0, cost_reserved_micros=0
    ).update(tokens_reserved=0, cost_reserved_micros=0)
