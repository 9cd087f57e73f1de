"""The integration API for runs: the list with cursor pages, the operator's writes, Idempotency-Key
with Stripe's semantics, and the per-token rate limit."""

import json
import threading

import pytest
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from integrations.idempotency import idempotency_keys_prune
from integrations.models import IdempotencyKey
from runs.models import Run, Span, Task
from runs.services import run_start
from tenancy.access import default_project, membership_grant
from tenancy.models import AuditEvent, Project
from tenancy.tokens import api_token_create


def bearer(token: str, **extra) -> dict:
    return {"HTTP_AUTHORIZATION": f"Bearer {token}", **extra}


@pytest.fixture
def token(operator):
    return api_token_create(user=operator)[1]


def post(client, url, body, token, **headers):
    return client.post(url, data=json.dumps(body), content_type="application/json", **bearer(token, **headers))


# --- the list ----------------------------------------------------------------------------------------------
def test_the_list_pages_by_cursor_filters_and_shows_only_my_projects(demo, operator, token, client):
    mine = [run_start(workflow="deploy-review") for _ in range(5)]
    Run.objects.filter(id=mine[0].id).update(status=Run.Status.FAILED)
    elsewhere = Project.objects.create(slug="elsewhere", name="Elsewhere")
    hidden = run_start(workflow="deploy-review", project=elsewhere)

    seen, after = [], None
    while True:
        url = "/api/v1/runs?limit=2" + (f"&after={after}" if after else "")
        page = client.get(url, **bearer(token)).json()
        seen += [item["id"] for item in page["items"]]
        after = page["next_after"]
        if after is None:
            break
    assert seen == sorted((r.id for r in mine), reverse=True)  # each once, newest first
    assert hidden.id not in seen
    failed = client.get("/api/v1/runs?status=failed", **bearer(token)).json()["items"]
    assert [item["id"] for item in failed] == [mine[0].id]
    assert client.get("/api/v1/runs?project=elsewhere", **bearer(token)).json()["items"] == []
    bad = client.get("/api/v1/runs?status=exploded&limit=0", **bearer(token))
    assert bad.status_code == 422 and {e["field"] for e in bad.json()["errors"]} >= {"status.0", "limit"}


def test_the_list_takes_the_same_queries_for_30_runs_as_for_3(demo, operator, token, client):
    def count() -> int:
        with CaptureQueriesContext(connection) as ctx:
            assert client.get("/api/v1/runs?limit=100", **bearer(token)).status_code == 200
        return len(ctx.captured_queries)

    for _ in range(3):
        run_start(workflow="deploy-review")
    count()  # the token's first use records its last-used time
    few = count()
    for _ in range(27):
        run_start(workflow="deploy-review")
    assert count() == few


# --- operator writes ---------------------------------------------------------------------------------------
def test_cancel_resume_and_retry_through_the_api_are_audited(demo, operator, token, client):
    run = run_start(workflow="deploy-review")
    cancelled = post(client, f"/api/v1/runs/{run.id}/cancel", {"reason": "called off"}, token)
    assert cancelled.status_code == 202 and cancelled.json()["status"] in ("cancelling", "cancelled")
    assert AuditEvent.objects.filter(action="run_cancel", run=run, detail__reason="called off").exists()

    second = run_start(workflow="deploy-review")
    Run.objects.filter(id=second.id).update(status=Run.Status.NEEDS_ATTENTION)
    Task.objects.filter(run=second, key="risk").update(status=Task.Status.FAILED, failure_class="permanent")
    assert post(client, f"/api/v1/runs/{second.id}/tasks/nope/retry", {}, token).status_code == 404
    bad_step = post(client, f"/api/v1/runs/{second.id}/tasks/risk/retry", {"from_step": 0}, token)
    assert bad_step.status_code == 422 and bad_step.json()["errors"][0]["field"] == "from_step"
    retried = post(client, f"/api/v1/runs/{second.id}/tasks/risk/retry", {"reason": "flaky model"}, token)
    assert retried.status_code == 200, retried.json()
    assert Task.objects.get(run=second, key="risk").status == Task.Status.READY
    assert Run.objects.get(id=second.id).status == Run.Status.RUNNING  # the retry resumed the run
    assert AuditEvent.objects.filter(action="task_retry", run=second, detail__task="risk").exists()

    resumed = post(client, f"/api/v1/runs/{second.id}/resume", {}, token)
    assert resumed.status_code == 409  # it is running again: only a run that needs attention resumes
    assert set(resumed.json()) == {"code", "message", "errors"}


def test_a_compensation_dry_run_lists_the_effects_and_changes_nothing(demo, operator, token, client):
    run = run_start(workflow="deploy-review")
    Run.objects.filter(id=run.id).update(status=Run.Status.NEEDS_ATTENTION)
    before = Run.objects.get(id=run.id).status
    plan = post(client, f"/api/v1/runs/{run.id}/compensate", {"dry_run": True}, token)
    assert plan.status_code == 200 and set(plan.json()) >= {"undo", "correct", "cannot_undo", "unresolved"}
    assert Run.objects.get(id=run.id).status == before
    assert not AuditEvent.objects.filter(action="run_compensate", run=run).exists()


# --- Idempotency-Key -----------------------------------------------------------------------------------------
def test_the_same_key_and_body_replay_the_first_response_and_another_body_is_refused(demo, operator, token, client):
    body = {"workflow": "deploy-review", "goal": "once"}
    first = post(client, "/api/v1/runs", body, token, HTTP_IDEMPOTENCY_KEY="k-1")
    again = post(client, "/api/v1/runs", body, token, HTTP_IDEMPOTENCY_KEY="k-1")
    assert first.status_code == again.status_code == 201
    assert again.json() == first.json() and again["Idempotent-Replayed"] == "true"
    assert Run.objects.count() == 1

    other = post(client, "/api/v1/runs", {**body, "goal": "twice"}, token, HTTP_IDEMPOTENCY_KEY="k-1")
    assert other.status_code == 409 and other.json()["code"] == "idempotency_key_reused"
    assert Run.objects.count() == 1
    # Keys belong to their caller: another token's "k-1" is another request.
    someone = api_token_create(user=operator)[1]
    assert post(client, "/api/v1/runs", body, someone, HTTP_IDEMPOTENCY_KEY="k-1").status_code == 201
    assert Run.objects.count() == 2


def test_a_key_in_flight_is_refused_until_its_holder_is_presumed_dead(demo, operator, token, client, settings):
    body = {"workflow": "deploy-review"}
    post(client, "/api/v1/runs", body, token, HTTP_IDEMPOTENCY_KEY="k-2")
    IdempotencyKey.objects.filter(key="k-2").update(status="in_flight", locked_at=timezone.now())
    busy = post(client, "/api/v1/runs", body, token, HTTP_IDEMPOTENCY_KEY="k-2")
    assert busy.status_code == 409 and busy.json()["code"] == "idempotency_key_in_flight"
    assert busy["Retry-After"] == "1" and Run.objects.count() == 1

    stale = timezone.now() - timezone.timedelta(seconds=settings.WARDEN["IDEMPOTENCY_IN_FLIGHT_SECONDS"] + 1)
    IdempotencyKey.objects.filter(key="k-2").update(locked_at=stale)
    taken_over = post(client, "/api/v1/runs", body, token, HTTP_IDEMPOTENCY_KEY="k-2")
    assert taken_over.status_code == 201 and IdempotencyKey.objects.get(key="k-2").status == "done"


def test_a_refused_or_invalid_request_does_not_keep_its_key(demo, operator, token, client):
    assert post(client, "/api/v1/runs", {"workflow": ""}, token, HTTP_IDEMPOTENCY_KEY="k-3").status_code == 422
    assert post(client, "/api/v1/runs", {"workflow": "x"}, "wrong", HTTP_IDEMPOTENCY_KEY="k-3").status_code == 401
    assert not IdempotencyKey.objects.exists()
    long = post(client, "/api/v1/runs", {"workflow": "deploy-review"}, token, HTTP_IDEMPOTENCY_KEY="k" * 256)
    assert long.status_code == 400 and not Run.objects.exists()


def test_keys_are_kept_72_hours_then_pruned(demo, operator, token, client):
    post(client, "/api/v1/runs", {"workflow": "deploy-review"}, token, HTTP_IDEMPOTENCY_KEY="k-4")
    now = timezone.now()
    assert idempotency_keys_prune(now + timezone.timedelta(hours=71)) == 0
    assert idempotency_keys_prune(now + timezone.timedelta(hours=73)) == 1


def test_twenty_parallel_creates_with_one_key_make_one_run(demo_tx, operator):
    token = api_token_create(user=operator)[1]
    body = {"workflow": "deploy-review", "goal": "exactly one"}
    results: list[int] = []
    start = threading.Barrier(20)

    def create():
        client = Client()
        start.wait()
        response = post(client, "/api/v1/runs", body, token, HTTP_IDEMPOTENCY_KEY="parallel-1")
        results.append(response.status_code)
        connection.close()

    threads = [threading.Thread(target=create) for _ in range(20)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert Run.objects.filter(goal="exactly one").count() == 1
    assert sorted(set(results)) <= [201, 409] and 201 in results, results
    again = post(Client(), "/api/v1/runs", body, token, HTTP_IDEMPOTENCY_KEY="parallel-1")
    assert again.status_code == 201 and again["Idempotent-Replayed"] == "true"


# --- rate limit ---------------------------------------------------------------------------------------------
def test_a_token_over_its_rate_gets_429_with_retry_after(demo, operator, client, settings):
    import time

    from django.core.cache import cache

    settings.WARDEN = {**settings.WARDEN, "API_RATE_PER_MINUTE": 3}
    (busy_row, busy), (calm_row, calm) = api_token_create(user=operator), api_token_create(user=operator)
    if time.time() % 60 > 55:  # keep the four requests inside one window
        time.sleep(61 - time.time() % 60)
    window = int(time.time() // 60)
    cache.delete_many([f"api-rate:{t.token_hash[:16]}:{window}" for t in (busy_row, calm_row)])
    codes = [client.get("/api/v1/runs", **bearer(busy)).status_code for _ in range(4)]
    assert codes[:3] == [200, 200, 200] and codes[3] == 429
    limited = client.get("/api/v1/runs", **bearer(busy))
    assert limited.json()["code"] == "rate_limited" and 1 <= int(limited["Retry-After"]) <= 61
    assert client.get("/api/v1/runs", **bearer(calm)).status_code == 200


def test_spans_are_untouched_by_the_list(demo, operator, token, client):
    """A read is a read: listing runs writes nothing."""
    run_start(workflow="deploy-review")
    spans = Span.objects.count()
    client.get("/api/v1/runs", **bearer(token))
    assert Span.objects.count() == spans and not IdempotencyKey.objects.exists()
    membership_grant(user=operator, project=default_project(), role="viewer")
    assert post(client, f"/api/v1/runs/{Run.objects.get().id}/cancel", {}, token).status_code == 403


HUGE = "99999999999999999999"


@pytest.mark.parametrize("url", [f"/api/v1/approvals?run={HUGE}", f"/api/v1/runs/{HUGE}", f"/api/v1/runs?after={HUGE}"])
def test_numbers_beyond_the_database_never_make_a_server_error(db, token, client, url):
    """Found by schemathesis: an id past 2**63 reached the database and came back as a 500."""
    response = client.get(url, **bearer(token))
    assert response.status_code in (200, 404, 422), response.content[:300]
    if response.status_code == 422:
        assert response.json()["message"] == "a number in the request is out of range"
