"""The scripted provider plays an agent's turns deterministically, with injectable failures."""

import pytest

from agents.gateway import ModelRequest, model_complete
from core.errors import StepFailure, TransientFailure


def ask(script, turn=1, attempt=1, **context):
    request = ModelRequest(
        agent_slug="a", instructions="", prompt="p" * 400, turn=turn, attempt=attempt, context=context
    )
    return model_complete(provider="scripted", script=script, model="scripted-1", request=request)


def test_turns_are_played_in_order_and_repeat_stands_for_several_calls():
    script = [{"say": "a", "repeat": 2}, {"tool": "crm.read", "arguments": {"customer_id": "c-{turn}"}}, {"final": {}}]
    assert [ask(script, turn=t).text for t in (1, 2)] == ["a", "a"]
    assert ask(script, turn=3).tool_call == {"name": "crm.read", "arguments": {"customer_id": "c-3"}}
    assert ask(script, turn=4).final == {} and ask(script, turn=9).final == {}


def test_a_turn_quotes_dependencies_and_the_last_tool_result():
    response = ask(
        [{"final": {"v": "{deps[inventory][summary]} / {last[version]}"}}],
        deps={"inventory": {"summary": "ok"}},
        last={"version": "v43"},
    )
    assert response.final == {"v": "ok / v43"}
    assert response.tokens_in == 100 and response.cost_micros > 0


def test_templates_cannot_reach_attributes():
    with pytest.raises(StepFailure, match="attribute access is not allowed"):
        ask([{"final": {"v": "{last.__class__}"}}], last={})


def test_failures_happen_on_the_attempts_they_name():
    script = [{"fail": "transient", "on_attempts": [1], "message": "model timeout", "final": {"ok": True}}]
    with pytest.raises(TransientFailure, match="model timeout"):
        ask(script, attempt=1)
    assert ask(script, attempt=2).final == {"ok": True}
    with pytest.raises(StepFailure) as permanent:
        ask([{"fail": "error"}])
    assert permanent.value.failure_class == "permanent"


def test_an_unknown_provider_is_a_validation_error():
    with pytest.raises(StepFailure, match="unknown model provider"):
        model_complete(
            provider="nope",
            script=[],
            model="m",
            request=ModelRequest(agent_slug="a", instructions="", prompt="", turn=1, attempt=1),
        )
