"""`manage.py run_evals` in CI: a suite passes, someone edits an agent's instructions, and the next pass
exits 1 naming the case the change broke. The agent runs on a model behind the OpenAI protocol that
follows its instructions (a local server), so the change really changes what the run does."""

import json

import pytest
from django.core.management import CommandError, call_command

from agents.models import Agent, ModelPrice, Workflow
from evals.models import EvalCase, EvalRun, EvalSuite
from runs.models import Run
from tenancy.access import default_project
from tests.agents.test_model_providers import completion, provider  # noqa: F401  (the fixture)

CHECKS = [
    {"status": "completed"},
    {"artifact": "review", "schema": {"type": "object", "required": ["decision"]}},
    {"artifact": "review", "path": "decision", "equals": "approve"},
]


@pytest.fixture
def suite(transactional_db, provider):  # noqa: F811
    # The model does what its system message says: approve, unless told to reject.
    provider.respond = lambda body: completion(
        content=json.dumps({"decision": "reject" if "reject" in body["messages"][0]["content"].lower() else "approve"})
    )
    ModelPrice.objects.create(provider="openai", model="gpt-test", input_usd_per_mtok="2.5", output_usd_per_mtok="10")
    Agent.objects.create(slug="gpt-reviewer", name="Reviewer", provider="openai", model="gpt-test",
                         instructions="Approve a deploy whose rollback was tested.", output_schema={"type": "object"},
                         max_attempts=1)  # fmt: skip
    workflow = Workflow.objects.create(
        slug="gpt-review", name="Review", tasks=[{"key": "review", "agent": "gpt-reviewer", "objective": "Review it"}]
    )
    suite = EvalSuite.objects.create(slug="reviews", name="Reviews", project=default_project())
    EvalCase.objects.create(suite=suite, name="approves a tested rollback", workflow=workflow, checks=CHECKS)
    EvalCase.objects.create(suite=suite, name="finishes", workflow=workflow, checks=[{"status": "completed"}])
    return suite


def test_an_instruction_change_that_breaks_a_case_makes_run_evals_exit_1(suite, worker, capsys):
    call_command("run_evals", "reviews", "--timeout", "120")
    first = capsys.readouterr().out
    assert "no failure: evaluation run" in first and "passed  approves a tested rollback" in first

    agent = Agent.objects.get(slug="gpt-reviewer")
    agent.instructions = "Reject every deploy on a Friday; today is Friday."
    agent.save()  # a new version of the agent: the next pass runs on it

    with pytest.raises(CommandError) as failed:
        call_command("run_evals", "reviews", "--timeout", "120")
    assert failed.value.returncode == 1
    assert str(failed.value) == "1 case(s) failed: approves a tested rollback (regressed)"
    out = capsys.readouterr().out
    assert "FAILED  approves a tested rollback" in out and "review.decision is 'reject', not 'approve'" in out
    assert "passed  finishes" in out  # the case the change did not break
    first_pass, second_pass = EvalRun.objects.order_by("id")
    versions = {r.run.versions["agents"]["gpt-reviewer"]["version"] for r in second_pass.results.all()}
    assert versions == {2} and second_pass.trigger == "run_evals"
    assert first_pass.accepted and not second_pass.accepted
    # Against a pinned pass where it failed too, the case still fails the command.
    with pytest.raises(CommandError) as again:
        call_command("run_evals", "reviews", "--baseline", str(second_pass.id), "--timeout", "120")
    assert again.value.returncode == 1
    assert str(again.value) == "1 case(s) failed: approves a tested rollback (failed before too)"
    assert Run.objects.filter(status="completed").count() == 6


def test_running_a_red_job_again_does_not_turn_it_green(suite, worker, capsys):
    """CI re-runs a failed job: the case that failed the first time fails the second, compared with the last
    accepted pass (not with the red one), however often it is re-run."""
    call_command("run_evals", "reviews", "--timeout", "120")
    accepted = EvalRun.objects.get()
    agent = Agent.objects.get(slug="gpt-reviewer")
    agent.instructions = "Reject every deploy on a Friday; today is Friday."
    agent.save()
    outs = []
    for _ in range(2):
        with pytest.raises(CommandError) as failed:
            call_command("run_evals", "reviews", "--timeout", "120")
        assert failed.value.returncode == 1 and "approves a tested rollback" in str(failed.value)
        outs.append((str(failed.value), capsys.readouterr().out))
    for message, out in outs:
        assert f"against evaluation run {accepted.id} (current agents, accepted)" in out
        assert message == "1 case(s) failed: approves a tested rollback (regressed)"
    # The deprecated alias means the same: the last accepted pass.
    with pytest.raises(CommandError) as alias:
        call_command("run_evals", "reviews", "--baseline", "previous", "--timeout", "120")
    assert alias.value.returncode == 1
    captured = capsys.readouterr()
    assert "--baseline previous is deprecated: it means --baseline accepted" in captured.err
    assert f"against evaluation run {accepted.id} (current agents, accepted)" in captured.out
    assert list(EvalRun.objects.filter(accepted=True)) == [accepted]


def test_only_a_case_the_suite_quarantines_is_forgiven(suite, worker, capsys):
    agent = Agent.objects.get(slug="gpt-reviewer")
    agent.instructions = "Reject every deploy on a Friday; today is Friday."
    agent.save()
    with pytest.raises(CommandError):
        call_command("run_evals", "reviews", "--timeout", "120")  # no accepted pass yet: it fails all the same
    known = EvalCase.objects.get(name="approves a tested rollback")
    suite.quarantine.add(known)  # named explicitly as a known failure
    call_command("run_evals", "reviews", "--timeout", "120")
    out = capsys.readouterr().out
    assert "failed  approves a tested rollback" in out and "quarantined: forgiven" in out
    assert "no failure: evaluation run" in out
    assert EvalRun.objects.order_by("id").last().accepted
    # Another case failing is not forgiven by that quarantine.
    EvalCase.objects.filter(name="finishes").update(checks=[{"status": "failed"}])
    with pytest.raises(CommandError) as failed:
        call_command("run_evals", "reviews", "--timeout", "120")
    assert str(failed.value) == "1 case(s) failed: finishes (regressed)"


def test_run_evals_refuses_an_unknown_suite_version_or_baseline(suite):
    for args in (["nope"], ["reviews", "--model-version", "nope"], ["reviews", "--baseline", "999"]):
        with pytest.raises(CommandError) as refused:
            call_command("run_evals", *args)
        assert refused.value.returncode == 2
    assert not Run.objects.exists() and not EvalRun.objects.exists()


def test_a_new_version_of_an_agent_workflow_or_policy_runs_the_suites_that_name_it(
    demo, django_capture_on_commit_callbacks
):
    from evals.demo import demo_suite_load
    from policy.models import ApprovalPolicy

    suite = demo_suite_load()
    suite.rerun_on = ["agent:verifier-agent", "workflow:deploy-review", "policy:deploys need a reviewer"]
    suite.save(update_fields=["rerun_on"])
    verifier = Agent.objects.get(slug="verifier-agent")
    with django_capture_on_commit_callbacks(execute=True):
        verifier.save()  # nothing changed: no new version, no pass
        Agent.objects.filter(slug="risk-agent").update(name="Risk")  # not named by the suite
        Agent.objects.get(slug="risk-agent").save()
    assert not EvalRun.objects.exists()
    with django_capture_on_commit_callbacks(execute=True):
        verifier.instructions = "Be stricter."
        verifier.save()
        workflow = Workflow.objects.get(slug="deploy-review")
        workflow.default_goal = "Assess it again"
        workflow.save()
        ApprovalPolicy.objects.create(name="deploys need a reviewer", tool="deployments.read")
    triggers = list(EvalRun.objects.order_by("id").values_list("trigger", flat=True))
    assert triggers == [
        f"new version: agent verifier-agent v{verifier.versions.first().number}",
        f"new version: workflow deploy-review v{workflow.versions.first().number}",
        "new version: policy deploys need a reviewer (saved)",
    ]
    assert Run.objects.count() == 9  # three cases each
