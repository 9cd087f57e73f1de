"""Budgets for runs of agents that run elsewhere: steps, tokens, tool calls, cost and the deadline are
checked when the agent reports and when it asks to call; past one, its call is refused with the reason
(409 budget_exceeded), nothing is recorded for it, and the run needs attention until a person raises the
budget and resumes it."""

import time

from runs.models import Run
from runs.services.runs import run_resume
from tests.integrations.test_external_agent import call, people  # noqa: F401  (the fixture)
from tools.models import ToolOperation

INTENT = {"task": "refund", "step": 2, "tool": "payments.refund", "arguments": {"charge": "ch_1"},
          "tool_class": "idempotent_write", "reversibility": "reversible"}  # fmt: skip


def start(client, agent, budget) -> int:
    run = call(client, agent, "/api/v1/runs", {"workflow": "external-agent", "budget": budget}).json()
    assert (
        call(client, agent, f"/api/v1/runs/{run['id']}/tasks", {"key": "refund", "agent": "billing"}).status_code == 201
    )
    return run["id"]


def span(tokens: int, kind: str = "model_call", cost: float = 0.0) -> dict:
    return {"task": "refund", "kind": kind, "name": "gpt-x", "started_at": "2026-01-01T00:00:00Z",
            "tokens_in": tokens, "tokens_out": 0, "cost_usd": cost}  # fmt: skip


def test_a_report_past_the_token_budget_is_kept_and_the_run_waits_for_a_person(people, client, operator):  # noqa: F811
    agent, _ = people
    run_id = start(client, agent, {"max_tokens": 1000})
    assert call(client, agent, f"/api/v1/runs/{run_id}/spans", span(800)).status_code == 201
    assert call(client, agent, f"/api/v1/runs/{run_id}/spans", span(400)).status_code == 201  # it happened
    run = Run.objects.get(id=run_id)
    assert run.status == Run.Status.NEEDS_ATTENTION and "tokens (1200 of 1000)" in run.status_reason
    refused = call(client, agent, f"/api/v1/runs/{run_id}/operations", INTENT)
    assert refused.status_code == 409 and "tokens (1200 of 1000)" in refused.json()["message"]
    assert not ToolOperation.objects.filter(run_id=run_id).exists()

    # A person raises the budget and resumes: the agent goes on.
    Run.objects.filter(id=run_id).update(max_tokens=5000)
    run_resume(run_id=run_id, actor=operator)
    assert call(client, agent, f"/api/v1/runs/{run_id}/operations", INTENT).status_code == 201


def test_a_call_past_the_tool_call_budget_is_refused_with_the_reason(people, client):  # noqa: F811
    agent, _ = people
    run_id = start(client, agent, {"max_tool_calls": 1})
    assert call(client, agent, f"/api/v1/runs/{run_id}/spans", span(10, kind="tool_call")).status_code == 201
    refused = call(client, agent, f"/api/v1/runs/{run_id}/operations", INTENT)
    body = refused.json()
    assert (refused.status_code, body["code"]) == (409, "budget_exceeded")
    assert "tool_calls (1 of 1)" in body["message"] and "needs attention" in body["message"]
    assert Run.objects.get(id=run_id).status == Run.Status.NEEDS_ATTENTION
    assert not ToolOperation.objects.filter(run_id=run_id).exists()


def test_cost_steps_and_the_deadline_are_budgets_too(people, client):  # noqa: F811
    agent, _ = people
    cost = start(client, agent, {"max_cost_usd": 0.01})
    call(client, agent, f"/api/v1/runs/{cost}/spans", span(10, cost=0.02))
    assert "cost_usd (0.020000 of 0.010000)" in Run.objects.get(id=cost).status_reason

    steps = start(client, agent, {"max_steps": 1})
    call(client, agent, f"/api/v1/runs/{steps}/spans", span(10))
    refused = call(client, agent, f"/api/v1/runs/{steps}/operations", INTENT)
    assert refused.json()["code"] == "budget_exceeded" and "steps (1 of 1)" in refused.json()["message"]

    late = start(client, agent, {"deadline_seconds": 1})
    time.sleep(1.2)
    refused = call(client, agent, f"/api/v1/runs/{late}/operations", INTENT)
    assert refused.json()["code"] == "budget_exceeded" and "deadline" in refused.json()["message"]
    assert Run.objects.get(id=late).status == Run.Status.NEEDS_ATTENTION


def test_within_the_budget_nothing_changes(people, client):  # noqa: F811
    agent, _ = people
    run_id = start(client, agent, {"max_tokens": 1000, "max_tool_calls": 2, "max_steps": 5})
    assert call(client, agent, f"/api/v1/runs/{run_id}/spans", span(500)).status_code == 201
    assert call(client, agent, f"/api/v1/runs/{run_id}/operations", INTENT).status_code == 201
    assert Run.objects.get(id=run_id).status == Run.Status.RUNNING
