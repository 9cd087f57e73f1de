"""The secret catalogue (tools/secrets.py, docs/tools.md "Secrets"): WARDEN_SECRET_GRANTS says which
projects may name each secret; Warden's own settings never; no value shorter than 8 characters nor one
holding a deployment secret; one door for every use, whose refusals never tell whether an ungranted
variable exists; a bad catalogue stops the start, a weak grant is a warning of `check` and `doctor`."""

import json
import os
import subprocess
import sys
import uuid

import pytest
from django.core.checks import run_checks
from django.core.management import call_command

from runs.heartbeat import lease_keeper
from runs.models import Run
from runs.services import run_start
from tenancy.access import default_project
from tenancy.models import Project
from tests.conftest import ROOT
from tests.runs.test_engine import scripted_workflow
from tests.runs.test_run_actions import drive
from tests.tools.hostile_echo import HostileEcho
from tools.kit import ToolRefused
from tools.mcp_tools import mcp_list
from tools.models import HttpTool, McpServer
from tools.secrets import SecretRefused, secret_problems, secrets_for

KEY = f"pay-{uuid.uuid4().hex}"


def grant(settings, **grants):
    settings.WARDEN = {**settings.WARDEN, "SECRET_GRANTS": {name: list(slugs) for name, slugs in grants.items()}}


@pytest.fixture
def projects(db):
    return default_project(), Project.objects.create(slug="team-b", name="Team B")


@pytest.fixture
def echo():
    service = HostileEcho().start()
    yield service
    service.stop()


def test_a_granted_secret_is_read_for_its_project_and_refused_to_others_set_or_not(projects, settings, monkeypatch):
    home, other = projects
    monkeypatch.setenv("PAYMENTS_API_KEY", KEY)
    monkeypatch.setenv("ANOTHER_TEAMS_KEY", f"other-{uuid.uuid4().hex}")
    grant(settings, PAYMENTS_API_KEY=["default"], ANOTHER_TEAMS_KEY=["elsewhere"], UNSET_KEY=["team-b"])
    assert secrets_for(["PAYMENTS_API_KEY"], project_id=home.id) == {"PAYMENTS_API_KEY": KEY}
    refusals = {}
    for name in ("PAYMENTS_API_KEY", "ANOTHER_TEAMS_KEY", "NEVER_SET_ANYWHERE"):
        with pytest.raises(SecretRefused) as refused:
            secrets_for([name], project_id=other.id)
        refusals[name] = str(refused.value)
    # Set, set elsewhere, or unset: the same words, so a project admin learns nothing of the environment.
    assert refusals == {name: f"the secret {name} is not granted to project team-b" for name in refusals}
    # A granted secret that is not set is the project's own business: it may say so.
    assert secret_problems(["UNSET_KEY"], project_id=other.id) == [
        "the secret UNSET_KEY is not set (it is granted to project team-b)"
    ]


OWN = ["DJANGO_SECRET_KEY", "WARDEN_METRICS_TOKEN", "SECRET_KEY", "DATABASE_URL", "REDIS_URL", "EMAIL_HOST_PASSWORD",
       "OPENAI_API_KEY", "ANTHROPIC_API_KEY", "OTEL_EXPORTER_OTLP_HEADERS", "TEAM_LLM_KEY"]  # fmt: skip


@pytest.mark.parametrize("name", OWN)
def test_wardens_own_settings_are_never_given_whatever_the_grants_say(name, projects, settings, monkeypatch):
    monkeypatch.setenv(name, f"value-{uuid.uuid4().hex}")
    # The provider key variable the settings name is Warden's too.
    settings.WARDEN = {**settings.WARDEN, "OPENAI_API_KEY_ENV": "TEAM_LLM_KEY"}
    grant(settings, **{name: ["default"]})  # as if the start-up check had been bypassed
    for project_id in (projects[0].id, None):  # a project's declaration, a Python tool
        with pytest.raises(SecretRefused, match=f"the secret {name} is one of Warden's own settings"):
            secrets_for([name], project_id=project_id)


def test_a_secret_holding_a_deployment_secret_is_refused(projects, settings, monkeypatch):
    settings.WARDEN = {**settings.WARDEN, "METRICS_TOKEN": f"metrics-{uuid.uuid4().hex}"}
    values = {"COPY_OF_DJANGO_KEY": settings.SECRET_KEY, "COPY_OF_METRICS": settings.WARDEN["METRICS_TOKEN"],
              "HEADER_WITH_DJANGO_KEY": f"Bearer {settings.SECRET_KEY}"}  # fmt: skip
    for name, value in values.items():
        monkeypatch.setenv(name, value)
    grant(settings, **{name: ["default"] for name in values})
    for name, value in values.items():
        with pytest.raises(SecretRefused) as refused:
            secrets_for([name], project_id=projects[0].id)
        assert str(refused.value) == f"the secret {name} holds one of Warden's own secrets: it can never be used"
        assert value not in str(refused.value)


def test_a_secret_source_of_the_deployments_choosing_is_asked(projects, settings, monkeypatch):
    monkeypatch.delenv("VAULT_PAYMENTS_KEY", raising=False)
    settings.WARDEN = {**settings.WARDEN, "SECRET_SOURCE": f"{__name__}.vault"}
    grant(settings, VAULT_PAYMENTS_KEY=["default"])
    assert secrets_for(["VAULT_PAYMENTS_KEY"], project_id=projects[0].id) == {"VAULT_PAYMENTS_KEY": VAULT_VALUE}


VAULT_VALUE = f"vault-{uuid.uuid4().hex}"


def vault(name: str) -> str | None:
    return VAULT_VALUE if name == "VAULT_PAYMENTS_KEY" else None


# --- too short to scrub --------------------------------------------------------------------------------


def test_a_secret_shorter_than_eight_characters_is_refused_on_save_and_at_the_call(
    projects, settings, monkeypatch, echo, admin_client
):
    monkeypatch.setattr(lease_keeper, "hold", lambda task_id, token: None)
    monkeypatch.setenv("SHORT_KEY", "k3y-0ne")  # 7 characters
    grant(settings, SHORT_KEY=["default"])
    data = {"project": projects[0].id, "name": "echo.headers", "method": "GET", "url": echo.url + "/echo",
            "arguments_schema": '{"type": "object"}', "tool_class": "read_only", "reversibility": "",
            "headers": json.dumps({"X-Key": "{secret:SHORT_KEY}"}), "idempotency_header": "", "undo": "{}",
            "timeout_seconds": "5", "enabled": "on"}  # fmt: skip
    response = admin_client.post("/admin/tools/httptool/add/", data)
    page = response.content.decode()
    assert response.status_code == 200 and "SHORT_KEY is shorter than 8 characters" in page, page[:3000]
    assert "k3y-0ne" not in page and not HttpTool.objects.exists()

    # Written straight to the database, the call is refused with the reason (never the value).
    HttpTool.objects.create(project=projects[0], name="echo.headers", method="GET", url=echo.url + "/echo",
                            arguments_schema={"type": "object"}, tool_class="read_only",
                            headers={"X-Key": "{secret:SHORT_KEY}"})  # fmt: skip
    wf = scripted_workflow("short-key", [{"tool": "echo.headers", "arguments": {}}, {"final": {}}],
                           tools=["echo.headers"], max_attempts=1)  # fmt: skip
    run = drive(run_start(workflow=wf.slug))
    assert run.status == Run.Status.NEEDS_ATTENTION and "SHORT_KEY is shorter than 8" in run.status_reason
    assert "k3y-0ne" not in run.status_reason and echo.requests == []


def test_check_and_doctor_warn_of_a_granted_secret_that_every_call_would_refuse(
    transactional_db, settings, monkeypatch, capsys
):
    monkeypatch.setenv("SHORT_KEY", "k3y-0ne")
    monkeypatch.setenv("COPY_OF_DJANGO_KEY", settings.SECRET_KEY)
    monkeypatch.setenv("GOOD_KEY", KEY)
    grant(settings, SHORT_KEY=["default"], COPY_OF_DJANGO_KEY=["default"], GOOD_KEY=["default"])
    warnings = {m.msg for m in run_checks() if m.id == "warden.W101"}
    assert warnings == {
        "the granted secret SHORT_KEY is shorter than 8 characters: calls naming it are refused",
        "the granted secret COPY_OF_DJANGO_KEY holds one of Warden's own secrets: calls naming it are refused",
    }
    with pytest.raises(SystemExit):  # no worker heartbeats in a test: the doctor finds that too
        call_command("doctor")
    out = capsys.readouterr().out
    assert "warn  warden.W101: the granted secret SHORT_KEY is shorter than 8 characters" in out, out
    assert "k3y-0ne" not in out and settings.SECRET_KEY not in out


# --- the catalogue itself ------------------------------------------------------------------------------

BAD_CATALOGUES = {
    "not JSON": ("{PAYMENTS_API_KEY: [default]}", "WARDEN_SECRET_GRANTS is not JSON"),
    "not an object": ('["PAYMENTS_API_KEY"]', "WARDEN_SECRET_GRANTS must be a JSON object"),
    "not a secret name": ('{"payments key": ["default"]}', "'payments key' is not a secret name"),
    "not a list of slugs": ('{"PAYMENTS_API_KEY": "default"}', "must be a list of project slugs"),
    "a grant of Warden's own settings": (
        '{"DJANGO_SECRET_KEY": ["default"]}',
        "WARDEN_SECRET_GRANTS grants DJANGO_SECRET_KEY, one of Warden's own settings: it can never be granted",
    ),
}


@pytest.mark.anymode
@pytest.mark.parametrize("case", sorted(BAD_CATALOGUES))
def test_a_bad_catalogue_stops_the_start_with_what_is_wrong(case):
    value, reason = BAD_CATALOGUES[case]
    env = dict(os.environ, DJANGO_SETTINGS_MODULE="config.settings.test", WARDEN_SECRET_GRANTS=value)
    done = subprocess.run([sys.executable, "manage.py", "check"], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=120)  # fmt: skip
    assert done.returncode != 0
    assert "ImproperlyConfigured" in done.stderr and reason in done.stderr, done.stderr[-2000:]


@pytest.mark.anymode
def test_a_good_catalogue_is_read_from_the_environment():
    env = dict(os.environ, DJANGO_SETTINGS_MODULE="config.settings.test",
               WARDEN_SECRET_GRANTS='{"PAYMENTS_API_KEY": ["default", "team-b"]}')  # fmt: skip
    snippet = "import django, json; django.setup(); from django.conf import settings; " \
              "print(json.dumps(settings.WARDEN['SECRET_GRANTS']))"  # fmt: skip
    done = subprocess.run([sys.executable, "-c", snippet], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads(done.stdout.splitlines()[-1]) == {"PAYMENTS_API_KEY": ["default", "team-b"]}


# --- every use, through the one door ------------------------------------------------------------------


def test_a_grant_taken_back_stops_the_tool_at_its_next_call(projects, settings, monkeypatch, echo):
    monkeypatch.setattr(lease_keeper, "hold", lambda task_id, token: None)
    monkeypatch.setenv("PAYMENTS_API_KEY", KEY)
    grant(settings, PAYMENTS_API_KEY=["default"])
    HttpTool.objects.create(project=projects[0], name="echo.headers", method="GET", url=echo.url + "/echo",
                            arguments_schema={"type": "object"}, tool_class="read_only",
                            headers={"X-Pay": "{secret:PAYMENTS_API_KEY}"})  # fmt: skip
    wf = scripted_workflow("granted", [{"tool": "echo.headers", "arguments": {}}, {"final": {}}],
                           tools=["echo.headers"], max_attempts=1)  # fmt: skip
    assert drive(run_start(workflow=wf.slug)).status == Run.Status.COMPLETED
    assert echo.received().count(KEY) == 1

    grant(settings)  # the deployment takes it back
    run = drive(run_start(workflow=wf.slug))
    assert run.status == Run.Status.NEEDS_ATTENTION
    assert "the secret PAYMENTS_API_KEY is not granted to project default" in run.status_reason
    assert echo.received().count(KEY) == 1  # nothing more was sent


def test_an_mcp_server_on_a_host_no_longer_allowed_is_refused_at_the_listing(projects, settings, echo):
    server = McpServer(project=projects[0], name="helpdesk", transport="http", url=echo.url + "/mcp")
    settings.WARDEN = {**settings.WARDEN, "HTTP_TOOL_HOSTS": ["tickets.internal"]}
    with pytest.raises(ToolRefused, match="not one this deployment allows"):
        mcp_list(server)
    assert echo.requests == []
