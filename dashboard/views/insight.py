"""The insight page: how runs went over a period, drawn on the server as SVG (no script needed).

The filters are a plain GET form, so every view of the figures is a link that can be bookmarked."""

from django import forms
from django.contrib.auth.decorators import login_required
from django.shortcuts import render
from django.views.decorators.http import require_GET

from dashboard import charts
from runs.selectors.insight import (
    DEFAULT_DAYS,
    PERIODS,
    Insight,
    fmt_duration,
    fmt_usd,
    insight_choices,
    insight_compute,
)
from tenancy.access import project_ids


class InsightFilters(forms.Form):
    days = forms.TypedChoiceField(
        label="Period", coerce=int, required=False, empty_value=None, choices=[(d, f"last {d} days") for d in PERIODS]
    )
    workflow = forms.ChoiceField(label="Workflow", required=False)
    project = forms.ChoiceField(label="Project", required=False)
    grain = forms.ChoiceField(
        label="Cost over time", required=False, choices=[("day", "per day"), ("week", "per week")]
    )

    def __init__(self, *args, projects, workflows, **kwargs):
        super().__init__(*args, **kwargs)
        self.fields["workflow"].choices = [("", "all workflows"), *((w.slug, w.name or w.slug) for w in workflows)]
        self.fields["project"].choices = [("", "all projects"), *((p.slug, p.name or p.slug) for p in projects)]


@login_required
@require_GET
def insight(request):
    visible = project_ids(request.user, "view")
    projects, workflows = insight_choices(visible=visible)
    asked = InsightFilters(request.GET, projects=projects, workflows=workflows)
    asked.is_valid()  # a value not understood (or not visible to this user) is ignored, and said so
    chosen = {"days": DEFAULT_DAYS, "workflow": "", "project": "", "grain": "day"}
    chosen.update({k: v for k, v in asked.cleaned_data.items() if v not in (None, "")})
    data = insight_compute(
        visible=visible,
        projects=projects,
        workflows=workflows,
        days=chosen["days"],
        workflow_id=next((w.id for w in workflows if w.slug == chosen["workflow"]), None),
        project_id=next((p.id for p in projects if p.slug == chosen["project"]), None),
        grain=chosen["grain"],
    )
    context = {
        "filters": InsightFilters(initial=chosen, projects=projects, workflows=workflows),
        "filter_errors": asked.errors,
        "insight": data,
        "charts": _charts(data),
        "usage_agents": _usage_rows(data.usage.by_agent, data.usage.periods),
        "usage_models": _usage_rows(data.usage.by_model, data.usage.periods),
    }
    return render(request, "runs/insight.html", context)


def _percent(value: float) -> str:
    return f"{value:.3g} %"


def _charts(data: Insight) -> dict:
    return {**_per_day(data), **_distributions(data), **_rankings(data), **_usage(data)}


def _usage_rows(rows, periods) -> list[dict]:
    return [
        {"label": r.label, "calls": r.calls, "tokens": r.tokens, "cost_text": fmt_usd(r.cost_micros),
         "shown": [(tokens, cost, fmt_usd(cost)) for tokens, cost in r.series(periods)]}
        for r in rows
    ]  # fmt: skip


def _usage(data: Insight) -> dict:
    return {
        f"usage_{name}": charts.horizontal_bars(
            [(r.label, r.cost_micros) for r in rows],
            chart_id=f"chart-cost-by-{name[:-1]}",
            title=f"Cost by {name[:-1]}",
            x_label="cost of model calls (USD)",
            fmt=fmt_usd,
            integer=False,
            empty_text="No model call in this period",
        )
        for name, rows in (("agents", data.usage.by_agent), ("models", data.usage.by_model))
    }


def _per_day(data: Insight) -> dict:
    days = [(f.key.strftime("%b %d"), f) for f in data.by_day]
    return {
        "success": charts.bar_chart(
            [(d, None if f.success_rate is None else f.success_rate * 100) for d, f in days],
            chart_id="chart-success",
            title="Success rate per day",
            x_label="day the run was created",
            y_label="completed ÷ finished",
            fmt=_percent,
            top=100,
        ),
        "runs": charts.bar_chart(
            [(d, f.runs) for d, f in days],
            chart_id="chart-runs",
            title="Runs per day",
            x_label="day the run was created",
            y_label="runs",
            integer=True,
        ),
        "cost": charts.bar_chart(
            [(d, f.cost_micros) for d, f in days],
            chart_id="chart-cost",
            title="Cost per day",
            x_label="day the run was created",
            y_label="cost (USD)",
            fmt=fmt_usd,
            tick_fmt=lambda micros: f"${micros / 1_000_000:g}",
        ),
    }


def _distributions(data: Insight) -> dict:
    p95 = data.total.steps_p95
    waits = [
        (v, f"{name} = {fmt_duration(v)}") for name, v in (("p50", data.total.wait_p50), ("p95", data.total.wait_p95))
    ]
    return {
        "steps": charts.histogram(
            data.step_bins,
            chart_id="chart-steps",
            title="Steps per run",
            x_label="steps",
            y_label="runs",
            # An integer n spans [n, n + 1): the line sits where the runs beyond the p95 begin.
            marks=[] if p95 is None else [(p95 + 1, f"p95 = {p95:g} steps")],
            highlight_from=None if p95 is None else p95 + 1,
        ),
        "waits": charts.histogram(
            data.wait_bins,
            chart_id="chart-waits",
            title="Approval waits (requested → decided)",
            x_label="wait",
            y_label="requests",
            marks=[(v, label) for v, label in waits if v is not None],
            empty_text="No request was decided in this period",
        ),
    }


def _rankings(data: Insight) -> dict:
    return {
        "tools": charts.horizontal_bars(
            data.top_tools,
            chart_id="chart-tools",
            title="Top failing tools",
            x_label="operations failed, ambiguous or not compensated",
            empty_text="No tool operation failed in this period",
        ),
        "workflows": charts.horizontal_bars(
            [(g.label, g.success_rate * 100) for g in data.by_workflow if g.success_rate is not None],
            chart_id="chart-workflows",
            title="Success rate by workflow",
            x_label="completed ÷ finished",
            fmt=_percent,
            integer=False,
            top=100,
            empty_text="No run finished in this period",
        ),
        "agents": charts.horizontal_bars(
            data.top_agents,
            chart_id="chart-agents",
            title="Top failing agents",
            x_label="failed tasks",
            empty_text="No task failed in this period",
        ),
    }
