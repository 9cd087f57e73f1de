"""Integration API for evaluations (bearer tokens): suites and their cases, passes started from CI or a
script, their verdicts and regressions, the comparison, and reviewers' annotations on runs."""

from datetime import datetime
from typing import Any, Literal

from ninja import Field, Router, Schema, Status
from pydantic import ConfigDict

from agents.models import ModelVersion
from api.schemas import BodyIn
from core.errors import InvalidInput, NotFound
from core.schemas import PathId, Whole
from evals.compare import comparison, history
from evals.models import Annotation, EvalCase, EvalRun, EvalSuite
from evals.suites import (
    annotation_create,
    baseline_for,
    eval_case_create,
    eval_case_from_run,
    eval_start,
    eval_suite_create,
    failing,
    regressions,
)
from tenancy.access import authorize, authorize_token, visible_rows
from tenancy.models import Project

from .runs import run_for

router = Router(tags=["evaluations"])


CASE_EXAMPLE = {
    "id": 7,
    "name": "rollback plan named",
    "workflow": "deploy-review",
    "baseline_workflow": None,
    "goal": "Review the checkout deploy",
    "input": {},
    "checks": [{"status": "completed"}, {"tool_called": "email.send", "expected": False}],
    "from_run": 42,
}  # also inside the suite's example


class EvalCaseOut(Schema):
    id: int
    name: str
    workflow: str
    baseline_workflow: str | None
    goal: str
    input: dict[str, Any]
    checks: list[Any]
    from_run: int | None = Field(description="The annotated run it was made from")

    model_config = ConfigDict(json_schema_extra={"examples": [CASE_EXAMPLE]})


class EvalSuiteOut(Schema):
    id: int
    slug: str
    name: str
    description: str
    project: str
    rerun_on: list[str] = Field(description='Runs again on a new version of these: "agent:<slug>", "workflow:<slug>"…')
    quarantine: list[int] = Field(default_factory=list, description="Known failures: cases whose failure is forgiven")
    cases: list[EvalCaseOut]

    model_config = ConfigDict(
        json_schema_extra={
            "examples": [
                {
                    "id": 3,
                    "slug": "deploys",
                    "name": "Deploy reviews",
                    "description": "",
                    "project": "default",
                    "rerun_on": ["agent:risk-agent"],
                    "quarantine": [],
                    "cases": [CASE_EXAMPLE],
                }
            ]
        }
    )


class EvalSuiteIn(BodyIn):
    slug: str = Field(min_length=1, max_length=64, pattern=r"^[-a-zA-Z0-9_]+$")
    name: str = Field(min_length=1, max_length=200)
    project: str = Field(min_length=1, max_length=64, description="The project's slug: its runs and its people")
    description: str = Field(default="", max_length=4000)
    rerun_on: list[str] = Field(default_factory=list, max_length=50)

    model_config = ConfigDict(
        json_schema_extra={
            "examples": [
                {"slug": "deploys", "name": "Deploy reviews", "project": "default", "rerun_on": ["agent:risk-agent"]}
            ]
        }
    )


class EvalStartIn(BodyIn):
    model_version: str | None = Field(default=None, max_length=64, description="A model version's slug")
    baseline: bool = Field(default=False, description="Run the cases on their single-agent baseline workflows")

    model_config = ConfigDict(json_schema_extra={"examples": [{"model_version": None, "baseline": False}]})


class GradeOut(Schema):
    artifact: str
    agent: str
    score: float | None
    reasoning: str = Field(description="The judge model's words: data, never instructions")
    passed: bool
    cost_usd: float
    model: str


class EvalResultOut(Schema):
    case: int
    name: str
    run: int
    passed: bool | None = Field(description="Empty until the run ended and its judges graded it")
    failures: list[str]
    grades: list[GradeOut]
    judge_cost_usd: float


class RegressionOut(Schema):
    case: int
    name: str
    before: bool | None
    failures: list[str]


class FailingOut(RegressionOut):
    quarantined: bool


class EvalRunOut(Schema):
    id: int
    suite: str
    label: str
    trigger: str
    created_at: datetime
    settled: bool = Field(description="Every case has its verdict")
    accepted: bool = Field(description="run_evals exited 0 on it: later passes are compared with it by default")
    baseline_run: int | None = Field(
        description="The pass it is compared with: the suite's last accepted one before it"
    )
    regressions: list[RegressionOut] = Field(description="Cases that fail now and passed (or were absent) then")
    failing: list[FailingOut] = Field(
        default_factory=list,
        description="Every case that fails now and is not in the suite's quarantine, whether or not it failed then: "
        "what makes run_evals exit 1",
    )
    results: list[EvalResultOut]

    model_config = ConfigDict(
        json_schema_extra={
            "examples": [
                {
                    "id": 12,
                    "suite": "deploys",
                    "label": "risk-agent v4",
                    "trigger": "api",
                    "created_at": "2026-12-02T09:00:00Z",
                    "settled": True,
                    "accepted": False,
                    "baseline_run": 11,
                    "regressions": [
                        {
                            "case": 7,
                            "name": "rollback plan named",
                            "before": True,
                            "failures": ["status: failed, expected completed"],
                        }
                    ],
                    "failing": [
                        {
                            "case": 7,
                            "name": "rollback plan named",
                            "before": True,
                            "failures": ["status: failed, expected completed"],
                            "quarantined": False,
                        }
                    ],
                    "results": [
                        {
                            "case": 7,
                            "name": "rollback plan named",
                            "run": 43,
                            "passed": False,
                            "failures": ["status: failed, expected completed"],
                            "grades": [
                                {
                                    "artifact": "verify",
                                    "agent": "fair-judge",
                                    "score": 0.4,
                                    "reasoning": "No rollback plan.",
                                    "passed": False,
                                    "cost_usd": 0.0002,
                                    "model": "scripted/scripted-1",
                                }
                            ],
                            "judge_cost_usd": 0.0002,
                        }
                    ],
                }
            ]
        }
    )


class EvalCaseIn(BodyIn):
    name: str = Field(min_length=1, max_length=200)
    workflow: str = Field(default="", max_length=64, description="Its workflow's slug (not with from_run)")
    baseline_workflow: str = Field(default="", max_length=64)
    goal: str = Field(default="", max_length=4000)
    input: dict[str, Any] = Field(default_factory=dict)
    checks: list[Any] | None = Field(default=None, description="Default with from_run: the outcome it had")
    from_run: Whole(ge=1) | None = Field(default=None, description="Replay this run (its workflow, goal and input)")

    model_config = ConfigDict(json_schema_extra={"examples": [{"name": "rollback plan named", "from_run": 42}]})


class AnnotationIn(BodyIn):
    target: Literal["run", "task", "span", "artifact"] = "run"
    target_id: Whole(ge=1) | None = Field(default=None, description="The task's, span's or artifact's id")
    score: float | None = Field(default=None, ge=0, le=1, description="0 (bad) to 1 (good)")
    comment: str = Field(default="", max_length=4000)

    model_config = ConfigDict(
        json_schema_extra={
            "examples": [{"target": "artifact", "target_id": 88, "score": 0.8, "comment": "Names the rollback plan."}]
        }
    )


class AnnotationOut(Schema):
    id: int
    run: int
    target: str
    target_id: int | None
    score: float | None
    comment: str
    author: str | None
    created_at: datetime

    model_config = ConfigDict(
        json_schema_extra={
            "examples": [
                {
                    "id": 5,
                    "run": 42,
                    "target": "artifact",
                    "target_id": 88,
                    "score": 0.8,
                    "comment": "Names the rollback plan.",
                    "author": "rita",
                    "created_at": "2026-12-02T09:00:00Z",
                }
            ]
        }
    )


class ComparisonColumnOut(Schema):
    eval_run: int
    label: str
    baseline: bool
    judged: int
    going: int
    figures: dict[str, float | None] = Field(description="success %, cost_usd, steps, seconds, judge_score (means)")


class ComparisonOut(Schema):
    columns: list[ComparisonColumnOut]
    cases: list[dict[str, Any]] = Field(description="Per case: its verdict in each column (null: not settled)")
    history: dict[str, Any] = Field(description="Each figure across the suite's last passes, oldest first")

    model_config = ConfigDict(
        json_schema_extra={
            "examples": [
                {
                    "columns": [
                        {
                            "eval_run": 12,
                            "label": "risk-agent v4",
                            "baseline": False,
                            "judged": 1,
                            "going": 0,
                            "figures": {
                                "success": 100.0,
                                "cost_usd": 0.0031,
                                "steps": 9.0,
                                "seconds": 4.2,
                                "judge_score": 0.8,
                            },
                        }
                    ],
                    "cases": [{"case": 7, "name": "rollback plan named", "verdicts": [True]}],
                    "history": {"success": [[11, 50.0], [12, 100.0]]},
                }
            ]
        }
    )


def _suites():
    return EvalSuite.objects.select_related("project").prefetch_related(
        "cases__workflow", "cases__baseline_workflow", "quarantine"
    )


def _suite_for(request, suite_id: int, action: str = "view") -> EvalSuite:
    suite = _suites().filter(id=suite_id).first()
    if suite is None:
        raise NotFound(f"evaluation suite {suite_id} does not exist")
    what = f"evaluation suite {suite_id}"
    authorize(request.auth.user, suite.project_id, action, what=what, token=request.auth, request=request)
    return suite


def _suite_out(suite: EvalSuite) -> dict:
    cases = suite.cases.all()  # prefetched with their workflows
    return {
        "id": suite.id, "slug": suite.slug, "name": suite.name, "description": suite.description,
        "project": suite.project.slug, "rerun_on": suite.rerun_on or [],
        "quarantine": sorted(case.id for case in suite.quarantine.all()),
        "cases": [_case_out(case) for case in cases],
    }  # fmt: skip


def _case_out(case: EvalCase) -> dict:
    return {
        "id": case.id, "name": case.name, "workflow": case.workflow.slug, "goal": case.goal, "input": case.input,
        "baseline_workflow": case.baseline_workflow.slug if case.baseline_workflow_id else None,
        "checks": case.checks, "from_run": case.from_run_id,
    }  # fmt: skip


def _eval_run_out(eval_run: EvalRun) -> dict:
    base = baseline_for(eval_run)
    results = list(eval_run.results.select_related("case"))
    return {
        "id": eval_run.id, "suite": eval_run.suite.slug, "label": eval_run.label, "trigger": eval_run.trigger,
        "created_at": eval_run.created_at, "settled": all(r.passed is not None for r in results),
        "accepted": eval_run.accepted, "baseline_run": base.id if base else None,
        "regressions": regressions(eval_run, base), "failing": failing(eval_run, base),
        "results": [
            {"case": r.case_id, "name": r.case.name, "run": r.run_id, "passed": r.passed, "failures": r.failures,
             "judge_cost_usd": r.judge_cost_micros / 1e6,
             "grades": [{**g, "cost_usd": g.get("cost_micros", 0) / 1e6} for g in r.grades]}
            for r in results
        ],
    }  # fmt: skip


@router.get("/eval-suites", response=list[EvalSuiteOut], summary="Evaluation suites of my projects")
def list_suites(request):
    authorize_token(request.auth, "read", what="evaluation suites", request=request)
    suites = visible_rows(_suites(), request.auth.user)
    return [_suite_out(suite) for suite in suites]


@router.post("/eval-suites", response={201: EvalSuiteOut}, summary="Create an evaluation suite (project admins)")
def create_suite(request, payload: EvalSuiteIn):
    project = Project.objects.filter(slug=payload.project).first()
    if project is None:
        raise NotFound(f"project {payload.project} does not exist")
    what = f"project {project.slug}"
    authorize(request.auth.user, project.id, "administer", what=what, token=request.auth, request=request)
    suite = eval_suite_create(project=project, slug=payload.slug, name=payload.name, description=payload.description,
                              rerun_on=payload.rerun_on, user=request.auth.user, via="api")  # fmt: skip
    return Status(201, _suite_out(_suites().get(id=suite.id)))


@router.get("/eval-suites/{suite_id}", response=EvalSuiteOut, summary="A suite and its cases")
def get_suite(request, suite_id: PathId):
    return _suite_out(_suite_for(request, suite_id))


@router.post("/eval-suites/{suite_id}/runs", response={201: EvalRunOut}, summary="Run a suite (a pass)")
def start_eval(request, suite_id: PathId, payload: EvalStartIn):
    suite = _suite_for(request, suite_id, "start")
    version = None
    if payload.model_version:
        version = ModelVersion.objects.filter(slug=payload.model_version).first()
        if version is None:
            message = f"no model version {payload.model_version}"
            raise InvalidInput(message, [{"field": "model_version", "message": message}])
    eval_run = eval_start(suite=suite, version=version, user=request.auth.user, baseline=payload.baseline, via="api")
    return Status(201, _eval_run_out(eval_run))


@router.get("/eval-runs/{eval_run_id}", response=EvalRunOut, summary="A pass: verdicts, grades and regressions")
def get_eval_run(request, eval_run_id: PathId):
    eval_run = EvalRun.objects.select_related("suite", "version").filter(id=eval_run_id).first()
    if eval_run is None:
        raise NotFound(f"evaluation run {eval_run_id} does not exist")
    _suite_for(request, eval_run.suite_id)
    return _eval_run_out(eval_run)


@router.get("/eval-suites/{suite_id}/comparison", response=ComparisonOut, summary="Passes side by side")
def get_comparison(request, suite_id: PathId, last: int = 4):
    suite = _suite_for(request, suite_id)
    cases, columns = comparison(suite, last=max(1, min(last, 20)))
    return {
        "columns": [{"eval_run": c.eval_run.id, "label": c.eval_run.label, "baseline": c.eval_run.baseline,
                     "judged": c.judged, "going": c.going, "figures": c.figures()} for c in columns],
        "cases": [{"case": case.id, "name": case.name,
                   "verdicts": [getattr(c.cells.get(case.id), "passed", None) for c in columns]} for case in cases],
        "history": history(suite, last=max(1, min(last * 3, 30))),
    }  # fmt: skip


@router.post("/eval-suites/{suite_id}/cases", response={201: EvalCaseOut}, summary="Add a case (or one from a run)")
def add_case(request, suite_id: PathId, payload: EvalCaseIn):
    suite = _suite_for(request, suite_id, "curate")
    user = request.auth.user
    if payload.from_run is not None:
        run = run_for(request, payload.from_run)
        case = eval_case_from_run(suite=suite, run=run, name=payload.name, checks=payload.checks, user=user, via="api")
    else:
        case = eval_case_create(suite=suite, name=payload.name, workflow=payload.workflow, goal=payload.goal,
                                baseline_workflow=payload.baseline_workflow, input=payload.input,
                                checks=payload.checks or [], user=user, via="api")  # fmt: skip
    return Status(201, _case_out(case))


def _annotation_out(note: Annotation) -> dict:
    return {
        "id": note.id, "run": note.run_id, "target": note.target, "target_id": note.target_id, "score": note.score,
        "comment": note.comment, "author": note.author.username if note.author_id else None,
        "created_at": note.created_at,
    }  # fmt: skip


@router.get("/runs/{run_id}/annotations", response=list[AnnotationOut], summary="Reviewers' scores and comments")
def list_annotations(request, run_id: PathId):
    run = run_for(request, run_id)
    return [_annotation_out(note) for note in run.annotations.select_related("author")]


@router.post("/runs/{run_id}/annotations", response={201: AnnotationOut}, summary="Score or comment on a run")
def annotate(request, run_id: PathId, payload: AnnotationIn):
    run = run_for(request, run_id, "decide")
    note = annotation_create(run=run, target=payload.target, target_id=payload.target_id, score=payload.score,
                             comment=payload.comment, user=request.auth.user, via="api")  # fmt: skip
    return Status(201, _annotation_out(note))
