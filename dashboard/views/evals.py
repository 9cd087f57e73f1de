"""Reference evaluations: the suites of my projects, and per suite its latest evaluation runs side by side
(success, cost, steps, duration, and each case's verdict), each beside the latest single-agent baseline,
with a form to run it again for a version or on the baseline workflows. GET only reads."""

from django import forms
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.http import HttpResponseBadRequest
from django.shortcuts import redirect, render
from django.urls import reverse
from django.views.decorators.http import require_GET, require_http_methods, require_POST

from agents.models import ModelVersion
from core.errors import InvalidInput, WardenError
from dashboard import charts
from dashboard.trace import TASKS_DRAWN
from evals.compare import FIGURES, comparison, history
from evals.models import EvalSuite
from evals.suites import annotation_create, eval_case_from_run, eval_start, eval_suite_create
from runs.models import Artifact, Task
from runs.selectors.insight import fmt_duration, fmt_usd
from tenancy.access import role_of, visible_rows
from tenancy.audit import audit
from tenancy.models import Project

from .common import authorized, run_for_view

HISTORY = 10  # the passes each chart shows


class EvalStartForm(forms.Form):
    version = forms.ModelChoiceField(
        queryset=ModelVersion.objects.all(), required=False, empty_label="current agents", label="Version"
    )
    baseline = forms.BooleanField(required=False, label="on the single-agent baseline workflows")


class EvalSuiteNewForm(forms.Form):
    """A new, empty suite (cases come from runs, the API or the admin); the service checks it again."""

    name = forms.CharField(max_length=200)
    slug = forms.SlugField(max_length=64, help_text="Its name for run_evals and the API: letters, digits, - and _")
    project = forms.ModelChoiceField(queryset=Project.objects.none(), empty_label=None)
    description = forms.CharField(required=False, max_length=4000, widget=forms.Textarea(attrs={"rows": 2}))
    rerun_on = forms.CharField(
        required=False,
        max_length=4000,
        label="Run again on a new version of",
        help_text="One per line: agent:<slug>, workflow:<slug> or policy:<name>",
        widget=forms.Textarea(attrs={"rows": 2}),
    )

    def __init__(self, *args, projects, **kwargs):
        super().__init__(*args, **kwargs)
        self.fields["project"].queryset = projects

    def clean_rerun_on(self) -> list[str]:
        return [line.strip() for line in self.cleaned_data["rerun_on"].splitlines() if line.strip()]


def _times(value: float | None) -> str:
    return "—" if value is None else f"×{value:.2f}"


def _suite(request, suite_id: int, action: str) -> EvalSuite:
    suite = EvalSuite.objects.select_related("project").filter(id=suite_id).first()
    return authorized(request, suite, action, what=f"evaluation suite {suite_id}")


@login_required
@require_GET
def eval_list(request):
    suites = visible_rows(EvalSuite.objects.select_related("project").prefetch_related("cases"), request.user)
    may_create = visible_rows(Project.objects.all(), request.user, field="id", action="administer").exists()
    return render(request, "runs/evals.html", {"suites": suites, "may_create": may_create})


@login_required
@require_http_methods(["GET", "POST"])
def eval_new(request):
    """Create a suite in one of the projects the person administers (403 for anyone who administers none)."""
    projects = visible_rows(Project.objects.order_by("slug"), request.user, field="id", action="administer")
    if not projects.exists():
        audit(actor=request.user, action="denied:administer", target="a new evaluation suite", outcome="denied",
              detail={"why": "administers no project"}, request=request)  # fmt: skip
        raise PermissionDenied("only a project's admin may create its evaluation suites")
    form = EvalSuiteNewForm(request.POST if request.method == "POST" else None, projects=projects)
    if form.is_valid():
        data = form.cleaned_data  # the project is one of those they administer: the field offers only those
        try:
            suite = eval_suite_create(project=data["project"], slug=data["slug"], name=data["name"],
                                      description=data["description"], rerun_on=data["rerun_on"],
                                      user=request.user, via="page")  # fmt: skip
        except InvalidInput as exc:
            for error in exc.errors or [{"field": None, "message": str(exc)}]:
                form.add_error(error["field"] if error["field"] in form.fields else None, error["message"])
        else:
            return redirect("runs:eval-suite", suite_id=suite.id)
    return render(request, "runs/eval_new.html", {"form": form}, status=400 if form.errors else 200)


@login_required
@require_GET
def eval_suite(request, suite_id: int):
    suite = _suite(request, suite_id, "view")
    cases, columns = comparison(suite)
    quarantine = list(suite.quarantine.all())
    known = {case.id for case in quarantine}
    rows = [
        {"case": case, "cells": [column.cells.get(case.id) for column in columns], "quarantined": case.id in known}
        for case in cases
    ]
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
                "score": "—" if column.mean_score is None else f"{column.mean_score:.2f}",
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
        "quarantine": quarantine,
        "charts": _history_charts(suite),
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


def _history_charts(suite: EvalSuite) -> list:
    """One bar chart per figure across the suite's last passes (oldest first)."""
    figures = history(suite, last=HISTORY)
    labels = [label.split(" ", 1)[0] for label in figures["labels"]]  # "#12": the full label is in the table
    units = {"success": 100, "judge_score": 1}
    return [
        charts.bar_chart(
            list(zip(labels, figures["series"][name], strict=True)),
            chart_id=f"chart-eval-{name.replace('_', '-')}",
            title=f"{title}, last {len(labels)} passes",
            x_label="evaluation run",
            y_label=title,
            fmt=lambda v: f"{v:.4g}",
            top=units.get(name),
            empty_text="Not run yet",
        )
        for name, title in FIGURES
    ]


class AnnotationForm(forms.Form):
    target = forms.CharField(max_length=40)  # "run", "task:<id>", "artifact:<id>" or "span:<id>"
    score = forms.FloatField(required=False, min_value=0, max_value=1)
    comment = forms.CharField(required=False, max_length=4000, widget=forms.Textarea(attrs={"rows": 2}))


def reviews_context(request, run) -> dict:
    """The run page's reviews panel: its annotations, and the suites it could become a case of."""
    suites = visible_rows(EvalSuite.objects.filter(project_id=run.project_id), request.user, action="curate")
    tasks, artifacts = Task.objects.filter(run_id=run.id).order_by("id"), Artifact.objects.filter(run_id=run.id)
    return {
        "annotations": list(run.annotations.select_related("author")),
        "may_annotate": role_of(request.user, run.project_id) in ("reviewer", "admin"),
        "suites": list(suites),
        # As many as the page draws (a run may have 10,000 tasks); the API annotates any of them.
        "targets": [("run", f"the run {run.id}")]
        + [(f"task:{id}", f"task {key}") for id, key in tasks.values_list("id", "key")[:TASKS_DRAWN]]
        + [
            (f"artifact:{id}", f"artifact {key} v{version}")
            for id, key, version in artifacts.order_by("-id").values_list("id", "key", "version")[:TASKS_DRAWN]
        ],
    }


@login_required
@require_POST
def run_annotate(request, run_id: int):
    run = run_for_view(request, run_id, "decide")
    form = AnnotationForm(request.POST)
    target, _, target_id = request.POST.get("target", "run").partition(":")
    try:
        if not form.is_valid():
            raise InvalidInput("; ".join(f"{k}: {' '.join(v)}" for k, v in form.errors.items()))
        annotation_create(run=run, target=target, target_id=int(target_id) if target_id.isdigit() else None,
                          score=form.cleaned_data["score"], comment=form.cleaned_data["comment"] or "",
                          user=request.user, via="page")  # fmt: skip
    except InvalidInput as exc:
        return HttpResponseBadRequest(f"the annotation was not recorded: {exc}")
    return redirect(reverse("runs:detail", args=[run.id]) + "#reviews")


@login_required
@require_POST
def run_to_case(request, run_id: int):
    """Add the run to a suite as a new case expecting its outcome (the reviewers' scores say which artifacts)."""
    run = run_for_view(request, run_id)
    suite_id = request.POST.get("suite", "")
    suite = _suite(request, int(suite_id) if suite_id.isdigit() else 0, "curate")
    name = request.POST.get("name", "").strip() or f"as run {run.id} ended"
    try:
        eval_case_from_run(suite=suite, run=run, name=name, user=request.user, via="page")
    except InvalidInput as exc:
        return HttpResponseBadRequest(f"the case was not added: {exc}")
    return redirect("runs:eval-suite", suite_id=suite.id)
