"""core.hooks: each upward call is a typed hook declared once, provided once, and named in the architecture
doc; a call nobody provides raises, and a provider that could not take the hook's arguments is refused."""

from pathlib import Path

import pytest
from django.core.exceptions import ImproperlyConfigured

from core import hooks

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.anymode
HOOKS = {name: value for name, value in vars(hooks).items() if isinstance(value, hooks.Hook)}


@hooks.hook
def ASK(question: str, /, *, loud: bool = False) -> str:
    """A hook of this test only."""
    raise NotImplementedError


def test_every_hook_is_listed_by_name_in_the_architecture_doc():
    doc = (ROOT / "docs" / "architecture.md").read_text()
    assert HOOKS and all(hook.name == name for name, hook in HOOKS.items())
    missing = sorted(name for name in HOOKS if f"`{name}`" not in doc)
    assert missing == [], f"docs/architecture.md (core.hooks) does not list: {missing}"


def test_every_hook_has_its_provider_once_the_apps_are_ready():
    assert sorted(name for name, hook in HOOKS.items() if hook not in hooks._providers) == []


def test_a_call_nobody_provides_raises():
    with pytest.raises(ImproperlyConfigured, match="nothing provides ASK"):
        hooks.call(ASK, "why?")


def test_the_provider_answers_with_the_callers_arguments(monkeypatch):
    monkeypatch.setattr(hooks, "_providers", {})
    hooks.provide(ASK, lambda question, *, loud=False: question.upper() if loud else question)
    assert hooks.call(ASK, "why?", loud=True) == "WHY?"


@pytest.mark.parametrize(
    "provider",
    [
        lambda *, question, loud=False: question,  # the hook passes question by position
        lambda question: question,  # nor takes loud
        lambda question, *, loud=False, extra: question,  # needs an argument nobody passes
    ],
)
def test_a_provider_that_cannot_take_the_hooks_arguments_is_refused_at_start_up(monkeypatch, provider):
    monkeypatch.setattr(hooks, "_providers", {})
    with pytest.raises(ImproperlyConfigured, match="cannot provide <hook ASK"):
        hooks.provide(ASK, provider)
    assert hooks._providers == {}


def test_a_hook_says_how_each_argument_is_passed():
    def either(run, reason: str) -> int:
        raise NotImplementedError

    with pytest.raises(TypeError, match="positional-only"):
        hooks.hook(either)
