"""The first integration API: start a run, read it back; bad input is refused and writes nothing."""

import json

import pytest

from agents.models import Workflow
from runs.models import Outbox, Run, Task
from tenancy.models import ApiToken, Project
from tenancy.tokens import api_token_create


@pytest.fixture
def token(operator):
    return api_token_create(user=operator)[1]


@pytest.fixture
def api(client, token):
    def call(method, path, body=None, auth=True):
        headers = {"HTTP_AUTHORIZATION": f"Bearer {token}"} if auth else {}
        if method == "post":
            return client.post(f"/api/v1{path}", data=body, content_type="application/json", **headers)
        return client.get(f"/api/v1{path}", **headers)

    return call


def test_start_a_run_and_read_it_back(demo, api, operator, django_assert_num_queries):
    created = api("post", "/runs", {"workflow": "deploy-review", "budget": {"max_tokens": 5000, "max_cost_usd": 0.25}})
    assert created.status_code == 201, created.json()
    body = created.json()
    assert body["status"] == "running" and body["workflow"] == "deploy-review"
    assert body["budget"]["max_tokens"] == 5000 and body["budget"]["max_cost_usd"] == 0.25
    run = Run.objects.get(id=body["id"])
    assert run.started_by == operator

    # the token, the run with its workflow and project, the tasks with their agents, the caller's role
    with django_assert_num_queries(4):
        detail = api("get", f"/runs/{run.id}").json()
    assert detail["usage"] == {"steps": 0, "tokens": 0, "tool_calls": 0, "cost_usd": 0.0}
    assert [(t["key"], t["agent"], t["status"], t["attempts"], t["depends_on"]) for t in detail["tasks"]] == [
        ("inventory", "inventory-agent", "ready", 0, []),
        ("risk", "risk-agent", "ready", 0, []),
        ("verify", "verifier-agent", "pending", 0, ["inventory", "risk"]),
    ]


SCHEMA = "the request is invalid"


@pytest.mark.parametrize(
    "body, status, field, message",
    [
        ({"workflow": "no-such-flow"}, 422, "workflow", "unknown workflow 'no-such-flow'"),
        (
            {"workflow": "deploy-review", "budget": {"max_tokens": -5}},
            422,
            "budget.max_tokens",
            "the request is invalid",
        ),
        (
            {"workflow": "deploy-review", "budget": {"max_tokens": "lots"}},
            422,
            "budget.max_tokens",
            "the request is invalid",
        ),
        ({"workflow": "deploy-review", "budget": {"tokens": 5}}, 422, "budget.tokens", "the request is invalid"),
        ({"workflow": "deploy-review", "budget": [1, 2]}, 422, "budget", "the request is invalid"),
        ({"workflow": 12}, 422, "workflow", "the request is invalid"),
        ({"workflow": "deploy-review", "input": "not an object"}, 422, "input", "the request is invalid"),
        (
            {"workflow": "deploy-review", "input": {"faults": [{"task": "verify", "mode": "explode"}]}},
            422,
            "input.faults.0.mode",
            "the run's input is invalid",
        ),
        (
            {"workflow": "deploy-review", "input": {"faults": [{"task": "verify", "mode": "error"}]}},
            422,
            "input.faults.0",
            "the run's input is invalid",
        ),
        ({}, 422, "workflow", "the request is invalid"),
        # Taken as the schema states it: no coercion, no unknown fields.
        ({"workflow": "deploy-review", "budget": {"max_steps": "5"}}, 422, "budget.max_steps", SCHEMA),
        ({"workflow": "deploy-review", "budget": {"max_cost_usd": False}}, 422, "budget.max_cost_usd", SCHEMA),
        ({"workflow": "deploy-review", "budget": {"max_steps": 5.5}}, 422, "budget.max_steps", SCHEMA),
        ({"workflow": "deploy-review", "goal": 7}, 422, "goal", "the request is invalid"),
        ({"workflow": "deploy-review", "wrokflow": "typo"}, 422, "wrokflow", "the request is invalid"),
    ],
)
def test_bad_input_gets_a_clear_json_error_and_writes_nothing(demo, api, body, status, field, message):
    response = api("post", "/runs", body)
    assert response.status_code == status
    error = response.json()
    assert error["message"] == message
    assert field in [e["field"] for e in error["errors"]], error
    assert all(e["message"] for e in error["errors"])
    assert not Run.objects.exists() and not Task.objects.exists() and not Outbox.objects.exists()


def test_a_workflow_of_a_project_the_caller_is_not_in_answers_as_one_that_does_not_exist(demo, api):
    elsewhere = Project.objects.create(slug="elsewhere", name="Elsewhere")
    Workflow.objects.create(slug="secret-flow", name="Secret", project=elsewhere, tasks=[])

    def answer(body):
        got = api("post", "/runs", body)
        return got.status_code, json.loads(got.content.decode().replace("secret-flow", "no-such-flow"))

    for extra in ({}, {"project": "default"}):
        hidden, missing = answer({"workflow": "secret-flow", **extra}), answer({"workflow": "no-such-flow", **extra})
        assert hidden == missing and missing[0] == 422, (hidden, missing)
    assert "elsewhere" not in api("post", "/runs", {"workflow": "secret-flow"}).content.decode()
    assert not Run.objects.exists() and not Outbox.objects.exists()


def test_a_whole_number_written_as_3_0_is_an_integer_as_json_schema_says(demo, api):
    response = api("post", "/runs", {"workflow": "deploy-review", "budget": {"max_steps": 40.0}})
    assert response.status_code == 201, response.content
    assert Run.objects.get().max_steps == 40


@pytest.mark.parametrize("path", ["/runs?limit=1_0", "/runs?limit=%207%20", "/runs?after=x", "/runs/1_0", "/runs/1.5"])
def test_integers_in_the_url_are_plain_digits(demo, api, path):
    response = api("get", path)
    assert response.status_code == 422, response.content
    assert response.json()["code"] == "invalid_input"


def test_malformed_json_is_refused(demo, client, token):
    response = client.post(
        "/api/v1/runs", data="{not json", content_type="application/json", HTTP_AUTHORIZATION=f"Bearer {token}"
    )
    assert response.status_code in (400, 422)
    assert "message" in response.json()
    assert not Run.objects.exists()


@pytest.mark.parametrize("header", [None, "Bearer wrong", "Bearer wdn_not-a-real-token", "Basic abc"])
def test_missing_or_wrong_token_is_refused_and_writes_nothing(demo, client, header):
    headers = {"HTTP_AUTHORIZATION": header} if header else {}
    response = client.post(
        "/api/v1/runs", data={"workflow": "deploy-review"}, content_type="application/json", **headers
    )
    assert response.status_code == 401
    assert response.json()["code"] == "unauthenticated"
    assert not Run.objects.exists()


def test_revoked_and_expired_tokens_are_refused(demo, client, operator):
    from django.utils import timezone

    revoked, raw_revoked = api_token_create(user=operator)
    ApiToken.objects.filter(id=revoked.id).update(revoked_at=timezone.now())
    _, raw_expired = api_token_create(user=operator, expires_at=timezone.now())
    for raw in (raw_revoked, raw_expired):
        assert client.get("/api/v1/runs/1", HTTP_AUTHORIZATION=f"Bearer {raw}").status_code == 401


def test_unknown_run_is_a_json_404(demo, api):
    response = api("get", "/runs/999999")
    assert response.status_code == 404
    assert response.json() == {"code": "not_found", "message": "run 999999 does not exist", "errors": []}


def test_tokens_are_stored_hashed_and_printed_once_by_the_command(operator, capsys):
    from django.core.management import call_command

    call_command("create_api_token", operator.username)
    raw = capsys.readouterr().out.strip()
    assert raw.startswith("wdn_")
    stored = ApiToken.objects.get(user=operator)
    assert raw not in (stored.token_hash, stored.prefix) and stored.token_hash != raw
    import hashlib

    assert stored.token_hash == hashlib.sha256(raw.encode()).hexdigest()


def test_the_openapi_schema_is_browsable_and_describes_runs(client):
    docs = client.get("/api/v1/docs")
    assert docs.status_code == 200
    assert "https://" not in docs.content.decode()  # Swagger UI comes from our static files, not a CDN
    schema = client.get("/api/v1/openapi.json").json()
    assert {"/api/v1/runs", "/api/v1/runs/{run_id}"} <= set(schema["paths"])
    assert "bearer" in str(schema["components"]["securitySchemes"]).lower()
