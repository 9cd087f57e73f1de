"""Starting a run from the dashboard: the workflow's project, the starter's role, the drill input."""

import pytest

from runs.models import Run
from tenancy.access import default_project, membership_grant
from tenancy.models import AuditEvent


def test_an_operator_starts_a_run_with_drill_input_and_lands_on_its_page(demo, operator, client):
    client.force_login(operator)
    assert "incident-fanout" in client.get("/runs/start").content.decode()
    response = client.post(
        "/runs/start", {"workflow": "incident-fanout", "goal": "", "input": '{"propose_tools": ["email.send"]}'}
    )
    run = Run.objects.get()
    assert response.status_code == 302 and response["Location"] == f"/runs/{run.id}/"
    assert run.started_by == operator and run.input["propose_tools"] == ["email.send"]
    assert AuditEvent.objects.filter(action="run_start", run=run).exists()


def test_bad_input_is_a_clear_error_and_starts_nothing(demo, operator, client):
    client.force_login(operator)
    for data, message in [
        ({"workflow": "incident-fanout", "input": "{not json"}, "not JSON"),
        ({"workflow": "incident-fanout", "input": "[1]"}, "JSON object"),
        ({"workflow": "nope", "input": "{}"}, "choose a workflow"),
        ({"workflow": "incident-fanout", "input": '{"faults": [{"task": "x", "mode": "explode"}]}'}, "faults"),
    ]:
        response = client.post("/runs/start", data)
        assert response.status_code == 400 and message in response.content.decode()
    assert not Run.objects.exists()


def test_a_viewer_cannot_start_runs(demo, client, django_user_model):
    viewer = django_user_model.objects.create_user(username="vera", password="x")
    membership_grant(user=viewer, project=default_project(), role="viewer")
    client.force_login(viewer)
    assert "may not start runs" in client.get("/runs/start").content.decode()
    response = client.post("/runs/start", {"workflow": "incident-fanout", "input": "{}"})
    assert response.status_code == 400 and not Run.objects.exists()
    client.logout()
    assert client.get("/runs/start").status_code == 302


def test_where_drill_faults_are_off_a_run_asking_for_one_is_refused(demo, settings):
    from core.errors import InvalidInput
    from runs.services import run_start

    settings.WARDEN = {**settings.WARDEN, "DRILL_FAULTS": False}
    crash = {"faults": [{"task": "verify", "at": "start", "mode": "crash"}]}
    with pytest.raises(InvalidInput, match="drill faults are turned off here"):
        run_start(workflow="deploy-review", input=crash)
    assert not Run.objects.exists()
    assert run_start(workflow="deploy-review").status == Run.Status.RUNNING  # without faults, as ever
