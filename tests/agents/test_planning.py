"""Plans become DAGs only when valid: known agents and tasks, unique keys, no cycle, within the caps."""

import pytest

from agents.planning import plan_validate
from core.errors import InvalidInput


def plan(*tasks):
    return {"tasks": [{"agent": "w", "objective": "x", **t} for t in tasks]}


@pytest.fixture
def agent(db):
    from agents.models import Agent

    return Agent.objects.create(slug="w", name="w")


def test_a_valid_plan(agent):
    tasks, agents = plan_validate(plan({"key": "a"}, {"key": "b", "depends_on": ["a"]}), max_tasks=5)
    assert [t.key for t in tasks] == ["a", "b"] and set(agents) == {"w"}


@pytest.mark.parametrize(
    "raw, message",
    [
        (plan({"key": "a", "depends_on": ["b"]}, {"key": "b", "depends_on": ["a"]}), "dependency cycle"),
        (plan({"key": "a"}, {"key": "a"}), "task keys used twice: a"),
        (plan({"key": "a", "depends_on": ["ghost"]}), "unknown tasks or agents"),
        (plan({"key": "a", "agent": "nobody"}), "unknown tasks or agents"),
        (plan(*({"key": f"t{i}"} for i in range(6))), "at most 5"),
        ({"tasks": []}, "malformed"),
        ({"tasks": [{"key": "bad key!", "agent": "w", "objective": "x"}]}, "malformed"),
        ("not a plan", "malformed"),
    ],
)
def test_invalid_plans_are_refused_with_a_reason(agent, raw, message):
    with pytest.raises(InvalidInput, match=message):
        plan_validate(raw, max_tasks=5)
