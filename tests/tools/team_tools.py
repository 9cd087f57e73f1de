"""A team's tool module, written as a team would write it with the kit (docs/tools.md, "Python tools"):
a payments service that holds and releases amounts on a card. Its "service" is a JSON-lines file
(TEAM_PAYMENTS_FILE), so a test, or a worker process started with WARDEN_TOOL_MODULES naming this module,
records effects where the test can count them. The service honours idempotency keys and checks its key."""

import fcntl
import json
import os
import time
import uuid

from pydantic import Field

from tools.kit import (
    Reversibility,
    ToolArguments,
    ToolClass,
    ToolRefused,
    ToolResult,
    ToolTimeout,
    Undo,
    tool,
)

KEY = "TEAM_PAYMENTS_KEY"
SLOW_SECONDS = 2.0  # a slow answer: past the 1-second deadlines below


class HoldArgs(ToolArguments):
    card: str = Field(pattern=r"^card_[a-z0-9]+$")
    amount_cents: int = Field(gt=0, le=1_000_000)


class Hold(ToolResult):
    hold_id: str
    amount_cents: int


class ReleaseArgs(ToolArguments):
    hold_id: str = Field(min_length=1, max_length=64)


class Released(ToolResult):
    hold_id: str
    released: bool


def _service(secrets: dict) -> str:
    if secrets.get(KEY) != os.environ.get("TEAM_PAYMENTS_EXPECTED_KEY"):
        raise ToolRefused("the payments service refused the credential")
    return os.environ["TEAM_PAYMENTS_FILE"]


def _rows(path: str) -> list[dict]:
    try:
        with open(path) as f:
            return [json.loads(line) for line in f if line.strip()]
    except FileNotFoundError:
        return []


def _calls(path: str, key: str) -> None:
    """Every request the service receives, landed or not (to count the broker's calls)."""
    with open(path + ".calls", "a") as f:
        f.write(key + "\n")


def _append_once(path: str, row: dict) -> dict:
    """The service's own deduplication: a key it has seen returns the first answer."""
    with open(path, "a+") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        f.seek(0)
        for line in f:
            if line.strip() and json.loads(line)["key"] == row["key"]:
                return json.loads(line)
        f.write(json.dumps(row) + "\n")
    return row


@tool(
    "payments.hold",
    arguments=HoldArgs,
    result=Hold,
    tool_class=ToolClass.IDEMPOTENT_WRITE,
    reversibility=Reversibility.REVERSIBLE,
    undo=Undo("payments.release", lambda arguments, receipt: {"hold_id": receipt["hold_id"]}),
    lookup=lambda key, secrets: next((r["answer"] for r in _rows(_service(secrets)) if r["key"] == key), None),
    secrets=[KEY],
    external_id="hold_id",
    timeout_seconds=1,
)
def hold(arguments: HoldArgs, *, key: str, secrets: dict, deadline: float) -> Hold:
    """Hold an amount on a customer's card (undone by releasing it)"""
    path = _service(secrets)
    _calls(path, key)
    if arguments.card == "card_quote":  # a careless service quoting the credential it refused
        raise ToolRefused(f"the payments service refused the key {secrets[KEY]}")
    if arguments.card == "card_slow":
        time.sleep(SLOW_SECONDS)  # the service is slow; the hold lands after the broker stopped waiting
    answer = {"hold_id": f"hold_{uuid.uuid4().hex[:10]}", "amount_cents": arguments.amount_cents}
    row = _append_once(path, {"key": key, "op": "hold", "card": arguments.card, "answer": answer})
    if arguments.card == "card_lostanswer" and row["answer"] == answer:
        raise ToolTimeout("the payments service did not answer in time")  # made, then the answer was lost
    return Hold(**row["answer"])


@tool(
    "payments.release",
    arguments=ReleaseArgs,
    result=Released,
    tool_class=ToolClass.IDEMPOTENT_WRITE,
    reversibility=Reversibility.IRREVERSIBLE,
    secrets=[KEY],
    internal=True,
    external_id="hold_id",
)
def release(arguments: ReleaseArgs, *, key: str, secrets: dict, deadline: float) -> dict:
    """Release a hold"""
    row = _append_once(
        _service(secrets),
        {"key": key, "op": "release", "answer": {"hold_id": arguments.hold_id, "released": True}},
    )
    return row["answer"]


class NoticeArgs(ToolArguments):
    to: str = Field(pattern=r"^[^@\s]+@[^@\s]+$")
    text: str = Field(max_length=500)


class Notice(ToolResult):
    notice_id: str


@tool(
    "payments.notify",
    arguments=NoticeArgs,
    result=Notice,
    tool_class=ToolClass.NON_IDEMPOTENT_WRITE,  # a repeat is a second message
    reversibility=Reversibility.IRREVERSIBLE,
    lookup=lambda key, secrets: next((r["answer"] for r in _rows(_service(secrets)) if r["key"] == key), None),
    secrets=[KEY],
    timeout_seconds=1,
)
def notify(arguments: NoticeArgs, *, key: str, secrets: dict, deadline: float) -> dict:
    """Tell the card holder (cannot be taken back)"""
    path = _service(secrets)
    _calls(path, key)
    if arguments.text == "slow":
        time.sleep(SLOW_SECONDS)
    with open(path, "a") as f:  # no deduplication: every request is a message
        f.write(json.dumps({"key": key, "op": "notify", "answer": {"notice_id": uuid.uuid4().hex[:8]}}) + "\n")
    return {"notice_id": "sent"}
