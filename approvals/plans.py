"""A planner's plan held for a reviewer (a workflow's ``approve_plans``): what it would start — its tasks,
the agents and tools they may use, the irreversible calls among them (its blast radius) — and the
decision: approved (as it is, or as a reviewer edited it while no worker had started), its tasks start;
rejected, the planner plans again with the reviewer's comment."""

import hashlib
import json

from agents.models import Agent
from core import bus
from core.errors import Conflict, InvalidInput
from policy.models import ApprovalRequest
from runs.models import Run, Task
from runs.services.plans import plan_check, plan_rejected, plan_release, workers_started
from tools.catalog import tool_spec
from tools.registry import Reversibility

from .announce import approval_requested, request_announce
from .transitions import APPROVAL_REQUEST


def plan_hash(plan) -> str:
    return hashlib.sha256(json.dumps(plan, sort_keys=True, default=str).encode()).hexdigest()


def plan_outline(run: Run, plan) -> dict:
    """The plan as a reviewer reads it: each task with its agent, objective and dependencies; the tools
    its agents may call; and the blast radius, the irreversible ones among them."""
    tasks = [t for t in (plan or {}).get("tasks", []) if isinstance(t, dict)]
    slugs = sorted({str(t.get("agent", "")) for t in tasks})
    agents = {a.slug: a for a in Agent.objects.filter(slug__in=slugs)}
    tools: dict[str, str] = {}
    for agent in agents.values():
        for name in agent.allowed_tools:
            spec = tool_spec(name, run.project_id)
            tools[name] = spec.reversibility if spec is not None else "unclassified"
    irreversible = sorted(n for n, r in tools.items() if r in (Reversibility.IRREVERSIBLE, "unclassified"))
    return {
        "tasks": [
            {
                "key": t.get("key", ""),
                "agent": t.get("agent", ""),
                "objective": str(t.get("objective", ""))[:500],
                "depends_on": list(t.get("depends_on") or []),
            }
            for t in tasks
        ],  # fmt: skip
        "tools": sorted(tools.items()),
        "irreversible": irreversible,
    }


def plan_hold(*, run: Run, task: Task, plan, now) -> ApprovalRequest:
    """The hook the engine calls (core.hooks.PLAN_HOLD) when a planner finished and its workflow holds plans."""
    bus.run_changed(run.id)
    outline = plan_outline(run, plan)
    lines = [f"Run {run.id}: plan {run.plan_version} by {task.key}, {len(outline['tasks'])} tasks"]
    lines += [f"{n}. {t['key']} ({t['agent']}): {t['objective'][:200]}" for n, t in enumerate(outline["tasks"], 1)]
    if outline["irreversible"]:
        lines.append(f"May make irreversible calls: {', '.join(outline['irreversible'])}")
    request = ApprovalRequest.objects.create(
        run=run,
        task=task,
        kind=ApprovalRequest.Kind.PLAN,
        plan=plan,
        arguments_hash=plan_hash(plan),
        summary="\n".join(lines),
        requested_by_id=run.started_by_id,  # separation of duties: whoever started the run does not approve its plan
    )
    approval_requested(request)
    return request


def plan_edit_check(request: ApprovalRequest, run: Run, edited) -> None:
    if workers_started(run):
        raise Conflict("this run's workers have started: its plan can be approved or rejected, no longer edited")
    if not isinstance(edited, dict):
        raise InvalidInput("the edited plan must be a JSON object with its tasks")
    plan_check(run, edited)  # InvalidInput with the fields at fault


def plan_decide(request: ApprovalRequest, run: Run, user, *, approve: bool, note: str, edited, now) -> None:
    """Record the outcome of a plan request (the Decision row is written by the caller) and act on it."""
    task = Task.objects.get(id=request.task_id)
    if edited is not None:
        request.plan, request.arguments_hash = edited, plan_hash(edited)
        request.save(update_fields=["plan", "arguments_hash"])
    decided = ApprovalRequest.Status.APPROVED if approve else ApprovalRequest.Status.REJECTED
    APPROVAL_REQUEST.move(request, decided, decided_at=now, decided_by=user, note=note[:4000])
    request_announce(request, "approval.decided")
    if approve:
        why = f"plan {run.plan_version} approved by {user}" + (" as edited" if edited is not None else "")
        plan_release(run=run, task=task, plan=request.plan, reason=why, now=now)
    else:
        plan_rejected(run=run, task=task, note=note, now=now)
