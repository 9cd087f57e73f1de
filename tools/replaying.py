"""A replay run's tool calls (runs.Run.Mode.REPLAY): answered from the original run's ledger, never sent.

The broker hands every call of a replay run here before anything else it would do with it (tools/broker.py
``tool_call``), so a replay has no path to a system for a write, whatever the tool's kind (Python, HTTP,
MCP) and whatever an approval, an allow rule or a waiver would say: nothing here writes a ledger row, so
there is no operation for a reviewer to approve, for the executor to send or for the saga to undo.

- The same tool with the same arguments as a call the original committed (a read or a write): the
  original's receipt answers, marked ``recorded``.
- Any other read: answered ``not_recorded`` (the model sees it as the tool's error), so that a replay's
  answer depends on nothing but the original's ledger; unless the replay allows live reads
  (Run.live_reads) and the tool says the read is safe to send again (ToolSpec.repeatable) and the gate
  classes it a read it allows: then it is sent (``live``, by the broker, with no ledger row).
- Any other write: recorded as what would have been called, with the gate's verdict it would have had,
  and answered by the tool's declared stand-in (``ToolSpec.replay_result``) or an error that says so.

A shadow run (runs.Run.Mode.SHADOW) is a replay of a run that is still going: a call its original has not
committed is not answered yet (``OriginalBehind``); the engine has the task wait while the original goes
on, and once it has settled uses the answer a replay would have had.

Each answer carries a ``replay`` record in the journal (never shown to the model): the digest of the
arguments, whether it was a write, the verdict, and how it was answered; replay/services.py reads the
differences from it.
"""

from typing import NamedTuple

from django.db.models import Q

from .gate import ALLOW, REFUSE, Origin, Verdict, gate
from .kit import ToolSpec
from .models import ToolOperation

RECORDED, NOT_RECORDED, NOT_SENT, REFUSED, LIVE = "recorded", "not_recorded", "not_sent", "refused", "live"


def original_receipt(original_run_id: int | None, tool: str, digest: str) -> ToolOperation | None:
    """The first operation of the original run that committed this call (the same tool and arguments, or
    the arguments a reviewer's edit replaced)."""
    if original_run_id is None:
        return None
    return (
        ToolOperation.objects.filter(run_id=original_run_id, tool=tool, status=ToolOperation.Status.COMMITTED)
        .filter(Q(arguments_hash=digest) | Q(original_hash=digest))
        .order_by("id")
        .first()
    )


class ReplayAnswer(NamedTuple):
    result: dict | None
    error: dict | None
    record: dict  # the journal's ``replay`` record


class OriginalBehind(Exception):
    """A shadow's call that its original (still going) has not committed: it may yet. ``answer`` is what it
    gets if the original settles without it."""

    def __init__(self, answer: ReplayAnswer):
        super().__init__(f"{answer.record['tool']} waits for the run it shadows")
        self.answer = answer


def replay_answer(*, run, task, spec: ToolSpec, args: dict, digest: str) -> ReplayAnswer:
    """What a replay run's call of ``spec`` gets, and the record of how it was answered. Raises
    OriginalBehind for a shadow's call its original has not committed (yet)."""
    verdict: Verdict = gate(
        run_id=run.id,
        tool=spec.name,
        arguments=args,
        origin=Origin.AGENT,
        agent_id=task.agent_id,
        allowed_tools=task.allowed_tools,
    )
    record = {
        "tool": spec.name,
        "digest": digest,
        "write": spec.is_write,
        "tool_class": verdict.tool_class,
        "reversibility": verdict.reversibility,
        "verdict": verdict.decision,
        "waits_for": list(verdict.reasons) if verdict.waits else [],
    }
    if verdict.decision == REFUSE:
        message = f"{spec.name} may not be called: {'; '.join(verdict.reasons)}"
        return ReplayAnswer(None, {"code": "refused", "message": message}, {**record, "answered": REFUSED})
    receipt = original_receipt(run.replay_of_id, spec.name, digest)
    if receipt is not None:
        result = receipt.result if receipt.result is not None else {"status": "committed"}
        return ReplayAnswer(result, None, {**record, "answered": RECORDED, "operation": receipt.id})
    if _live_read_allowed(run, spec, verdict):  # sent by the broker (tools/broker.py, _replay_live_read)
        return ReplayAnswer(None, None, {**record, "answered": LIVE})
    answer = _unanswered(spec, record)
    if run.mode == "shadow":
        raise OriginalBehind(answer)
    return answer


def _live_read_allowed(run, spec: ToolSpec, verdict: Verdict) -> bool:
    """The replay allows live reads, the tool says this read is safe to send again, and the gate (the
    strictest classification, not the tool's own claim) classes it a read it lets through unreviewed."""
    return bool(
        getattr(run, "live_reads", False)
        and spec.repeatable
        and not spec.is_write
        and verdict.tool_class == ToolOperation.ToolClass.READ_ONLY
        and verdict.decision == ALLOW
        and not verdict.waits
    )


def _unanswered(spec: ToolSpec, record: dict) -> ReplayAnswer:
    """A call its original never committed."""
    if not spec.is_write:
        message = f"{spec.name}: the original run made no such read, and a replay does not read live"
        return ReplayAnswer(None, {"code": "not_recorded", "message": message}, {**record, "answered": NOT_RECORDED})
    stand_in = spec.replay_result
    if stand_in is not None:
        return ReplayAnswer(dict(stand_in), None, {**record, "answered": NOT_SENT})
    message = f"{spec.name} was not sent: this is a replay, and its original made no such call"
    return ReplayAnswer(None, {"code": "not_sent_in_replay", "message": message}, {**record, "answered": NOT_SENT})
