"""Builds an agent's prompt from its own task, never from a shared transcript."""

import json

from .conversation import shrink

RECENT_STEPS_IN_PROMPT = 8
VALUE_PREVIEW_CHARS = 300


def _preview(value, limit: int | None = None) -> str:
    """A value for the prompt: cut at VALUE_PREVIEW_CHARS (a scripted agent's prompt), or, with a
    ``limit`` (a real model's), whole while it fits and trimmed by its structure, visibly, past it."""
    text = json.dumps(value, sort_keys=True, default=str)
    if limit is not None:
        return text if len(text) <= limit else json.dumps(shrink(value, limit), sort_keys=True, default=str)
    return text if len(text) <= VALUE_PREVIEW_CHARS else text[:VALUE_PREVIEW_CHARS] + "…"


def _step_record(entry: dict) -> str:
    if "preview" not in entry:  # computed once per step, not once per prompt
        body = entry["body"]
        if isinstance(body, dict):  # what was sent, how often, from where: not part of the step's record
            body = {k: v for k, v in body.items() if k not in ("request", "retries", "cached", "replay")}
        entry["preview"] = f"Step {entry['step']} {entry['kind']} {entry['name']}: {_preview(body)}"
    return entry["preview"]


def build_prompt(
    *,
    objective: str,
    output_schema: dict,
    dependencies: dict,
    journal: list[dict],
    budget_chars: int | None = None,
    knowledge: list[dict] | None = None,
    world: list[str] | None = None,
    value_chars: int | None = None,
) -> str:
    """Objective, output schema, short previews of the dependency artifacts, and a compact record of
    this task's own recent steps: at most RECENT_STEPS_IN_PROMPT of them, newest kept, within the
    context budget (CONTEXT_CHARS), the oldest records dropped first. The prompt's size stays bounded
    however many steps the task has taken."""
    budget_chars = _budget(budget_chars)
    head = prompt_head(
        objective=objective,
        output_schema=output_schema,
        dependencies=dependencies,
        budget_chars=budget_chars,
        knowledge=knowledge,
        world=world,
        value_chars=value_chars,
    )
    return prompt_with_steps(head, journal, budget_chars)


def _budget(budget_chars: int | None) -> int:
    if budget_chars is not None:
        return budget_chars
    from django.conf import settings

    return settings.WARDEN["CONTEXT_CHARS"]


def prompt_head(
    *,
    objective: str,
    output_schema: dict,
    dependencies: dict,
    budget_chars: int | None = None,
    knowledge: list[dict] | None = None,
    world: list[str] | None = None,
    value_chars: int | None = None,
) -> list[str]:
    """The prompt's parts that an attempt does not change (its task, inputs, knowledge and world): an
    attempt builds them once, not at every turn (build_prompt's first half)."""
    budget_chars = _budget(budget_chars)
    parts = [f"Objective: {objective}", f"Output schema: {json.dumps(output_schema, sort_keys=True)}"]
    for key, content in sorted(dependencies.items()):
        parts.append(f"Input from {key}: {_preview(content, value_chars)}")
    for entry in knowledge or []:  # verified blackboard entries only (runs/blackboard.py)
        source = f", from artifacts {entry['sources']}" if entry["sources"] else ""
        what = f"{entry['key']} v{entry['version']} = {_preview(entry['value'], value_chars)}"
        parts.append(f"Known (verified by {entry['verified_by']}): {what} (by {entry['by']}{source}, {entry['at']})")
    if world:  # a re-planner's world state (runs/services/replan.py): at most half the budget
        room = budget_chars // 2 - sum(len(p) + 1 for p in parts)
        head, *rest = world
        kept_world, dropped = [], 0
        for line in reversed(rest):  # tasks, then the latest side effects, matter most
            if len(line) + 1 > room:
                dropped += 1
                continue
            kept_world.append(line)
            room -= len(line) + 1
        parts.append(head)
        if dropped:
            parts.append(f"- ({dropped} lines of the world state omitted for the context budget)")
        parts.extend(reversed(kept_world))
    return parts


def prompt_with_steps(head: list[str], journal: list[dict], budget_chars: int | None = None) -> str:
    """``head`` (prompt_head) and the task's recent steps, newest kept, within the budget (build_prompt's
    second half)."""
    parts = list(head)
    room = _budget(budget_chars) - sum(len(p) + 1 for p in parts)
    kept: list[str] = []
    for entry in reversed(journal[-RECENT_STEPS_IN_PROMPT:]):
        record = _step_record(entry)
        if kept and len(record) + 1 > room:  # the newest step is always kept: the model must see it
            break
        kept.append(record)
        room -= len(record) + 1
    if len(journal) > len(kept):
        parts.append(f"({len(journal) - len(kept)} earlier steps omitted)")
    parts.extend(reversed(kept))
    return "\n".join(parts)
