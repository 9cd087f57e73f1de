from .execution import task_execute
from .leases import task_reserve
from .recovery import sweep_once
from .runs import run_cancel, run_resume, run_start, run_transition, task_retry

__all__ = [
    "run_cancel",
    "run_resume",
    "run_start",
    "run_transition",
    "sweep_once",
    "task_execute",
    "task_reserve",
    "task_retry",
]
