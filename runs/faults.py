"""Drill faults chosen in a run's input (docs/scenarios.md): where they apply and whether they fired."""

import os
import signal

from django.db import IntegrityError, transaction

from .models import FaultFiring


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
    """True the first time only; the record is committed before the fault acts, so a crash fault
    does not fire again in the worker that resumes the run."""
    try:
        with transaction.atomic():
            FaultFiring.objects.create(run_id=run_id, task_key=task_key, point=point, mode=mode)
    except IntegrityError:
        return False
    return True


def crash_now() -> None:
    """The `crash` drill: this worker process dies here, as a SIGKILL would kill it."""
    os.kill(os.getpid(), signal.SIGKILL)
