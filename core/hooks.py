"""Calls a lower layer makes into an upper one inside its own transaction.

The broker writes an operation that must wait for a reviewer, and the engine cancels a run whose
approvals must be withdrawn, in the same transaction as the upper layer's rows; an after-commit event
would leave a window where the operation waits for a request that does not exist. So the upper layer
(approvals above the engine, the engine above the tools and core) provides these functions at start-up
(its AppConfig.ready) and the lower layers call them, without importing it. A call with no provider
raises: a missing approvals app can never let an operation go out unrecorded.

Each hook is declared below as a typed stub: its name, its signature and what it does, in one place that
"go to definition" reaches from every caller (``call(HOOK, …)``) and provider (``provide(HOOK, fn)``), and
that a type checker checks both against. A row of an upper app is typed ``Any`` (core may not import its
model); the docstring names it. ``provide`` refuses at start-up a function that could not be called the
way the stub says.
"""

import inspect
from collections.abc import Callable
from typing import Any, Generic, ParamSpec, TypeVar

from django.core.exceptions import ImproperlyConfigured

P = ParamSpec("P")
R = TypeVar("R")


class Hook(Generic[P, R]):
    """One upward call: declared once here (``@hook`` on a stub), provided once by an upper app."""

    def __init__(self, stub: Callable[P, R]):
        self.name = stub.__name__
        self.signature = inspect.signature(stub)
        # Each argument is passed one way only, so a provider's signature can be checked against it.
        either = [p.name for p in self.signature.parameters.values() if p.kind is p.POSITIONAL_OR_KEYWORD]
        if either:
            raise TypeError(f"{self.name}: make {either} positional-only (before /) or keyword-only (after *)")
        self.__doc__ = stub.__doc__
        self.__wrapped__ = stub  # help() and IDEs show the stub's signature

    def __repr__(self) -> str:
        return f"<hook {self.name}{self.signature}>"


def hook(stub: Callable[P, R]) -> Hook[P, R]:
    return Hook(stub)


# A pass of the recovery sweeper: (now) → its counts by name.
Sweep = Callable[[Any], dict[str, int]]

_providers: dict[Hook, Callable] = {}
_sweeps: list[Sweep] = []


def provide(hook: Hook[P, R], function: Callable[P, R]) -> None:
    """Register the one function that answers ``hook`` (at start-up)."""
    _check_fits(hook, function)
    _providers[hook] = function


def call(hook: Hook[P, R], *args: P.args, **kwargs: P.kwargs) -> R:
    try:
        function = _providers[hook]
    except KeyError:
        raise ImproperlyConfigured(
            f"nothing provides {hook.name}: are the tools and approvals apps installed?"
        ) from None
    return function(*args, **kwargs)


def _check_fits(hook: Hook, function: Callable) -> None:
    """The provider takes every argument the stub declares, passed the way the stub says callers pass it
    (and needs no other)."""
    args: list[None] = []
    kwargs: dict[str, None] = {}
    for p in hook.signature.parameters.values():
        if p.kind is p.POSITIONAL_ONLY:
            args.append(None)
        elif p.kind is p.KEYWORD_ONLY:
            kwargs[p.name] = None
    try:
        inspect.signature(function).bind(*args, **kwargs)
    except TypeError as e:
        raise ImproperlyConfigured(f"{function!r} cannot provide {hook!r}: {e}") from None


def add_sweep(function: Sweep) -> None:
    """A pass of the recovery sweeper that an upper layer owns (redriving approved operations, expiring
    approvals, sending notifications): ``function(now)`` returns its counts by name. Registered at start-up."""
    if function not in _sweeps:
        _sweeps.append(function)


def sweeps() -> list[Sweep]:
    return list(_sweeps)


# The hooks. Each is self-contained (stub, signature, docstring, provider named): delete one as a whole.


@hook
def APPROVAL_REQUESTED(request: Any, /) -> None:
    """(approvals) A top-level ApprovalRequest was made (policy/services.py, in its transaction): its
    reviewers' notifications are recorded and approval.requested is queued, in the same commit."""
    raise NotImplementedError


@hook
def QUESTION_FOR_OPERATION(op: Any, /, *, arguments: dict) -> Any:
    """(approvals) The Question a human.ask ToolOperation asks, in its intent's transaction: its task parks
    on it. Caller: the broker."""
    raise NotImplementedError


@hook
def PLAN_HOLD(*, run: Any, task: Any, plan: Any, now: Any) -> Any:
    """(approvals) The plan of a Run's (locked) planner Task now waits for a reviewer: its ApprovalRequest.
    Caller: the engine's plans."""
    raise NotImplementedError


@hook
def COMPENSATION_STEP_REPORTED(operation: Any, /, *, failure: Any) -> Any:
    """(the saga) An undo or correction an external agent carried out (a ToolOperation, locked) is recorded
    as a compensation step, or as its failure (``failure``: None or what went wrong). Caller: the
    integrations' external agents."""
    raise NotImplementedError


@hook
def QUESTIONS_WITHDRAW(*, run: Any, reason: str, now: Any) -> int:
    """(approvals) The run (a Run, locked) moved on (cancelled, compensated): how many of its pending
    questions were withdrawn. Caller: the engine's run_cancel."""
    raise NotImplementedError


@hook
def RUN_GATE_FACTS(*, run_id: int, tool: str) -> Any:
    """(runs) What the gate judges a call of ``tool`` in this run by: a policy.verdicts.RunFacts (its
    project, workflow, pinned tool policies, starter, recorded policies; one query, runs/selectors.py).
    Caller: the broker's gate, below the engine."""
    raise NotImplementedError


@hook
def FAULT_FIRE_ONCE(*, run_id: int, task_key: str, point: str, mode: str) -> bool:
    """(runs) True the first time a drill fault fires (recorded before it acts). Caller: core/faults.py."""
    raise NotImplementedError
