"""Drill faults chosen in a run's input (docs/scenarios.md): where they apply, whether they fired, and
the one injector (``faults``) that production code calls at its crash points."""

import os
import signal
import time
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass

from django.conf import settings

from . import hooks


def faults_at(
    run_input: dict,
    task_key: str,
    *,
    call: int | None = None,
    at: str = "call",
    with_points: bool = False,
    any_call: bool = False,
) -> list:
    """The modes of the faults at this task's call (or start); ``with_points`` adds each crash's point."""
    modes = []
    for fault in (run_input or {}).get("faults", []):
        if fault.get("task") != task_key or fault.get("at", "call") != at:
            continue
        if at == "call" and not any_call and fault.get("call") != call:
            continue
        modes.append((fault["mode"], fault.get("point", "")) if with_points else fault["mode"])
    return modes


def fault_fire_once(*, run_id: int, task_key: str, point: str, mode: str) -> bool:
    """True the first time only (the engine records it: runs/apps.py provides FAULT_FIRE_ONCE)."""
    return hooks.call(hooks.FAULT_FIRE_ONCE, run_id=run_id, task_key=task_key, point=point, mode=mode)


def crash_now() -> None:
    """The `crash` drill: this worker process dies here, as a SIGKILL would kill it."""
    os.kill(os.getpid(), signal.SIGKILL)


FREEZE_SECONDS = 3.0  # the "freeze" drill fault: long enough for a drill to SIGSTOP the process there


@dataclass
class CallFaults:
    """The drill faults that apply to one tool call: the mode passed to the external system, and the
    crash points around the call at which this worker dies."""

    run_id: int
    task_key: str
    call: int
    system: str | None = None
    crash_points: tuple = ()
    no_lookup: bool = False  # the system's status lookup is unavailable for this call: only a person can tell

    @classmethod
    def at(cls, run_input: dict, *, run_id: int, task_key: str, call: int) -> "CallFaults":
        system, points, no_lookup = None, [], False
        for mode, point in faults_at(run_input, task_key, call=call, with_points=True):
            point_name = f"call:{call}" if point in ("", "after_intent") else f"call:{call}:{point}"
            if mode in ("crash", "freeze"):
                points.append((point or "after_intent", point_name, mode))
            elif mode in ("error", "slow"):
                system = mode  # every time: the system keeps refusing, or keeps being slow
            elif mode == "timeout_no_lookup":
                no_lookup = True  # on every attempt: nobody can ask the system what happened
                if fault_fire_once(run_id=run_id, task_key=task_key, point=point_name, mode=mode):
                    system = "timeout_after_commit"
            elif fault_fire_once(run_id=run_id, task_key=task_key, point=point_name, mode=mode):
                system = mode  # once: a retry succeeds
        return cls(
            run_id=run_id, task_key=task_key, call=call, system=system, crash_points=tuple(points), no_lookup=no_lookup
        )

    def crash(self, point: str) -> None:
        for name, point_name, mode in self.crash_points:
            if name == point and fault_fire_once(
                run_id=self.run_id, task_key=self.task_key, point=point_name, mode=mode
            ):
                if mode == "crash":
                    crash_now()
                time.sleep(FREEZE_SECONDS)


NO_FAULTS = CallFaults(run_id=0, task_key="", call=0)


class FaultInjector:
    """Drill faults behind one object. Every method is a no-op unless drill faults are on
    (``WARDEN_DRILL_FAULTS``) and the run's input asks for some: production code calls it at its crash
    points without knowing about faults, and no fault list travels through its signatures.

    ``around_call`` scopes a tool call: inside it, ``system``, ``no_lookup`` and ``crash`` answer for that
    call (worked out on first use, so a call refused before it leaves consumes no fault)."""

    def __init__(self):
        self._call: ContextVar = ContextVar("warden_call_faults", default=None)

    @staticmethod
    def enabled(run_input: dict | None) -> bool:
        return bool(settings.WARDEN["DRILL_FAULTS"] and (run_input or {}).get("faults"))

    @contextmanager
    def around_call(self, run_input: dict, *, run_id: int, task_key: str, call: int):
        scope = [run_input, run_id, task_key, call, None] if self.enabled(run_input) else None
        token = self._call.set(scope)
        try:
            yield
        finally:
            self._call.reset(token)

    def _current(self) -> CallFaults:
        scope = self._call.get()
        if scope is None:
            return NO_FAULTS
        if scope[4] is None:
            run_input, run_id, task_key, call, _ = scope
            scope[4] = CallFaults.at(run_input, run_id=run_id, task_key=task_key, call=call)
        return scope[4]

    @property
    def system(self) -> str | None:
        """The fault the external system plays for this call (error, slow, timeout…), if any."""
        return self._current().system

    @property
    def no_lookup(self) -> bool:
        return self._current().no_lookup

    def crash(self, point: str) -> None:
        """A crash (or freeze) fault at this point around the current call: the process dies here (or
        stops a while, as a frozen one would)."""
        self._current().crash(point)

    def crash_point(self, run_input: dict, *, run_id: int, task_key: str, call: int | None, point: str) -> None:
        """A crash fault at an engine point (after_advance, after_enqueue)."""
        if not self.enabled(run_input):
            return
        for mode, fault_point in faults_at(run_input, task_key, call=call, with_points=True, any_call=call is None):
            if mode == "crash" and fault_point == point:
                name = f"{point}" if call is None else f"call:{call}:{point}"
                if fault_fire_once(run_id=run_id, task_key=task_key, point=name, mode="crash"):
                    crash_now()

    def start_crash_due(self, run_input: dict, *, run_id: int, task_key: str) -> bool:
        """A crash fault at the start of a task, the first time it is due."""
        if not self.enabled(run_input):
            return False
        return "crash" in faults_at(run_input, task_key, at="start") and fault_fire_once(
            run_id=run_id, task_key=task_key, point="start", mode="crash"
        )


faults = FaultInjector()
