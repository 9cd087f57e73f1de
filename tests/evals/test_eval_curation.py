"""The small things a team trips over with evaluations: the reviewer who annotated a run keeps it as a case
(the `curate` action: operators, reviewers and admins), a project admin creates a suite from the dashboard,
and neither is open to anyone else."""

import json

import pytest

from evals.demo import demo_suite_load
from evals.models import EvalCase, EvalSuite
from runs.services import run_start
from tenancy.access import default_project, membership_grant
from tenancy.models import AuditEvent, Project
from tenancy.tokens import api_token_create
from tests.evals.test_eval_checks import confident  # noqa: F401  (the fixture)
from tests.runs.test_run_actions import drive


@pytest.fixture
def suite(confident):  # noqa: F811
    return demo_suite_load()


@pytest.fixture
def member(django_user_model):
    def make(username: str, role: str):
        user = django_user_model.objects.create_user(username=username, password="x")
        membership_grant(user=user, project=default_project(), role=role)
        return user

    return make


def _api(client, token, url, body):
    return client.post(url, data=json.dumps(body), content_type="application/json",
                       HTTP_AUTHORIZATION=f"Bearer {token}")  # fmt: skip


def test_the_reviewer_who_annotates_a_run_makes_it_a_case_from_the_run_page(suite, member, client):
    run = drive(run_start(workflow="deploy-review", input={"model_version": "confident"}))
    client.force_login(member("rita", "reviewer"))
    page = client.get(f"/runs/{run.id}/").content.decode()
    assert 'id="annotate-form"' in page and 'id="eval-case-form"' in page
    assert client.post(f"/runs/{run.id}/annotate", {"target": "run", "score": "1"}).status_code == 302
    added = client.post(f"/runs/{run.id}/eval-case", {"suite": suite.id, "name": "as rita saw it"})
    assert added.status_code == 302 and added["Location"] == f"/evals/{suite.id}/"
    assert EvalCase.objects.get(from_run=run).name == "as rita saw it"
    assert AuditEvent.objects.filter(action="eval_case_add", actor_label="rita", via="page").count() == 1


def test_a_viewer_may_not_make_a_run_a_case(suite, member, client):
    run = drive(run_start(workflow="deploy-review", input={"model_version": "confident"}))
    client.force_login(member("vera", "viewer"))
    assert 'id="eval-case-form"' not in client.get(f"/runs/{run.id}/").content.decode()
    before = EvalCase.objects.count()
    assert client.post(f"/runs/{run.id}/eval-case", {"suite": suite.id, "name": "x"}).status_code == 403
    assert EvalCase.objects.count() == before
    assert AuditEvent.objects.filter(action="denied:curate", actor_label="vera").exists()


def test_a_reviewers_approve_token_adds_a_case_and_a_read_token_or_a_viewer_cannot(suite, member, client):
    run = drive(run_start(workflow="deploy-review", input={"model_version": "confident"}))
    rita = member("rita", "reviewer")
    cases, before = f"/api/v1/eval-suites/{suite.id}/cases", EvalCase.objects.count()
    reading = _api(client, api_token_create(user=rita, scopes=["read"])[1], cases, {"name": "x", "from_run": run.id})
    assert reading.status_code == 403
    needed = "this API token lacks the 'operate' or 'approve' scope needed to curate"
    assert reading.json()["message"].startswith(needed)
    viewer = _api(client, api_token_create(user=member("vera", "viewer"))[1], cases, {"name": "x", "from_run": run.id})
    assert viewer.status_code == 403 and EvalCase.objects.count() == before
    made = _api(client, api_token_create(user=rita, scopes=["read", "approve"])[1], cases,
                {"name": "as rita saw it", "from_run": run.id})  # fmt: skip
    assert made.status_code == 201, made.json()
    assert EvalCase.objects.get(from_run=run).name == "as rita saw it"


def test_a_project_admin_creates_a_suite_from_the_dashboard(operator, client):
    client.force_login(operator)
    assert 'id="eval-new"' in client.get("/evals/").content.decode()
    form = client.get("/evals/new")
    assert form.status_code == 200 and 'id="eval-new-form"' in form.content.decode()
    data = {"name": "Refunds", "slug": "refunds", "project": default_project().id, "description": "<b>ours</b>",
            "rerun_on": "agent:verifier-agent\n\n"}  # fmt: skip
    created = client.post("/evals/new", data)
    suite = EvalSuite.objects.get(slug="refunds")
    assert created.status_code == 302 and created["Location"] == f"/evals/{suite.id}/"
    assert (suite.name, suite.project, suite.rerun_on) == ("Refunds", default_project(), ["agent:verifier-agent"])
    assert AuditEvent.objects.filter(action="eval_suite_create", via="page", actor_label="olivia").count() == 1
    assert "&lt;b&gt;ours&lt;/b&gt;" in client.get(f"/evals/{suite.id}/").content.decode()


@pytest.mark.parametrize(
    "change,field",
    [
        ({"slug": "not a slug"}, "slug"),
        ({"slug": "refunds"}, "slug"),  # taken
        ({"name": ""}, "name"),
        ({"rerun_on": "agents:verifier"}, "rerun_on"),
        ({"project": "elsewhere"}, "project"),  # a project they do not administer
    ],
)
def test_bad_input_is_a_form_error_naming_the_field_and_writes_nothing(operator, client, change, field):
    EvalSuite.objects.create(slug="refunds", name="Refunds", project=default_project())
    elsewhere = Project.objects.create(slug="elsewhere", name="Elsewhere")
    membership_grant(user=operator, project=elsewhere, role="operator")
    client.force_login(operator)
    data = {"name": "Deploys", "slug": "deploys", "project": default_project().id, "rerun_on": "", **change}
    if data["project"] == "elsewhere":
        data["project"] = elsewhere.id
    answered = client.post("/evals/new", data)
    assert answered.status_code == 400
    assert f'id="error-{field}"' in answered.content.decode()
    assert EvalSuite.objects.count() == 1


def test_only_a_project_admin_may_open_the_new_suite_page(member, client, django_user_model):
    for person in (member("omar", "operator"), member("rita", "reviewer"), member("vera", "viewer"),
                   django_user_model.objects.create_user(username="otto", password="x")):  # fmt: skip
        client.force_login(person)
        assert client.get("/evals/new").status_code == 403
        assert client.post("/evals/new", {"name": "X", "slug": "x", "project": default_project().id}).status_code == 403
        assert 'id="eval-new"' not in client.get("/evals/").content.decode()
    assert not EvalSuite.objects.exists()
    assert AuditEvent.objects.filter(action="denied:administer", target="a new evaluation suite").count() == 8
    client.logout()
    assert client.get("/evals/new").status_code == 302  # to the login page
