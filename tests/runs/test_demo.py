"""What a newcomer does first: `./warden demo` prints two logins, one starts a propose-mode run from a
drill of the start page and the other approves it; the pages have a favicon and read arguments as JSON."""

import re
from io import StringIO

from django.contrib.staticfiles import finders
from django.core.management import call_command
from django.test import Client

from policy.models import ApprovalRequest
from runs.models import Run
from tests.conftest import wait_for
from tools.models import SandboxCall


def _logins() -> dict:
    out = StringIO()
    call_command("setup_demo", stdout=out)
    return dict(re.findall(r"^(\w+) login: username \w+, password (\S+)$", out.getvalue(), re.M))


def _logged_in(username: str, password: str) -> Client:
    client = Client()
    response = client.post("/login/", {"username": username, "password": password})
    assert response.status_code == 302, f"{username} could not log in"
    return client


def test_the_demo_prints_two_logins_and_the_second_approves_what_the_first_started(transactional_db, worker):
    logins = _logins()
    assert set(logins) == {"demo", "reviewer"}
    assert _logins() == logins  # set up again: the same logins, still working
    starter = _logged_in("demo", logins["demo"])
    page = starter.get("/runs/start").content.decode()
    assert "incident-fanout: the e-mails wait for one approval (propose mode)" in page
    started = starter.post("/runs/start", {"drill": "fanout-propose", "workflow": "", "input": ""})
    assert started.status_code == 302
    run = Run.objects.get(id=int(started["Location"].rstrip("/").rsplit("/", 1)[1]))
    assert run.input["propose_tools"] == ["email.send"] and not run.input["faults"]
    wait_for(
        lambda: Run.objects.get(id=run.id).status == Run.Status.WAITING_FOR_APPROVAL, timeout=60, message="proposals"
    )
    request = ApprovalRequest.objects.get(run=run, parent=None)

    # The starter sees why they may not decide, before any click, and no buttons.
    own = starter.get("/approvals/").content.decode()
    assert f'id="request-{request.id}"' in own
    assert "another reviewer decides" in own and 'value="approve"' not in own

    reviewer = _logged_in("reviewer", logins["reviewer"])
    queue = reviewer.get("/approvals/").content.decode()
    assert 'value="approve"' in queue
    assert "&quot;to&quot;:" in queue and "{&#x27;to&#x27;" not in queue  # JSON, not a Python repr
    decided = reviewer.post(
        f"/approvals/{request.id}/decide",
        {"decision": "approve", "arguments_hash": request.arguments_hash, "note": "looks right"},
    )
    assert decided.status_code == 200 and "Approved by reviewer" in decided.content.decode()
    wait_for(lambda: Run.objects.get(id=run.id).status == Run.Status.COMPLETED, timeout=60, message="the run")
    assert SandboxCall.objects.filter(tool="email.send", is_effect=True).count() == 5


def test_a_viewer_sees_why_they_cannot_decide_instead_of_buttons(transactional_db, worker, django_user_model):
    from tenancy.access import default_project, membership_grant

    logins = _logins()
    viewer = django_user_model.objects.create_user(username="vera", password="vera-pass-1234")
    membership_grant(user=viewer, project=default_project(), role="viewer")
    starter = _logged_in("demo", logins["demo"])
    starter.post("/runs/start", {"drill": "fanout-propose"})
    wait_for(lambda: ApprovalRequest.objects.filter(status="pending").exists(), timeout=60, message="proposals")
    page = _logged_in("vera", "vera-pass-1234").get("/approvals/").content.decode()
    assert "does not decide approvals (reviewers and admins do)" in page and 'value="approve"' not in page


def test_an_unknown_drill_is_refused_and_starts_nothing(db, client, operator):
    client.force_login(operator)
    response = client.post("/runs/start", {"drill": "rm -rf", "workflow": "", "input": "{}"})
    assert response.status_code == 400 and "choose one of the drills listed" in response.content.decode()
    assert not Run.objects.exists()


def test_every_page_has_a_favicon(db, client):
    response = client.get("/favicon.ico")
    assert response.status_code == 302
    assert response["Location"].endswith("warden/favicon.svg") and finders.find("warden/favicon.svg")
    assert 'rel="icon"' in client.get("/login/").content.decode()
