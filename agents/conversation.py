"""A task's conversation with a real model, in the provider's own message format, rebuilt from the
journal at every turn (docs/agents.md, "The native loop").

The journal is the truth: each model step holds the assistant's text and its tool calls (with the
provider's call ids), each tool step the result the model was given (or the structured error). From
them ``turns`` makes provider-neutral turns, ``fit`` keeps them within the context budget, and
``openai_messages`` / ``anthropic_messages`` render them. All are pure functions of the journal, so a
resumed attempt sends exactly the bytes the crashed one would have sent.

Fitting the budget: tool results are kept whole while they fit; past the budget the oldest results are
trimmed first, by structure (a list keeps its first items, a long string its start, an object every key),
each with a visible marker; only if that is not enough are the oldest exchanges dropped, and the task
message says how many.
"""

import json

TRIMMED = "[trimmed by Warden for the context budget]"
TRIMMED_RESULT_CHARS = 400  # what an old result keeps when the budget is short


def _dumps(value) -> str:
    return json.dumps(value, sort_keys=True, default=str, ensure_ascii=False)


def call_id(step: int, index: int) -> str:
    """A call's id when the provider gave none (a journal written before the native loop)."""
    return f"call_{step}_{index}"


def turns(journal: list[dict]) -> list[dict]:
    """Provider-neutral turns: {"role": "assistant", "text", "calls": [{id, name, arguments}]} and
    {"role": "tool", "id", "name", "content"} (the result as JSON text)."""
    out: list[dict] = []
    pending: list[str] = []
    for entry in journal:
        body = entry.get("body") or {}
        if entry["kind"] == "model_call":
            calls = body.get("tool_calls") or ([body["tool_call"]] if body.get("tool_call") else [])
            named = [
                {
                    "id": c.get("id") or call_id(entry["step"], i),
                    "name": str(c.get("name")),
                    "arguments": c.get("arguments"),
                }
                for i, c in enumerate(calls)
            ]
            pending = [c["id"] for c in named]
            out.append({"role": "assistant", "text": body.get("text") or "", "calls": named})
        elif entry["kind"] == "tool_call":
            result = {"result": body["result"]} if "result" in body else {"error": body.get("error")}
            ident = body.get("call_id") or (pending[0] if pending else call_id(entry["step"], 0))
            if ident in pending:
                pending.remove(ident)
            out.append({"role": "tool", "id": ident, "name": entry["name"], "content": _dumps(result)})
    return out


def shrink(value, room: int):
    """``value`` made to fit about ``room`` characters of JSON by its structure, with markers."""
    if len(_dumps(value)) <= room:
        return value
    if isinstance(value, str):
        keep = max(0, room - 60)
        return f"{value[:keep]}… {TRIMMED} ({len(value) - keep} more characters)"
    if isinstance(value, list):
        kept: list = []
        for item in value:
            item = shrink(item, max(60, room // 4))
            if len(_dumps([*kept, item])) + 80 > room:
                break
            kept.append(item)
        return [*kept, f"{TRIMMED} ({len(value) - len(kept)} more items)"]
    if isinstance(value, dict):
        share = max(60, room // max(1, len(value)) - 10)
        return {k: shrink(v, share) for k, v in value.items()}
    return value


def _trimmed_content(content: str, room: int) -> str:
    try:
        value = json.loads(content)
    except ValueError:
        value = content
    text = _dumps(shrink(value, room))
    return text if len(text) <= room + 200 else text[:room] + f"… {TRIMMED}"


def fit(all_turns: list[dict], budget: int) -> tuple[list[dict], int]:
    """The turns within ``budget`` characters: the oldest tool results trimmed first, then the oldest
    exchanges dropped (an assistant turn with its results). Returns the turns and how many exchanges
    were dropped."""
    kept = [dict(t) for t in all_turns]

    def size() -> int:
        return sum(
            len(t.get("content") or "") + len(t.get("text") or "") + len(_dumps(t.get("calls") or [])) for t in kept
        )

    for turn in kept:  # oldest first
        if size() <= budget:
            break
        if turn["role"] == "tool" and len(turn["content"]) > TRIMMED_RESULT_CHARS:
            turn["content"] = _trimmed_content(turn["content"], TRIMMED_RESULT_CHARS)
    dropped = 0
    while size() > budget and len(kept) > 1:
        # Drop the oldest exchange whole: the assistant turn and the results of its calls.
        end = 1
        while end < len(kept) and kept[end]["role"] == "tool":
            end += 1
        if end >= len(kept):
            break  # the newest exchange stays: the model must see what it just did
        del kept[:end]
        dropped += 1
    return kept, dropped


def _function(name: str) -> str:
    return name.replace(".", "__")  # OpenAI and Anthropic names allow [a-zA-Z0-9_-]; Warden's have dots


def _arguments_text(arguments) -> str:
    return arguments if isinstance(arguments, str) else _dumps(arguments if arguments is not None else {})


def openai_messages(system: str, user: str, history: list[dict]) -> list[dict]:
    messages: list[dict] = [{"role": "system", "content": system}, {"role": "user", "content": user}]
    for turn in history:
        if turn["role"] == "assistant":
            message: dict = {"role": "assistant", "content": turn["text"] or None}
            if turn["calls"]:
                message["tool_calls"] = [
                    {"id": c["id"], "type": "function",
                     "function": {"name": _function(c["name"]), "arguments": _arguments_text(c["arguments"])}}
                    for c in turn["calls"]
                ]  # fmt: skip
            messages.append(message)
        else:
            messages.append({"role": "tool", "tool_call_id": turn["id"], "content": turn["content"]})
    return messages


def anthropic_messages(user: str, history: list[dict]) -> list[dict]:
    messages: list[dict] = [{"role": "user", "content": user}]
    for turn in history:
        if turn["role"] == "assistant":
            blocks: list[dict] = [{"type": "text", "text": turn["text"]}] if turn["text"] else []
            for c in turn["calls"]:
                arguments = c["arguments"] if isinstance(c["arguments"], dict) else {"raw": c["arguments"]}
                blocks.append({"type": "tool_use", "id": c["id"], "name": _function(c["name"]), "input": arguments})
            messages.append({"role": "assistant", "content": blocks or [{"type": "text", "text": "…"}]})
        else:
            result = {"type": "tool_result", "tool_use_id": turn["id"], "content": turn["content"]}
            if messages[-1]["role"] == "user" and isinstance(messages[-1]["content"], list):
                messages[-1]["content"].append(result)  # the results of one reply travel in one message
            else:
                messages.append({"role": "user", "content": [result]})
    return messages
