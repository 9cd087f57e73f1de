"""The services write their own audit rows: the same row whichever surface acted (the API, a page, the
admin), done inside the service's transaction, denied (with why) when the service refuses."""

import pytest
from django.urls import reverse

from runs.models import Run
from runs.services import run_start
from tenancy.access import default_project
from tenancy.models import AuditEvent
from tenancy.tokens import api_token_create


@pytest.fixture
def olivia(operator):
    return operator


@pytest.fixture
def api(olivia, client):
    _, secret = api_token_create(user=olivia)

    def post(path, body):
        return client.post(
            f"/api/v1{path}", body, content_type="application/json", HTTP_AUTHORIZATION=f"Bearer {secret}"
        )

    return post


def _rows(run) -> list[tuple]:
    return list(
        AuditEvent.objects.filter(run_id=run.id, action="run_cancel")
        .order_by("id")
        .values_list("actor_label", "via", "outcome", "target", "project_id")
    )


def test_a_cancel_is_audited_once_and_alike_from_the_api_a_page_and_the_admin(demo, olivia, api, client, admin_client):
    by_api, by_page, by_admin = (run_start(workflow="deploy-review") for _ in range(3))
    project = default_project().id

    assert api(f"/runs/{by_api.id}/cancel", {"reason": "from the api"}).status_code == 202
    client.force_login(olivia)
    assert client.post(reverse("runs:cancel", args=[by_page.id]), {"reason": "from a page"}).status_code == 303
    changelist = reverse("admin:runs_run_changelist")
    admin_client.post(changelist, {"action": "cancel_runs", "_selected_action": [by_admin.id]})

    for run, who, via in ((by_api, "olivia", "api"), (by_page, "olivia", "page"), (by_admin, "admin", "admin")):
        assert Run.objects.get(id=run.id).status == Run.Status.CANCELLED, via
        assert _rows(run) == [(who, via, "done", f"run {run.id}", project)], via
    assert AuditEvent.objects.get(run_id=by_api.id, action="run_cancel").detail == {"reason": "from the api"}


def test_a_refusal_is_audited_as_denied_from_every_surface_and_changes_nothing(demo, olivia, api, client):
    run = run_start(workflow="deploy-review")
    Run.objects.filter(id=run.id).update(status=Run.Status.COMPLETED)

    refused = api(f"/runs/{run.id}/cancel", {"reason": "too late"})
    assert refused.status_code == 409
    client.force_login(olivia)
    assert client.post(reverse("runs:cancel", args=[run.id]), {"reason": "too late"}).status_code == 409

    assert [(via, outcome) for _, via, outcome, _, _ in _rows(run)] == [("api", "denied"), ("page", "denied")]
    for event in AuditEvent.objects.filter(run_id=run.id, action="run_cancel"):
        assert event.detail["why"] == f"run {run.id} is completed; it cannot be cancelled (already finished)"
    assert Run.objects.get(id=run.id).status == Run.Status.COMPLETED


def test_the_engine_acting_on_its_own_writes_no_audit_row(demo):
    from runs.services import run_cancel

    run = run_start(workflow="deploy-review")
    run_cancel(run_id=run.id, reason="a deadline passed")
    assert Run.objects.get(id=run.id).status == Run.Status.CANCELLED
    assert not AuditEvent.objects.filter(run_id=run.id).exists()
