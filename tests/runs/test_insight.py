"""The insight page: figures over a period, scoped to the user's projects, drawn as escaped SVG."""

import datetime as dt
import re
from itertools import count

import pytest
from django.urls import reverse
from django.utils import timezone

from agents.models import Workflow
from dashboard import charts
from policy.models import ApprovalRequest
from runs.models import Run, Task
from runs.selectors.insight import (
    insight_choices,
    insight_compute,
    percentile,
    period_start,
    step_bins,
    step_width,
)
from runs.services import run_start
from tenancy.access import membership_grant, project_ids
from tenancy.models import Project
from tools.models import ToolOperation

EVIL = "<script>alert('owned')</script>"
URL = "/insight/"
keys = count()


def at(days_ago: int, hour: int = 1) -> dt.datetime:
    """A moment ``days_ago`` days before today (the start of today plus ``hour`` hours)."""
    return period_start(1) - dt.timedelta(days=days_ago) + dt.timedelta(hours=hour)


def make_run(workflow, *, status, days_ago=0, cost=0, steps=0, took=None, project=None) -> Run:
    run = run_start(workflow=workflow, project=project)
    created = at(days_ago)
    Run.objects.filter(id=run.id).update(
        status=status,
        created_at=created,
        started_at=created,
        finished_at=None if took is None else created + dt.timedelta(seconds=took),
        cost_micros=cost,
        steps_used=steps,
    )
    return run


def failing_op(run, tool, status=ToolOperation.Status.FAILED) -> ToolOperation:
    return ToolOperation.objects.create(
        gate="allow",
        run=run,
        tool=tool,
        idempotency_key=f"insight-{next(keys)}",
        arguments_hash="0" * 64,
        tool_class=ToolOperation.ToolClass.IDEMPOTENT_WRITE,
        status=status,
    )


def approval(run, status, waited=None, parent=None) -> ApprovalRequest:
    request = ApprovalRequest.objects.create(run=run, kind="operation", status=status, summary="s", parent=parent)
    requested = at(0)
    ApprovalRequest.objects.filter(id=request.id).update(
        requested_at=requested, decided_at=None if waited is None else requested + dt.timedelta(seconds=waited)
    )
    return request


@pytest.fixture
def known(demo, operator):
    """Six runs of the last three days in the default project, and one from 40 days ago.

    deploy-review: completed $0.10 5 steps 60 s · completed $0.30 5 steps 120 s · failed $0.20 7 steps 30 s
    incident-fanout: needs attention $0.40 40 steps · running 2 steps · cancelled 1 step 10 s
    """
    S = Run.Status
    runs = {
        "ok1": make_run("deploy-review", status=S.COMPLETED, cost=100_000, steps=5, took=60),
        "ok2": make_run("deploy-review", status=S.COMPLETED, cost=300_000, steps=5, took=120),
        "failed": make_run("deploy-review", status=S.FAILED, days_ago=1, cost=200_000, steps=7, took=30),
        "stuck": make_run("incident-fanout", status=S.NEEDS_ATTENTION, days_ago=1, cost=400_000, steps=40),
        "running": make_run("incident-fanout", status=S.RUNNING, steps=2),
        "cancelled": make_run("incident-fanout", status=S.CANCELLED, days_ago=2, steps=1, took=10),
        "old": make_run("deploy-review", status=S.COMPLETED, days_ago=40, cost=1_000_000, steps=3, took=5),
    }
    failing_op(runs["ok1"], "crm.update")
    failing_op(runs["ok1"], "crm.update")
    failing_op(runs["failed"], "email.send", ToolOperation.Status.AMBIGUOUS)
    failing_op(runs["stuck"], "crm.update", ToolOperation.Status.COMPENSATION_FAILED)
    failing_op(runs["ok2"], "tickets.create", ToolOperation.Status.COMMITTED)  # not a failure
    failing_op(runs["old"], "deployments.read")  # outside the period
    Task.objects.filter(run=runs["failed"], key="risk").update(status=Task.Status.FAILED)
    Task.objects.filter(run=runs["stuck"], key="plan").update(status=Task.Status.FAILED)
    approval(runs["ok1"], "approved", waited=30)
    approval(runs["ok2"], "approved", waited=90)
    bundle = approval(runs["failed"], "rejected", waited=600)
    approval(runs["failed"], "approved", waited=5000, parent=bundle)  # an item: its bundle counts
    approval(runs["running"], "pending")
    approval(runs["stuck"], "expired", waited=7200)
    return runs


def compute(user, **filters):
    visible = project_ids(user, "view")
    projects, workflows = insight_choices(visible=visible)
    return insight_compute(visible=visible, projects=projects, workflows=workflows, **filters)


# --- the figures -----------------------------------------------------------------------------------


def test_percentiles_are_nearest_rank():
    assert percentile([], 50) is None
    assert percentile([7], 95) == 7
    assert percentile([120, 10, 60, 30], 50) == 30 and percentile([10, 30, 60, 120], 95) == 120
    assert percentile(range(1, 21), 95) == 19 and percentile(range(1, 101), 95) == 95


def test_success_rate_counts_needs_attention_as_finished_and_not_successful(known, operator):
    total = compute(operator).total
    assert (total.runs, total.finished, total.completed) == (6, 5, 2)  # running is not finished; old is out
    assert total.success_rate == pytest.approx(0.4) and total.success_rate_text() == "40.0 %"


def test_cost_per_successful_run_spreads_the_cost_of_every_run(known, operator):
    total = compute(operator).total
    assert total.cost_micros == 1_000_000
    assert total.cost_per_success == 500_000 and total.cost_per_success_text() == "$0.5000"
    assert total.mean_success_cost == 200_000 and total.mean_success_cost_text() == "$0.2000"


def test_duration_percentiles_cover_runs_that_ended(known, operator):
    total = compute(operator).total
    assert sorted(total.durations) == [10, 30, 60, 120]  # needs attention and running have not ended
    assert (total.duration_p50, total.duration_p95) == (30, 120)
    assert total.duration_text() == "30 s / 2 min 0 s"


def test_steps_percentiles_and_breakdowns(known, operator):
    data = compute(operator)
    assert (data.total.steps_p50, data.total.steps_p95) == (5, 40)
    assert [(g.label, g.runs, g.finished, g.completed) for g in data.by_workflow] == [
        ("Deploy review", 3, 3, 2),
        ("Incident fan-out", 3, 2, 0),
    ]
    assert [g.label for g in data.by_project] == ["Default"] and data.by_project[0].runs == 6
    assert len(data.by_day) == 30 and data.by_day[-1].key == timezone.localdate()
    assert [(g.runs, g.completed, g.cost_micros) for g in data.by_day[-3:]] == [
        (1, 0, 0),
        (2, 0, 600_000),
        (3, 2, 400_000),
    ]
    assert data.by_day[-2].success_rate == 0 and data.by_day[-3].success_rate == 0
    assert data.by_day[0].success_rate is None  # no finished run that day: no bar, not a zero


def test_top_failing_tools_and_agents(known, operator):
    data = compute(operator)
    assert data.top_tools == [("crm.update", 3), ("email.send", 1)]
    assert data.top_agents == [("Incident supervisor", 1), ("Risk review", 1)]
    deploy, fanout = data.by_workflow
    assert (deploy.failed_operations, deploy.failed_tasks, fanout.failed_operations) == (3, 1, 1)


def test_approval_waits_of_decided_top_level_requests_with_pending_apart(known, operator):
    data = compute(operator)
    assert sorted(data.total.waits) == [30, 90, 600]
    assert (data.total.wait_p50, data.total.wait_p95) == (90, 600)
    assert data.total.pending_approvals == 1
    assert data.approvals == {"pending": 1, "approved": 2, "rejected": 1, "withdrawn": 0, "expired": 1}
    assert [b.count for b in data.wait_bins] == [1, 1, 1, 0, 0, 0, 0]


def test_the_period_and_the_filters(known, operator):
    ninety = compute(operator, days=90).total
    assert (ninety.runs, ninety.finished, ninety.completed, ninety.cost_micros) == (7, 6, 3, 2_000_000)
    assert compute(operator, days=7).total.runs == 6
    fanout = Workflow.objects.get(slug="incident-fanout")
    only = compute(operator, workflow_id=fanout.id)
    assert only.total.runs == 3 and only.top_tools == [("crm.update", 1)]


def test_steps_histogram_flags_the_runs_beyond_the_p95(demo, operator, client):
    runs = [make_run("deploy-review", status=Run.Status.COMPLETED, steps=n, took=1) for n in range(1, 20)]
    looping = make_run("deploy-review", status=Run.Status.NEEDS_ATTENTION, steps=60)
    data = compute(operator)
    assert data.total.steps_p95 == 19
    assert [(t.id, t.steps) for t in data.tail] == [(looping.id, 60)] and data.tail_count == 1
    bins = data.step_bins
    assert [b.label for b in bins[:2]] == ["0–4", "5–9"] and bins[-1].label == "60–64" and len(bins) == 13
    assert [b.count for b in bins] == [4, 5, 5, 5] + [0] * 8 + [1]
    assert runs  # the other runs stay under the line
    client.force_login(operator)
    html = client.get(URL).content.decode()
    assert f'href="{reverse("runs:detail", args=[looping.id])}"' in html
    svg = chart(html, "chart-steps")
    tail = [b for b in bars(svg) if b["class"] == "bar tail" and b["height"] != "0"]
    assert len(tail) == 1 and "<title>60–64: 1</title>" in svg and "p95 = 19 steps" in svg


def test_step_bins_widen_to_round_numbers():
    assert step_bins([]) == []
    assert [step_width(n) for n in (0, 19, 20, 39, 40, 99, 100, 1000)] == [1, 1, 2, 2, 5, 5, 10, 100]
    assert [(b.lo, b.hi, b.count) for b in step_bins([0, 0, 2])] == [(0, 1, 2), (1, 2, 0), (2, 3, 1)]


# --- the page --------------------------------------------------------------------------------------


def chart(html: str, chart_id: str) -> str:
    match = re.search(rf'<svg class="chart" id="{chart_id}".*?</svg>', html, re.S)
    assert match, f"no chart {chart_id}"
    return match.group(0)


def test_anonymous_users_are_sent_to_the_login_page(db, client):
    response = client.get(reverse("runs:insight"))
    assert response.status_code == 302 and response["Location"].startswith("/login/")


def test_the_page_draws_every_chart_without_inline_styles_or_scripts(known, operator, client):
    client.force_login(operator)
    response = client.get(reverse("runs:insight"), {"days": 30})
    assert response.status_code == 200
    html = response.content.decode()
    for chart_id in ("success", "runs", "cost", "steps", "waits", "tools", "agents", "workflows"):
        svg = chart(html, f"chart-{chart_id}")
        assert f'<title id="chart-{chart_id}-title">' in svg and 'class="axis-label"' in svg
    assert 'id="headline"' in html and "40.0 %" in html and "$0.5000" in html
    assert "<title>crm.update: 3</title>" in chart(html, "chart-tools")
    assert "style=" not in html
    assert all("src=" in tag for tag in re.findall(r"<script[^>]*>", html))  # no inline script
    csp = response.headers["Content-Security-Policy"]
    assert "style-src 'self'" in csp


def test_the_wide_tables_scroll_by_keyboard_and_are_named(known, operator, client):
    """A region that scrolls sideways must take focus so a keyboard can scroll it (WCAG 2.1.1; axe-core's
    scrollable-region-focusable found four on this page), and a focusable region needs a name."""
    client.force_login(operator)
    html = client.get(URL).content.decode()
    wrappers = re.findall(r'<div class="table-scroll"[^>]*>\s*<table[^>]*>\s*<caption>([^<]*)</caption>', html)
    tags = re.findall(r'<div class="table-scroll"[^>]*>', html)
    assert len(tags) == len(wrappers) >= 4
    for tag, caption in zip(tags, wrappers, strict=True):
        assert 'tabindex="0"' in tag and 'role="region"' in tag, tag
        label = re.search(r'aria-label="([^"]+)"', tag)
        assert label and caption.startswith(label.group(1)), (tag, caption)


def test_names_from_the_data_are_escaped_in_the_svg(known, operator, client):
    Workflow.objects.filter(slug="deploy-review").update(name=EVIL)
    failing_op(known["ok1"], EVIL)
    client.force_login(operator)
    html = client.get(URL).content.decode()
    assert EVIL not in html
    tools, workflows = chart(html, "chart-tools"), chart(html, "chart-workflows")
    assert "&lt;script&gt;alert(&#x27;owned&#x27;)&lt;/script&gt;" in tools
    assert "&lt;script&gt;" in workflows and "<script" not in tools + workflows


def test_the_filters_are_a_bookmarkable_get_form(known, operator, client):
    client.force_login(operator)
    html = client.get(URL, {"days": "90", "workflow": "incident-fanout"}).content.decode()
    assert re.search(r'<form method="get" action="/insight/"', html)
    assert '<option value="90" selected>' in html and '<option value="incident-fanout" selected>' in html
    assert re.search(r"<dt>Runs</dt><dd>3</dd>", html)
    bad = client.get(URL, {"days": "1000", "project": "nowhere"}).content.decode()
    assert "is ignored" in bad and '<option value="30" selected>' in bad
    assert re.search(r"<dt>Runs</dt><dd>6</dd>", bad)


# --- who sees what ---------------------------------------------------------------------------------


@pytest.fixture
def secret(known):
    """A completed run in a project the operator is not a member of, of a workflow only it uses."""
    project = Project.objects.create(slug="secret", name="Secret project")
    Workflow.objects.create(
        slug="secret-flow",
        name="Hush workflow",
        project=project,
        tasks=[{"key": "only", "agent": "inventory-agent", "objective": "Hush"}],
    )
    run = make_run("secret-flow", status=Run.Status.COMPLETED, cost=9_000_000, steps=500, took=1)
    failing_op(run, "hush.tool")
    return run


def test_runs_of_other_projects_never_count_nor_show(secret, operator, client):
    client.force_login(operator)
    html = client.get(URL).content.decode()
    assert "Hush workflow" not in html and "Secret project" not in html and "hush.tool" not in html
    assert re.search(r"<dt>Runs</dt><dd>6</dd>", html) and "40.0 %" in html
    asked = client.get(URL, {"project": "secret", "workflow": "secret-flow"}).content.decode()
    assert "Hush workflow" not in asked and re.search(r"<dt>Runs</dt><dd>6</dd>", asked)


def test_an_outsider_sees_empty_figures(secret, client, django_user_model):
    outsider = django_user_model.objects.create_user(username="otto", password="otto-pass-123")
    membership_grant(user=outsider, project=Project.objects.create(slug="other", name="Other"), role="admin")
    client.force_login(outsider)
    html = client.get(URL).content.decode()
    assert re.search(r"<dt>Runs</dt><dd>0</dd>", html)
    for name in ("Hush workflow", "Deploy review", "Incident fan-out", "crm.update", "Secret project"):
        assert name not in html
    assert "No tool operation failed in this period" in html and "No task failed in this period" in html


def test_a_superuser_sees_every_project(secret, client, django_user_model):
    root = django_user_model.objects.create_superuser(username="root", password="root-pass-123")
    client.force_login(root)
    html = client.get(URL).content.decode()
    assert re.search(r"<dt>Runs</dt><dd>7</dd>", html) and "Hush workflow" in html


# --- cost ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("n", [5, 50])
def test_the_page_costs_the_same_queries_for_5_and_50_runs(demo, operator, client, n, django_assert_num_queries):
    workflows = ["deploy-review", "incident-fanout"]
    for i in range(n):
        run = make_run(workflows[i % 2], status=Run.Status.COMPLETED, days_ago=i % 9, cost=1000, steps=i, took=i)
        failing_op(run, f"tool-{i % 3}")
        approval(run, "approved", waited=i)
        Task.objects.filter(run=run).update(status=Task.Status.FAILED)
    client.force_login(operator)
    # session, user, memberships, projects, workflows; runs grouped, runs' percentiles, operations,
    # tasks, approval requests; the nav's one (what this person may open anywhere)
    with django_assert_num_queries(12):  # the sixth of insight_compute: cost and tokens by agent and model
        response = client.get(URL, {"days": 30})
    assert re.search(rf"<dt>Runs</dt><dd>{n}</dd>", response.content.decode())


# --- the chart helpers -----------------------------------------------------------------------------


def test_nice_scale():
    assert charts.nice_scale(0) == (1, 0.25) and charts.nice_scale(0, integer=True) == (1, 1)
    assert charts.nice_scale(None) == (1, 0.25) and charts.nice_scale(float("nan")) == (1, 0.25)
    assert charts.nice_scale(7, integer=True) == (8, 2)
    assert charts.nice_scale(1, integer=True) == (1, 1)
    assert charts.nice_scale(100) == (100, 25)
    assert charts.nice_scale(1_000_000) == (1_000_000, 250_000)
    assert charts.nice_scale(0.3) == (0.3, 0.1) and charts.nice_scale(0.31) == (0.4, 0.1)


def bars(svg: str) -> list[dict]:
    return [dict(re.findall(r'(\w+)="([^"]*)"', tag)) for tag in re.findall(r"<rect [^>]*>", svg)]


def test_bar_chart_with_all_zero_data_still_has_an_axis():
    svg = charts.bar_chart([("a", 0), ("b", 0)], chart_id="z", title="Zero", x_label="x", y_label="y")
    assert [b["height"] for b in bars(svg)] == ["0", "0"]
    assert "nan" not in svg.lower() and "inf" not in svg.lower()
    assert svg.count('class="grid"') == 5 and ">0.25<" in svg  # 0 to 1 by a quarter


def test_bar_chart_with_a_single_value_and_missing_values():
    svg = charts.bar_chart([("a", 5), ("b", None)], chart_id="one", title="One", x_label="x", y_label="y")
    (only,) = bars(svg)
    assert float(only["height"]) == pytest.approx(174 * 5 / 6, abs=0.1)  # axis to 6, plot height 174
    assert "<title>a: 5</title>" in svg and "<title>b:" not in svg
    full = charts.bar_chart([("a", 100)], chart_id="p", title="P", x_label="x", y_label="y", top=100)
    assert float(bars(full)[0]["height"]) == 174


def test_charts_without_data_say_so():
    assert "No data in this period" in charts.bar_chart([], chart_id="e", title="E", x_label="x", y_label="y")
    assert "Nothing here" in charts.histogram([], chart_id="h", title="H", x_label="x", empty_text="Nothing here")
    assert "Nothing in this period" in charts.horizontal_bars([], chart_id="b", title="B", x_label="x")


def test_histogram_marks_and_tail():
    bins = [charts.Bin(lo=i, hi=i + 1, count=c, label=str(i)) for i, c in enumerate([3, 0, 1, 1])]
    svg = charts.histogram(bins, chart_id="h", title="H", x_label="steps", marks=[(2, "p95")], highlight_from=2)
    assert svg.count('class="bar tail"') == 2 and svg.count('class="bar"') == 2
    width = (charts.WIDTH - charts.LEFT - charts.RIGHT) / 4
    x = re.search(r'<line class="mark" x1="([\d.]+)"', svg).group(1)
    assert float(x) == pytest.approx(charts.LEFT + 2 * width, abs=0.1)
    open_ended = [charts.Bin(0, 60, 1, "< 1 min"), charts.Bin(60, None, 1, "≥ 1 min")]
    svg = charts.histogram(open_ended, chart_id="w", title="W", x_label="wait", marks=[(5000, "p95")])
    x = float(re.search(r'<line class="mark" x1="([\d.]+)"', svg).group(1))
    assert x == pytest.approx(charts.LEFT + 1.5 * (charts.WIDTH - charts.LEFT - charts.RIGHT) / 2, abs=0.1)


def test_horizontal_bars_escape_and_shorten_labels():
    long = "a-very-long-tool-name-that-goes-on-and-on"
    svg = charts.horizontal_bars([(EVIL, 2), (long, 1)], chart_id="t", title="T & more", x_label="failures")
    assert EVIL not in svg and "&lt;script&gt;" in svg and "T &amp; more" in svg
    assert f"<title>{long}: 1</title>" in svg and ">a-very-long-tool-name-tha…<" in svg
    widths = [float(b["width"]) for b in bars(svg)]
    assert widths[0] == pytest.approx(2 * widths[1])
