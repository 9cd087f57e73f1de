"""Budgets are held before spending: each model call's worst case (the whole prompt and the output
ceiling) is reserved against the task's and the run's budgets in one atomic step before the call, and
settled to the real figures after. Siblings racing for one budget never spend past it."""

import pytest

from agents.models import Agent, Workflow
from runs.models import Run, Span, Task
from runs.services import run_start
from tests.runs.test_engine import finished

LONG_ANSWER = {"text": "x" * 4000}  # cut at the output ceiling: each call costs about its worst case


def siblings(n: int, *, delay: float = 0.2) -> Workflow:
    agent = Agent.objects.create(
        slug="sibling",
        name="sibling",
        script=[{"delay": delay, "final": LONG_ANSWER}],
        output_schema={"type": "object"},
    )
    tasks = [{"key": f"s{i:02}", "agent": agent.slug, "objective": "Answer"} for i in range(n)]
    return Workflow.objects.create(slug="siblings", name="siblings", tasks=tasks)


@pytest.fixture
def ceiling(settings):
    settings.WARDEN = {**settings.WARDEN, "SCRIPTED_MAX_OUTPUT_TOKENS": 1000, "BUDGET_WAIT_SECONDS": 10}
    return 1000


def test_twenty_siblings_racing_for_a_budget_of_five_calls_never_spend_past_it(transactional_db, ceiling, worker):
    wf = siblings(20)
    budget = 5 * (ceiling + 100)  # five calls with prompts under 400 characters, not six
    run = finished(run_start(workflow=wf.slug, budget={"max_tokens": budget}), timeout=90)
    calls = Span.objects.filter(run=run, kind=Span.Kind.MODEL_CALL)
    assert run.tokens_used <= budget
    # Every call made is counted, and exactly the five that fit were made: the others were refused before.
    assert calls.count() == 5
    assert run.tokens_used == sum(s.tokens_in + s.tokens_out for s in calls)
    assert run.status == Run.Status.NEEDS_ATTENTION
    assert "budget exceeded: tokens" in run.status_reason and "for the next call" in run.status_reason
    refused = run.tasks.filter(status=Task.Status.FAILED, failure_class="budget")
    assert refused.exists() and not calls.filter(task__in=refused).exists()
    assert not run.tasks.exclude(tokens_reserved=0).exists()  # every hold settled or dropped


def test_a_call_that_would_not_fit_alone_is_never_made(transactional_db, ceiling, worker):
    wf = siblings(1, delay=0)
    run = finished(run_start(workflow=wf.slug, budget={"max_cost_usd": 0.001}))  # 1000 µ$ < 4000 µ$ of output
    assert run.status == Run.Status.NEEDS_ATTENTION
    assert run.status_reason.startswith("run budget exceeded: cost_usd (0.000000 used + up to 0.004")
    assert not Span.objects.filter(run=run, kind=Span.Kind.MODEL_CALL).exists()
    assert (run.tokens_used, run.cost_micros) == (0, 0)
