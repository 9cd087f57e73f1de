"""Turns a plan (static, or a planner agent's JSON) into a validated task DAG: known agents, unique
keys, known dependencies, no cycles, within the caps."""

from graphlib import CycleError, TopologicalSorter

from pydantic import ValidationError

from core.errors import InvalidInput

from .models import Agent
from .schemas import PlanIn, PlannedTaskIn
from .versions import with_latest_version


def pydantic_errors(exc: ValidationError, prefix: str = "") -> list[dict]:
    return [
        {"field": ".".join(str(p) for p in (prefix, *e["loc"]) if p != ""), "message": e["msg"]} for e in exc.errors()
    ]


def _dependency_errors(tasks: list[PlannedTaskIn], known: set[str], dead_keys: frozenset[str]) -> list[dict]:
    """A task may wait only for a task that exists and can still complete."""
    errors = [
        {"field": f"plan.tasks.{t.key}.depends_on", "message": f"unknown task {d!r}"}
        for t in tasks
        for d in t.depends_on
        if d not in known
    ]
    errors += [
        {
            "field": f"plan.tasks.{t.key}.depends_on",
            "message": f"task {d!r} will never complete (it failed or was dropped)",
        }
        for t in tasks
        for d in t.depends_on
        if d in dead_keys
    ]
    return errors


def plan_validate(
    raw,
    *,
    max_tasks: int,
    existing_keys: frozenset[str] = frozenset(),
    dead_keys: frozenset[str] = frozenset(),
    max_fanout: int | None = None,
    allowed_agents=None,
) -> tuple[list[PlannedTaskIn], dict[str, Agent]]:
    """``existing_keys``: the run's tasks so far (a new plan adds to them); ``dead_keys``: those of them
    that failed, were cancelled or superseded, which no new task may wait for (it would wait for good).
    ``max_fanout``: for a planner agent's plan, how many tasks it may add at once. ``allowed_agents``:
    for a planner agent's plan, the workflow's agents (trusted configuration); it may assign no other."""
    try:
        plan = PlanIn.model_validate(raw if isinstance(raw, dict) else {"tasks": raw})
    except ValidationError as exc:
        raise InvalidInput("the plan is malformed", pydantic_errors(exc, "plan")) from exc
    if max_fanout is not None and len(plan.tasks) > max_fanout:
        raise InvalidInput(
            f"the plan fans out to {len(plan.tasks)} tasks; a planner may add at most {max_fanout} at once"
        )
    if len(plan.tasks) + len(existing_keys) > max_tasks:
        raise InvalidInput(f"the plan has {len(plan.tasks)} tasks; this run allows at most {max_tasks}")
    keys = [t.key for t in plan.tasks]
    duplicates = sorted({k for k in keys if keys.count(k) > 1} | (set(keys) & existing_keys))
    if duplicates:
        raise InvalidInput(f"task keys used twice: {', '.join(duplicates)}")
    errors = _dependency_errors(plan.tasks, set(keys) | existing_keys, dead_keys)
    agents = {a.slug: a for a in with_latest_version(Agent.objects.filter(slug__in={t.agent for t in plan.tasks}))}
    errors += [
        {"field": f"plan.tasks.{t.key}.agent", "message": f"unknown agent {t.agent!r}"}
        for t in plan.tasks
        if t.agent not in agents
    ]
    if allowed_agents is not None:
        errors += [
            {"field": f"plan.tasks.{t.key}.agent", "message": f"agent {t.agent!r} is not one of this workflow's agents"}
            for t in plan.tasks
            if t.agent in agents and t.agent not in allowed_agents
        ]
    if errors:
        raise InvalidInput("the plan refers to unknown tasks or agents", errors)
    try:
        tuple(TopologicalSorter({t.key: set(t.depends_on) for t in plan.tasks}).static_order())
    except CycleError as exc:
        raise InvalidInput(f"the plan has a dependency cycle: {' -> '.join(exc.args[1])}") from exc
    return plan.tasks, agents
