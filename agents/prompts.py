"""Builds an agent's prompt from its own task, never from a shared transcript."""

import json

RECENT_STEPS_IN_PROMPT = 8
VALUE_PREVIEW_CHARS = 300


def _preview(value) -> str:
    text = json.dumps(value, sort_keys=True, default=str)
    return text if len(text) <= VALUE_PREVIEW_CHARS else text[:VALUE_PREVIEW_CHARS] + "…"


def build_prompt(*, objective: str, output_schema: dict, dependencies: dict, journal: list[dict]) -> str:
    """Objective, output schema, the dependency artifacts, and a compact record of this task's own
    recent steps: the prompt's size stays bounded however many steps the task has taken."""
    parts = [f"Objective: {objective}", f"Output schema: {json.dumps(output_schema, sort_keys=True)}"]
    for key, content in sorted(dependencies.items()):
        parts.append(f"Input from {key}: {_preview(content)}")
    if journal:
        older = len(journal) - RECENT_STEPS_IN_PROMPT
        if older > 0:
            parts.append(f"({older} earlier steps omitted)")
        for entry in journal[-RECENT_STEPS_IN_PROMPT:]:
            if "preview" not in entry:  # computed once per step, not once per prompt
                body = entry["body"]
                if isinstance(body, dict):  # what was sent and how often: not part of the step's record
                    body = {k: v for k, v in body.items() if k not in ("request", "retries")}
                entry["preview"] = f"Step {entry['step']} {entry['kind']} {entry['name']}: {_preview(body)}"
            parts.append(entry["preview"])
    return "\n".join(parts)
