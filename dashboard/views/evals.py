"""Reference evaluations: the suites of my projects, and per suite its latest evaluation runs side by side
(success, cost, steps, duration, and each case's verdict), each beside the latest single-agent baseline,
with a form to run it again for a version or on the baseline workflows. GET only reads."""

from django import forms
from django.contrib.auth.decorators import login_required
from django.http import HttpResponseBadRequest
from django.shortcuts import redirect, render
from django.views.decorators.http import require_GET, require_POST

from agents.models import ModelVersion
from core.errors import WardenError
from dashboard.insight import fmt_duration, fmt_usd
from runs.evals import comparison, eval_start
from runs.models import EvalSuite
from tenancy.access import visible_rows

from .common import authorized


class EvalStartForm(forms.Form):
    version = forms.ModelChoiceField(
        queryset=ModelVersion.objects.all(), required=False, empty_label="current agents", label="Version"
    )
    baseline = forms.BooleanField(required=False, label="on the single-agent baseline workflows")


def _times(value: float | None) -> str:
    return "—" if value is None else f"×{value:.2f}"


def _suite(request, suite_id: int, action: str) -> EvalSuite:
    suite = EvalSuite.objects.select_related("project").filter(id=suite_id).first()
    return authorized(request, suite, action, what=f"evaluation suite {suite_id}")


@login_required
@require_GET
def eval_list(request):
    suites = visible_rows(EvalSuite.objects.select_related("project").prefetch_related("cases"), request.user)
    return render(request, "runs/evals.html", {"suites": suites})


@login_required
@require_GET
def eval_suite(request, suite_id: int):
    suite = _suite(request, suite_id, "view")
    cases, columns = comparison(suite)
    rows = [{"case": case, "cells": [column.cells.get(case.id) for column in columns]} for case in cases]
    # Each version beside the latest single-agent baseline shown (seed 003: did the fan-out pay?).
    base = next((column for column in reversed(columns) if column.eval_run.baseline), None)
    summary = []
    for column in columns:
        against = column.against(base) if base is not None and not column.eval_run.baseline else None
        summary.append(
            {
                "column": column,
                "success": None if column.success is None else round(column.success * 100),
                "cost": fmt_usd(column.mean(column.cost_micros)) if column.judged else "—",
                "steps": f"{column.mean(column.steps):.1f}" if column.judged else "—",
                "duration": fmt_duration(column.mean(column.seconds)) if column.judged else "—",
                "against": against
                and {
                    "cost": _times(against["cost"]),
                    "steps": _times(against["steps"]),
                    "duration": _times(against["duration"]),
                    "success": f"{against['success']:+d} points",
                },
            }
        )
    context = {
        "suite": suite,
        "rows": rows,
        "summary": summary,
        "base": base,
        "has_baseline": suite.cases.filter(baseline_workflow__isnull=False).exists(),
        "going": sum(column.going for column in columns),
        "form": EvalStartForm(),
    }
    return render(request, "runs/eval_suite.html", context)


@login_required
@require_POST
def eval_run(request, suite_id: int):
    suite = _suite(request, suite_id, "start")
    form = EvalStartForm(request.POST)
    if not form.is_valid():
        return redirect("runs:eval-suite", suite_id=suite.id)
    version, baseline = form.cleaned_data["version"], form.cleaned_data["baseline"]
    try:
        eval_start(suite=suite, version=version, user=request.user, baseline=baseline, via="page")
    except WardenError as exc:  # a case that cannot start (its workflow changed): nothing started
        return HttpResponseBadRequest(f"the evaluation could not start: {exc}")
    return redirect("runs:eval-suite", suite_id=suite.id)
