"""The evaluations' actor: safe to receive a message twice (a graded result is not graded again)."""

import dramatiq

from runs.actors import TIME_LIMIT_MS

from .judge import eval_grade
from .suites import GRADE


@dramatiq.actor(actor_name=GRADE, queue_name="warden", max_retries=0, time_limit=TIME_LIMIT_MS)
def grade_eval_result(result_id: int) -> None:
    """An evaluation case's judge checks: a model grades its run's artifact (evals/judge.py)."""
    eval_grade(result_id)
