"""Runs pinned to versions: a run records, at its start, the versions of its workflow, of every agent it
may use and the approval policies then in force, and runs on those agents to its end; editing an agent
makes a new version, used by the runs started after it; the run page and the API say which."""

from agents.models import Agent, AgentVersion, Workflow, WorkflowVersion
from agents.versions import agent_version
from policy.models import ApprovalPolicy, ApprovalRequest
from runs.models import Run, Task
from runs.services import run_start
from runs.services.execution import _apply_pinned
from tenancy.access import default_project, membership_grant
from tenancy.tokens import api_token_create
from tests.conftest import decide, wait_for
from tests.runs.test_engine import finished, scripted_workflow

MAIL = {"to": "a@x.example", "subject": "Refund issued", "body": "b"}


def artifact(run) -> dict:
    return run.artifacts.get().content


def test_saving_a_changed_agent_makes_a_version_and_an_unchanged_save_does_not(db):
    agent = Agent.objects.create(slug="writer", name="Writer", instructions="Be brief.")
    assert list(agent.versions.values_list("number", flat=True)) == [1]
    agent.save()
    assert agent.versions.count() == 1
    agent.instructions = "Be thorough."
    agent.save()
    latest = agent.versions.first()
    assert (latest.number, latest.config["instructions"]) == (2, "Be thorough.")
    # A change written around save() (a data fix) is caught when it is next used.
    Agent.objects.filter(id=agent.id).update(model="scripted-2")
    assert agent_version(Agent.objects.get(id=agent.id)).number == 3


def test_a_run_in_flight_keeps_its_agents_version_and_the_next_run_takes_the_edit(
    demo_tx, worker, django_user_model, client
):
    ApprovalPolicy.objects.create(name="mails wait", tool="email.send")
    reviewer = django_user_model.objects.create_user(username="rita", password="x-pass-123456")
    membership_grant(user=reviewer, project=default_project(), role="reviewer")
    wf = scripted_workflow(
        "pinned", [{"tool": "email.send", "arguments": MAIL}, {"final": {"written_by": "v1"}}], tools=["email.send"]
    )
    run = run_start(workflow=wf.slug)
    wait_for(lambda: ApprovalRequest.objects.filter(run=run).exists(), message="the task to wait for a reviewer")

    # Meanwhile someone edits the agent: its script now answers otherwise, and it may call nothing.
    agent = Agent.objects.get(slug="pinned-agent")
    agent.script, agent.allowed_tools = [{"final": {"written_by": "v2"}}], []
    agent.save()
    decide(request_id=ApprovalRequest.objects.get(run=run).id, user=reviewer, approve=True)
    run = finished(run)
    assert run.status == Run.Status.COMPLETED, run.status_reason
    assert artifact(run) == {"written_by": "v1"}  # the version it started with, to the end
    v1 = AgentVersion.objects.get(agent=agent, number=1)
    assert Task.objects.get(run=run).agent_version_id == v1.id
    assert run.versions["agents"] == {"pinned-agent": {"id": v1.id, "version": 1}}
    assert run.versions["workflow"]["version"] == 1
    assert [p["name"] for p in run.versions["policies"]] == [
        "Demo: the sandbox's email.send leaves without a reviewer",  # the demo project's waiver, in force too
        "mails wait",
    ]

    later = finished(run_start(workflow=wf.slug))
    assert artifact(later) == {"written_by": "v2"} and later.versions["agents"]["pinned-agent"]["version"] == 2

    # The API and the run page say which versions each run used.
    token = api_token_create(user=reviewer)[1]
    body = client.get(f"/api/v1/runs/{run.id}", HTTP_AUTHORIZATION=f"Bearer {token}").json()
    assert body["versions"]["agents"]["pinned-agent"]["version"] == 1 and body["tasks"][0]["agent_version"] == 1
    client.force_login(reviewer)
    assert "agents: pinned-agent v2" in client.get(f"/runs/{later.id}/").content.decode()


def test_a_planners_workers_run_on_the_versions_the_run_started_with(demo_tx, worker):
    """incident-fanout's workers are assigned by its planner after the start; an edit in between does
    not reach them."""
    before = {a.slug: agent_version(a).number for a in Agent.objects.filter(slug__startswith="incident-")}
    run = run_start(workflow="incident-fanout", input={})
    worker_agent = Agent.objects.get(slug="incident-worker")
    worker_agent.instructions += " (edited while the run was planning)"
    worker_agent.save()
    run = finished(run, timeout=60)
    assert run.status == Run.Status.COMPLETED, run.status_reason
    used = set(
        Task.objects.filter(run=run, agent__slug="incident-worker").values_list("agent_version__number", flat=True)
    )
    assert used == {before["incident-worker"]} and worker_agent.versions.first().number == before["incident-worker"] + 1


def test_editing_a_workflow_makes_a_version(db):
    wf = Workflow.objects.create(slug="w", name="W", tasks=[])
    wf.default_goal = "Something else"
    wf.save()
    assert list(WorkflowVersion.objects.filter(workflow=wf).values_list("number", flat=True)) == [2, 1]


def test_an_evaluation_names_the_agent_versions_it_ran_on(demo_tx, worker, operator, client):
    from evals.compare import comparison
    from evals.demo import demo_suite_load
    from evals.suites import eval_start

    suite = demo_suite_load()
    eval_start(suite=suite, user=operator)
    wait_for(lambda: Run.objects.count() == 3 and all(r.is_terminal for r in Run.objects.all()), timeout=90,
             message="the first evaluation")  # fmt: skip
    verifier = Agent.objects.get(slug="verifier-agent")
    verifier.instructions += " Check the rollback plan twice."
    verifier.save()
    eval_start(suite=suite, user=operator)
    wait_for(lambda: Run.objects.count() == 6 and all(r.is_terminal for r in Run.objects.all()), timeout=90,
             message="the second evaluation")  # fmt: skip
    _, (before, after) = comparison(suite)
    now = verifier.versions.first().number
    assert f"verifier-agent v{now - 1}" in before.versions_label and f"verifier-agent v{now}" in after.versions_label
    # …and the workflow's version each pass ran on (its edits compare the same way).
    deploy = Workflow.objects.get(slug="deploy-review").versions.first().number
    assert f"workflow deploy-review v{deploy}" in after.versions_label
    client.force_login(operator)
    assert after.versions_label in client.get(f"/evals/{suite.id}/").content.decode()


def test_a_version_pins_the_agents_endpoint_and_a_version_without_one_uses_none(db):
    agent = Agent.objects.create(slug="local", name="Local", provider="openai", model="m")
    before = agent.versions.get()
    assert "base_url" not in before.config  # versions made before endpoints keep their digests
    agent.base_url, agent.api_key_secret, agent.project = "http://10.0.0.5:8000/v1", "LOCAL_KEY", default_project()
    agent.send_max_tokens = True
    agent.save()
    pinned = agent.versions.first()
    assert pinned.number == 2
    assert {k: pinned.config[k] for k in ("base_url", "api_key_secret", "send_max_tokens", "project")} == {
        "base_url": "http://10.0.0.5:8000/v1", "api_key_secret": "LOCAL_KEY", "send_max_tokens": True,
        "project": default_project().id,
    }  # fmt: skip
    # A run started on version 1 keeps the deployment's endpoint, whatever the agent says now.
    live = Agent.objects.get(id=agent.id)
    _apply_pinned(live, before.config)
    assert live.endpoint == {"base_url": "", "api_key_secret": "", "project_id": None, "send_max_tokens": False}
    _apply_pinned(live, pinned.config)
    assert live.endpoint["base_url"] == "http://10.0.0.5:8000/v1" and live.endpoint["api_key_secret"] == "LOCAL_KEY"
