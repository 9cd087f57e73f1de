"""Evaluations through the API, as a CI script and a reviewer use it: start a pass, read its verdicts and
regressions and the comparison; a reviewer annotates a run and an operator turns it into a case that
expects what the reviewer approved. Bad input is a 422 that writes nothing."""

import json

import pytest

from agents.models import ModelVersion, Workflow
from evals.demo import demo_suite_load
from evals.models import Annotation, EvalCase, EvalRun, EvalSuite
from runs.models import Run
from runs.services import run_start
from tenancy.access import default_project, membership_grant
from tenancy.models import AuditEvent, Project
from tenancy.tokens import api_token_create
from tests.evals.test_eval_checks import CONFIDENT, confident  # noqa: F401  (the fixture)
from tests.runs.test_run_actions import drive


def call(client, token, url, body=None):
    headers = {"HTTP_AUTHORIZATION": f"Bearer {token}"}
    if body is None:
        return client.get(url, **headers)
    return client.post(url, data=json.dumps(body), content_type="application/json", **headers)


@pytest.fixture
def suite(confident):  # noqa: F811
    suite = demo_suite_load()
    ModelVersion.objects.filter(slug="strict-verifier").update(
        overrides={**ModelVersion.objects.get(slug="strict-verifier").overrides, "risk-agent": CONFIDENT["risk-agent"]}
    )
    return suite


def _settle(eval_run_id: int) -> None:
    for run_id in EvalRun.objects.get(id=eval_run_id).results.values_list("run_id", flat=True):
        drive(Run.objects.get(id=run_id))


def test_a_pass_started_by_the_api_reports_its_verdicts_regressions_and_comparison(suite, operator, client):
    token = api_token_create(user=operator)[1]
    first = call(client, token, f"/api/v1/eval-suites/{suite.id}/runs", {"model_version": "confident"})
    assert first.status_code == 201 and first.json()["trigger"] == "api" and not first.json()["settled"]
    _settle(first.json()["id"])
    body = call(client, token, f"/api/v1/eval-runs/{first.json()['id']}").json()
    assert body["settled"] and {r["passed"] for r in body["results"]} == {True} and body["regressions"] == []

    second = call(client, token, f"/api/v1/eval-suites/{suite.id}/runs", {"model_version": "strict-verifier"}).json()
    _settle(second["id"])
    body = call(client, token, f"/api/v1/eval-runs/{second['id']}").json()
    assert body["baseline_run"] == first.json()["id"]
    assert [(r["name"], r["before"]) for r in body["regressions"]] == [("approves a safe deploy", True)]
    assert [(r["name"], r["quarantined"]) for r in body["failing"]] == [("approves a safe deploy", False)]
    assert not body["accepted"]  # only run_evals accepts a pass
    suite.quarantine.add(suite.cases.get(name="approves a safe deploy"))
    body = call(client, token, f"/api/v1/eval-runs/{second['id']}").json()
    assert body["failing"] == [] and len(body["regressions"]) == 1  # a known failure: reported, forgiven
    listed = call(client, token, f"/api/v1/eval-suites/{suite.id}").json()
    assert listed["quarantine"] == [suite.cases.get(name="approves a safe deploy").id]

    compared = call(client, token, f"/api/v1/eval-suites/{suite.id}/comparison").json()
    assert [c["label"] for c in compared["columns"]] == ["confident", "strict-verifier"]
    assert [c["figures"]["success"] for c in compared["columns"]] == [100.0, 66.7]
    assert compared["history"]["series"]["success"] == [100.0, 66.7]
    assert AuditEvent.objects.filter(action="evaluate", via="api").count() == 2


def test_bad_input_is_refused_and_writes_nothing(suite, operator, client):
    token = api_token_create(user=operator)[1]
    before = EvalRun.objects.count(), EvalCase.objects.count(), Run.objects.count()
    refused = [
        call(client, token, f"/api/v1/eval-suites/{suite.id}/runs", {"model_version": "nope"}),
        call(client, token, f"/api/v1/eval-suites/{suite.id}/runs", {"baseline": "maybe"}),
        call(client, token, f"/api/v1/eval-suites/{suite.id}/cases",
             {"name": "x", "workflow": "deploy-review", "checks": [{"artifact": "verify", "schema": {"type": 5}}]}),
        call(client, token, f"/api/v1/eval-suites/{suite.id}/cases", {"name": "x", "workflow": "nope", "checks": []}),
    ]  # fmt: skip
    suites, token = (
        "/api/v1/eval-suites",
        api_token_create(user=operator, scopes=["read", "admin"])[1],
    )  # suites: admins
    refused.append(
        call(client, token, suites, {"slug": "n", "name": "n", "project": "default", "rerun_on": ["model:x"]})
    )
    refused.append(call(client, token, suites, {"slug": suite.slug, "name": "n", "project": "default"}))
    assert [r.status_code for r in refused] == [422] * 6
    assert refused[4].json()["errors"] == [
        {"field": "rerun_on", "message": "'model:x' is not agent:<slug>, workflow:<slug> or policy:<name>"}
    ]

    assert refused[0].json()["errors"] == [{"field": "model_version", "message": "no model version nope"}]
    assert (
        refused[2].json()["errors"][0]["field"] == "checks[0]" and "not a JSON Schema" in refused[2].json()["message"]
    )
    assert (EvalRun.objects.count(), EvalCase.objects.count(), Run.objects.count()) == before
    assert list(EvalSuite.objects.values_list("slug", flat=True)) == [suite.slug]
    made = call(client, token, suites, {"slug": "mine", "name": "Mine", "project": "default", "rerun_on": ["agent:a"]})
    assert made.status_code == 201 and made.json()["rerun_on"] == ["agent:a"] and made.json()["cases"] == []


def test_a_reviewer_annotates_a_run_and_an_operator_makes_it_a_case(suite, operator, client, django_user_model):
    run = drive(run_start(workflow="deploy-review", input={"model_version": "confident"}))
    reviewer = django_user_model.objects.create_user(username="rita", password="x")
    membership_grant(user=reviewer, project=default_project(), role="reviewer")
    review = api_token_create(user=reviewer, scopes=["read", "approve"])[1]
    verdict = run.artifacts.get(task__key="verify")
    url = f"/api/v1/runs/{run.id}/annotations"
    assert call(client, review, url, {"target": "artifact", "target_id": verdict.id, "score": 1}).status_code == 201
    assert call(client, review, url, {"comment": "Good <i>call</i>."}).status_code == 201
    other = run_start(workflow="deploy-review")
    refused = [
        call(client, review, url, {"target": "task", "target_id": other.tasks.first().id, "score": 0.5}),
        call(client, review, url, {"score": 1.5}),
        call(client, review, url, {}),
    ]
    assert [r.status_code for r in refused] == [422, 422, 422] and Annotation.objects.count() == 2
    assert [a["comment"] for a in call(client, review, url).json()] == ["", "Good <i>call</i>."]

    token = api_token_create(user=operator)[1]
    made = call(client, token, f"/api/v1/eval-suites/{suite.id}/cases", {"name": "as rita saw it", "from_run": run.id})
    assert made.status_code == 201, made.json()
    assert made.json()["checks"] == [
        {"status": "completed"},
        {"artifact": "verify", "equals": verdict.content, "path": ""},
    ]
    assert made.json()["from_run"] == run.id and made.json()["input"] == {"propose_tools": []}


def test_a_workflow_of_a_project_the_caller_cannot_see_answers_as_one_that_does_not_exist(suite, operator, client):
    elsewhere = Project.objects.create(slug="elsewhere", name="Elsewhere")
    Workflow.objects.create(slug="secret-flow", name="Secret", project=elsewhere, tasks=[])
    token = api_token_create(user=operator)[1]
    cases, before = f"/api/v1/eval-suites/{suite.id}/cases", EvalCase.objects.count()

    def answer(**slugs):
        got = call(client, token, cases, {"name": "x", "checks": [], **slugs})
        return got.status_code, json.loads(got.content.decode().replace("secret-flow", "no-such-flow"))

    for field in ("workflow", "baseline_workflow"):
        shared = {"workflow": "deploy-review"} if field == "baseline_workflow" else {}
        assert answer(**shared, **{field: "secret-flow"}) == answer(**shared, **{field: "no-such-flow"})
        assert answer(**shared, **{field: "no-such-flow"})[0] == 422
    # Seen (a member there), it is still another project's: a case runs in the suite's project.
    membership_grant(user=operator, project=elsewhere, role="viewer")
    seen = call(client, token, cases, {"name": "x", "workflow": "secret-flow", "checks": []})
    assert seen.status_code == 422 and seen.json()["errors"] == [
        {"field": "workflow", "message": "workflow secret-flow belongs to another project: a case runs in the "
         "suite's project"}
    ]  # fmt: skip
    assert call(client, token, cases, {"name": "x", "checks": []}).json()["errors"] == [
        {"field": "workflow", "message": "a case needs a workflow (or a run to replay)"}
    ]
    assert EvalCase.objects.count() == before
    shared = call(client, token, cases, {"name": "shared", "workflow": "deploy-review", "checks": []})
    assert shared.status_code == 201 and shared.json()["workflow"] == "deploy-review"
