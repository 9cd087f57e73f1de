from .execution import task_execute
from .fork import run_fork, run_fork_preview
from .leases import task_reserve
from .recovery import sweep_once
from .retry import task_retry_from, task_retry_from_preview, task_retry_preview
from .runs import (
    run_cancel,
    run_replay_start,
    run_resume,
    run_start,
    run_transition,
    task_retry,
    workflow_unknown,
)

__all__ = [
    "run_cancel",
    "run_fork",
    "run_fork_preview",
    "run_replay_start",
    "run_resume",
    "run_start",
    "run_transition",
    "sweep_once",
    "task_execute",
    "task_reserve",
    "task_retry",
    "task_retry_from",
    "task_retry_from_preview",
    "task_retry_preview",
    "workflow_unknown",
]
