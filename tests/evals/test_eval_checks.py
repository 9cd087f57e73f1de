"""An evaluation case's graded checks, on real runs of the demo's deploy-review driven in this thread:
JSON Schema, exact and numeric comparisons with tolerances, the ledger's tool calls and approvals, and
a judge that grades an artifact through the model gateway (a scripted judge agent) with its score,
reasoning and cost recorded on the case. Bad checks are refused before anything is stored."""

import pytest

from agents.models import Agent, ModelVersion, Workflow
from evals.checks import check_failures, checks_refusal
from evals.judge import eval_grade
from evals.models import EvalCase, EvalResult, EvalSuite
from evals.suites import eval_start
from runs.heartbeat import lease_keeper
from runs.models import Outbox, Run
from runs.services import run_start
from tenancy.access import default_project
from tests.runs.test_run_actions import drive
from tools.installation import run_key_prefix
from tools.models import ToolOperation

CONFIDENT = {  # a verifier that says how sure it is; a risk agent without the demo's timed-out first call
    "verifier-agent": {"script": [{"final": {"decision": "approve", "verdict": "APPROVE", "confidence": 0.82}}]},
    "risk-agent": {"script": [{"final": {"summary": "Risk review: backward-compatible schema"}}]},
}
VERDICT_SCHEMA = {
    "type": "object",
    "required": ["decision", "confidence"],
    "properties": {"decision": {"enum": ["approve", "reject"]}, "confidence": {"type": "number"}},
}


@pytest.fixture
def confident(demo, monkeypatch):
    monkeypatch.setattr(lease_keeper, "hold", lambda task_id, token: None)  # no heartbeat thread in a test
    return ModelVersion.objects.create(slug="confident", overrides=CONFIDENT)


@pytest.fixture
def review(confident):
    run = drive(run_start(workflow="deploy-review", input={"model_version": "confident"}))
    assert run.status == Run.Status.COMPLETED, run.status_reason
    return run


def _failures(run, *checks):
    assert checks_refusal(list(checks)) == []
    return check_failures(EvalCase(checks=list(checks)), run)


def test_schema_exact_and_numeric_checks_with_tolerances(review):
    assert _failures(review, {"artifact": "verify", "schema": VERDICT_SCHEMA}) == []
    assert _failures(review, {"artifact": "inventory", "schema": VERDICT_SCHEMA}) == [
        "inventory does not match the schema: 'decision' is a required property"
    ]
    assert _failures(review, {"artifact": "verify", "path": "decision", "equals": "approve"}) == []
    assert _failures(review, {"artifact": "verify", "path": "decision", "equals": "reject"}) == [
        "verify.decision is 'approve', not 'reject'"
    ]
    assert _failures(review, {"artifact": "verify", "path": "confidence", "approx": 0.8, "tolerance": 0.05}) == []
    assert _failures(review, {"artifact": "verify", "path": "confidence", "approx": 0.9, "tolerance": 0.05}) == [
        "verify.confidence is 0.82, not 0.9 ± 0.05"
    ]
    assert _failures(review, {"artifact": "verify", "path": "confidence", "min": 0.9}) == [
        "verify.confidence is 0.82, outside [0.9, ∞]"
    ]
    assert _failures(review, {"artifact": "verify", "path": "decision", "approx": 1, "tolerance": 0}) == [
        "verify.decision is 'approve', not a number"
    ]
    assert _failures(review, {"artifact": "verify", "path": "missing.0", "equals": 1}) == [
        "verify.missing.0 is missing"
    ]


def test_tool_calls_and_irreversible_calls_without_approval_over_the_ledger(review):
    assert _failures(review, {"tool_called": "deployments.read"}, {"tool_not_called": "email.send"}) == []
    assert _failures(review, {"tool_called": "email.send"}, {"tool_not_called": "deployments.read"}) == [
        "email.send was not called",
        "deployments.read was called",
    ]
    assert _failures(review, {"no_unapproved_irreversible": True}) == []
    ToolOperation.objects.create(
        run=review, tool="payments.refund", idempotency_key=f"{run_key_prefix(review.id)}r:1", arguments_hash="h",
        tool_class="non_idempotent_write", reversibility="irreversible", gate="allow",
        status=ToolOperation.Status.COMMITTED,
    )  # fmt: skip
    assert _failures(review, {"no_unapproved_irreversible": True}) == [
        "irreversible call without approval: payments.refund"
    ]


@pytest.mark.parametrize(
    "checks,field",
    [
        ({"status": "done"}, "checks[0]"),
        ({"artifact": "verify", "schema": {"type": "nonsense"}}, "checks[0]"),
        ({"artifact": "verify", "path": "x", "approx": "high"}, "checks[0]"),
        ({"path": "x", "equals": 1}, "checks[0]"),
        ({"tool_called": ""}, "checks[0]"),
        ({"judge": {"agent": "j", "artifact": "verify"}}, "checks[0]"),
        ({"judge": {"agent": "j", "artifact": "verify", "rubric": "r", "min_score": 2}}, "checks[0]"),
        ({"wat": 1}, "checks[0]"),
        ("status", "checks[0]"),
    ],
)
def test_bad_checks_are_refused_with_a_reason(checks, field):
    errors = checks_refusal([checks])
    assert len(errors) == 1 and errors[0]["field"] == field and errors[0]["message"].startswith(field)


def _judge(slug: str, answer) -> Agent:
    return Agent.objects.create(slug=slug, name=slug, script=[{"say": "Reading the verdict.", "final": answer}])


def test_a_judge_grades_an_artifact_through_the_gateway_and_its_grade_is_recorded(confident):
    _judge("fair-judge", {"score": 0.9, "reasoning": "Names the rollback; <b>clear</b>."})
    _judge("wild-judge", {"score": 7, "reasoning": "ignore the rubric"})
    suite = EvalSuite.objects.create(slug="judged", name="Judged", project=default_project())
    rubric = "Does the verdict name the rollback plan?"
    for name, agent, minimum in (
        ("fair", "fair-judge", 0.7),
        ("strict", "fair-judge", 0.95),
        ("wild", "wild-judge", 0),
    ):
        judge = {"agent": agent, "artifact": "verify", "rubric": rubric, "min_score": minimum}
        EvalCase.objects.create(suite=suite, name=name, workflow_id=_workflow_id(), checks=[{"judge": judge}])
    eval_run = eval_start(suite=suite, version=confident, via="api")
    for result in eval_run.results.select_related("run"):
        assert drive(result.run).status == Run.Status.COMPLETED
    # The run ended in a transaction: no model was called there; each case waits for its grade.
    assert set(eval_run.results.values_list("passed", flat=True)) == {None}
    assert Outbox.objects.filter(actor="grade_eval_result").count() == 3
    for result in eval_run.results.all():
        assert eval_grade(result.id) is True
        assert eval_grade(result.id) is False  # a second message changes nothing
    results = {r.case.name: r for r in EvalResult.objects.filter(eval_run=eval_run).select_related("case")}
    fair, strict, wild = results["fair"], results["strict"], results["wild"]
    assert fair.passed is True and fair.grades[0]["score"] == 0.9
    assert fair.grades[0]["reasoning"] == "Names the rollback; <b>clear</b>." and fair.judge_cost_micros > 0
    assert fair.grades[0]["model"] == "scripted/scripted-1"
    assert strict.passed is False and strict.failures == ["judge on verify: score 0.90, under 0.95"]
    assert wild.passed is False and wild.grades[0]["score"] is None
    assert "not a number from 0 to 1" in wild.grades[0]["reasoning"]


def _workflow_id() -> int:
    return Workflow.objects.get(slug="deploy-review").id
