"""Insight over time: cost and tokens per agent and per model, per day and per week, and what failed
runs cost beside successful ones, on the page and through the API. Runs are real deploy-reviews driven
in this thread; only their creation day is moved back."""

import datetime as dt

import pytest
from django.db.models import Sum

from runs.models import Run, Span
from runs.selectors.insight import insight_choices, insight_compute, period_start
from runs.services import run_start
from tenancy.tokens import api_token_create
from tests.evals.test_eval_checks import confident  # noqa: F401  (the fixture)
from tests.runs.test_run_actions import drive


def _review(days_ago: int, status=None) -> Run:
    run = drive(run_start(workflow="deploy-review", input={"model_version": "confident"}))
    moved = period_start(1) - dt.timedelta(days=days_ago) + dt.timedelta(hours=1)
    Run.objects.filter(id=run.id).update(created_at=moved, **({"status": status} if status else {}))
    return Run.objects.get(id=run.id)


@pytest.fixture
def reviews(confident):  # noqa: F811
    return [_review(0), _review(0), _review(8, status=Run.Status.FAILED)]


def _calls(runs, **where):
    spans = Span.objects.filter(run__in=runs, kind=Span.Kind.MODEL_CALL, **where)
    totals = spans.aggregate(cost=Sum("cost_micros"), tin=Sum("tokens_in"), tout=Sum("tokens_out"))
    return totals["tin"] + totals["tout"], totals["cost"]


def test_cost_and_tokens_by_agent_and_model_per_day_and_week(reviews, operator):
    projects, workflows = insight_choices(visible=None)
    daily = insight_compute(visible=None, projects=projects, workflows=workflows, days=30).usage
    verifier = next(row for row in daily.by_agent if row.label == "verifier-agent")
    today, eight_days_ago = daily.periods[-1], daily.periods[-9]
    assert tuple(verifier.cells[today]) == _calls(reviews[:2], task__key="verify")
    assert tuple(verifier.cells[eight_days_ago]) == _calls(reviews[2:], task__key="verify")
    assert [row.label for row in daily.by_model] == ["scripted-1"]
    assert (daily.by_model[0].tokens, daily.by_model[0].cost_micros) == _calls(reviews)

    weekly = insight_compute(visible=None, projects=projects, workflows=workflows, days=30, grain="week").usage
    assert all(period.weekday() == 0 for period in weekly.periods) and len(weekly.periods) in (5, 6)
    assert sum(cost for _, cost in weekly.by_model[0].series(weekly.periods)) == _calls(reviews)[1]


def test_failed_runs_cost_beside_successful_ones_on_the_page_and_in_the_api(reviews, operator, client):
    client.force_login(operator)
    page = client.get("/insight/", {"grain": "week"}).content.decode()
    failed = reviews[2].cost_micros
    assert 'id="failed-cost"' in page and f"${failed / 1e6:.4f}" in page
    assert 'id="chart-cost-by-agent"' in page and 'id="usage-by-model"' in page and "per week" in page
    token = api_token_create(user=operator)[1]
    body = client.get("/api/v1/insight?grain=week", HTTP_AUTHORIZATION=f"Bearer {token}").json()
    assert body["total"]["failed_runs_cost_usd"] == failed / 1e6
    assert body["usage"]["grain"] == "week" and body["usage"]["by_model"][0]["name"] == "scripted-1"
    assert sum(p["cost_usd"] for p in body["usage"]["by_model"][0]["per_period"]) == pytest.approx(
        _calls(reviews)[1] / 1e6
    )
    assert client.get("/api/v1/insight?grain=month", HTTP_AUTHORIZATION=f"Bearer {token}").status_code == 422
