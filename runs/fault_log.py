"""The engine's record of the drill faults that fired (core/faults.py asks it through core.hooks)."""

from django.db import IntegrityError, transaction

from .models import FaultFiring


def fault_fire_once(*, run_id: int, task_key: str, point: str, mode: str) -> bool:
    """True the first time only; the record is committed before the fault acts, so a crash fault
    does not fire again in the worker that resumes the run."""
    try:
        with transaction.atomic():
            FaultFiring.objects.create(run_id=run_id, task_key=task_key, point=point, mode=mode)
    except IntegrityError:
        return False
    return True
