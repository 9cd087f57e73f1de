"""The blackboard: a run's tasks share typed, versioned knowledge; writers use compare-and-set, a
verifier other than the author verifies, and prompts carry only verified, unexpired entries."""

from django.utils import timezone

from agents.models import Agent, Workflow
from runs.blackboard import knowledge, memory_tool_call
from runs.models import BlackboardEntry, Run
from runs.services import run_start
from tests.conftest import wait_for

SUMMARY = {"type": "object", "required": ["summary"], "properties": {"summary": {"type": "string"}}}


def agent(slug, script, tools=()):
    return Agent.objects.create(slug=slug, name=slug, script=script, allowed_tools=list(tools), output_schema=SUMMARY)


def test_a_fact_written_by_one_task_and_verified_by_another_reaches_a_third(transactional_db, worker):
    write = {"key": "region", "kind": "text", "value": "eu-west-1", "expected_version": 0, "sources": []}
    guess = {"key": "owner", "kind": "text", "value": "someone", "expected_version": 0}
    agent("scout", [{"tool": "blackboard.write", "arguments": write}, {"tool": "blackboard.write", "arguments": guess},
                    {"final": {"summary": "found it"}}], tools=["blackboard.write"])  # fmt: skip
    verify = {"key": "region", "version": 1, "verdict": "verified"}
    agent("checker", [{"tool": "blackboard.verify", "arguments": verify}, {"final": {"summary": "checked"}}],
          tools=["blackboard.verify"])  # fmt: skip
    agent("user", [{"final": {"summary": "deploying to {known[region]}; known: {known}"}}])
    Workflow.objects.create(slug="facts", name="facts", tasks=[
        {"key": "scout", "agent": "scout", "objective": "Find the region"},
        {"key": "check", "agent": "checker", "objective": "Check it", "depends_on": ["scout"]},
        {"key": "use", "agent": "user", "objective": "Use it", "depends_on": ["check"]},
    ])  # fmt: skip
    run = run_start(workflow="facts")
    wait_for(lambda: Run.objects.get(id=run.id).is_terminal, timeout=30, message="the run")

    assert Run.objects.get(id=run.id).status == "completed"
    used = run.artifacts.get(task__key="use").content["summary"]
    assert used.startswith("deploying to eu-west-1") and "owner" not in used  # the unverified guess stays out
    region = BlackboardEntry.objects.get(run=run, key="region")
    assert (region.version, region.verification, region.verified_by) == (1, "verified", "check")
    assert region.author_task.key == "scout"


def test_two_writers_of_the_same_version_one_wins_the_other_is_told(demo):
    run = run_start(workflow="deploy-review")
    inventory, risk = run.tasks.get(key="inventory"), run.tasks.get(key="risk")
    for task in (inventory, risk):
        task.allowed_tools = ["blackboard.write", "blackboard.verify"]
    write = {"key": "pods", "kind": "number", "value": 12, "expected_version": 0}
    first = memory_tool_call(run=run, task=inventory, step=3, name="blackboard.write", arguments=write)
    second = memory_tool_call(run=run, task=risk, step=1, name="blackboard.write", arguments={**write, "value": 11})
    assert first.result == {"key": "pods", "version": 1, "verification": "unverified"}
    assert second.error["code"] == "version_conflict" and second.error["current_version"] == 1
    # The same step again (a retry after a crash): the version it wrote, not a second one.
    again = memory_tool_call(run=run, task=inventory, step=3, name="blackboard.write", arguments=write)
    assert again.result["version"] == 1 and BlackboardEntry.objects.filter(run=run).count() == 1
    # Typed: a number stays a number; a task may not verify its own entry; tools outside the allowlist refused.
    wrong = memory_tool_call(run=run, task=risk, step=2, name="blackboard.write",
                             arguments={**write, "expected_version": 1, "kind": "text", "value": "12"})  # fmt: skip
    assert wrong.error["code"] == "invalid_arguments" and "holds a number" in wrong.error["message"]
    own = {"key": "pods", "version": 1, "verdict": "verified"}
    assert memory_tool_call(run=run, task=inventory, step=4, name="blackboard.verify", arguments=own).error["code"] == (
        "not_allowed"
    )
    risk.allowed_tools = []
    refused = memory_tool_call(run=run, task=risk, step=3, name="blackboard.verify", arguments=own)
    assert refused.error["code"] == "not_allowed" and BlackboardEntry.objects.get().verification == "unverified"


def test_prompts_carry_the_latest_verified_unexpired_version_only(demo):
    run = run_start(workflow="deploy-review")
    task = run.tasks.get(key="inventory")
    past = timezone.now() - timezone.timedelta(minutes=1)
    rows = [("a", 1, "verified", None), ("a", 2, "verified", None), ("a", 3, "unverified", None),
            ("b", 1, "rejected", None), ("c", 1, "verified", past)]  # fmt: skip
    for key, version, verification, expires in rows:
        BlackboardEntry.objects.create(run=run, key=key, version=version, kind="text", value=f"{key}{version}",
                                       author_task=task, verification=verification, verified_by="risk",
                                       expires_at=expires)  # fmt: skip
    assert [(k["key"], k["version"], k["value"], k["by"]) for k in knowledge(run.id)] == [("a", 2, "a2", "inventory")]
