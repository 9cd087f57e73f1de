"""Retrying a failed task, plainly or from step N of its journal, and the preview an operator reads first.

A plain retry replays the whole journal and calls out only past its last step, with the keys the failed
attempt used (a call it made is found by key, never made twice). A retry **from step N** takes the journal
entries of steps N.. out of the journal (they stay in the trace, their step cleared, their attributes
saying what they were) and starts a new journal epoch: steps 1..N-1 are replayed, steps N.. are executed
afresh under new idempotency keys (``warden:<installation>:<run>:<task>:<step>:e<epoch>``). A committed
write of those steps is not made again: when the model asks for the same call at the same step, its
receipt answers (tools/broker.py ``earlier_receipt``). Repeating one is a choice per effect (``repeat``,
by step), and each repeat waits for a reviewer's approval before it is made — the preview lists both.
"""

from django.utils import timezone

from core.errors import NotFound
from policy.services import approvals_withdraw_ids
from tenancy.audit import audited
from tools.broker import idempotency_key
from tools.catalog import tool_spec
from tools.models import SealedArguments, ToolOperation
from tools.transitions import HAPPENED, NOT_DONE_YET, OPERATION
from tools.transitions import UNKNOWN_OUTCOME as UNRESOLVED

from ..models import Run, Span, Task
from ..refusals import task_retry_refusal
from .runs import task_retry_locked

# Ledger statuses, as the broker and the saga use them (tools.models.ToolOperation.Status).


def _run_id(task_id: int) -> int:
    run_id = Task.objects.filter(id=task_id).values_list("run_id", flat=True).first()
    if run_id is None:
        raise NotFound(f"task {task_id} does not exist")
    return run_id


def _journal(task_id: int) -> list[dict]:
    return list(
        Span.objects.filter(task_id=task_id, step__isnull=False)
        .order_by("step")
        .values("step", "kind", "name", "attempt")
    )


def _operations(task_id: int, from_step: int):
    return ToolOperation.objects.filter(task_id=task_id, kind=ToolOperation.Kind.ACTION, step__gte=from_step).order_by(
        "step", "id"
    )


def _answering(ops) -> dict[int, int]:
    """Step → the committed write whose receipt answers that step again (the latest, as the broker picks)."""
    found = {}
    for op in ops:
        if op.status == ToolOperation.Status.COMMITTED and op.tool_class != "read_only":
            found[op.step] = op.id  # ops come in id order: the last one wins
    return found


def _choose_repeats(task: Task, answering: dict[int, int], repeat) -> list[int]:
    """Mark the effects chosen to happen again (and only those, of this task). Returns their ids."""
    chosen = [answering[step] for step in sorted(set(repeat))]
    ToolOperation.objects.filter(task_id=task.id, repeat_chosen=True).exclude(id__in=chosen).update(repeat_chosen=False)
    ToolOperation.objects.filter(id__in=chosen).update(repeat_chosen=True)
    return chosen


def _supersede_steps(task: Task, journal: list, ops, *, step: int, now) -> list:
    """Steps ``step``.. leave the journal (kept in the trace, marked), their sealed secrets go, and the
    calls they asked for that were not done yet will not be: the new epoch asks again. Returns the
    superseded spans."""
    superseded = [span for span in journal if span.step >= step]
    for span in superseded:
        span.attributes = {
            **(span.attributes or {}),
            "superseded_by_retry_from": step,
            "journal_step": span.step,
            "journal_epoch": task.journal_epoch,
        }
        span.step = None
    Span.objects.bulk_update(superseded, ["step", "attributes"])
    # A model step seals its call's secrets under the next step: those of steps after N belong to
    # superseded responses. Step N's stay, when step N-1 (a replayed response) asked for that call.
    SealedArguments.objects.filter(task_id=task.id, step__gt=step).delete()
    # Calls asked for in superseded steps and not done yet will not be done: the new epoch asks again.
    why = f"not done: superseded by a retry from step {step}"
    pending = ops.filter(status__in=NOT_DONE_YET)
    approvals = [a for a in pending.values_list("approval_id", flat=True) if a]
    approvals_withdraw_ids(ids=approvals, reason=why, now=now)
    OPERATION.move_where(pending, ToolOperation.Status.REJECTED, status_reason=why, ended_at=now)
    return superseded


def _retry_span(run: Run, task: Task, *, step: int, superseded: list, reason: str, now) -> None:
    """The trace's record of the retry: from which step, which steps are executed again, the new epoch."""
    Span.objects.create(
        run_id=run.id,
        task_id=task.id,
        parent_id=Span.objects.filter(task_id=task.id, kind=Span.Kind.TASK).values_list("id", flat=True).first(),
        kind=Span.Kind.RECOVERY,
        name=f"retry from step {step}",
        started_at=now,
        ended_at=now,
        attributes={
            "from_step": step,
            "superseded_steps": [span.attributes["journal_step"] for span in superseded],
            "journal_epoch": task.journal_epoch,
            "reason": reason[:2000],
        },
    )


def task_retry_from(
    *,
    task_id: int,
    step: int,
    reason: str = "retried by operator",
    actor=None,
    via: str = "",
    request=None,
    detail=None,
    repeat=(),
) -> Task:
    """Retry a failed task with steps 1..``step``-1 replayed from its journal and steps ``step``.. executed
    afresh under the task's next journal epoch; then what task_retry does (the run resumes if it needed
    attention). The committed writes of steps ``step``.. are not made again: their receipts answer the
    same calls, except at the steps listed in ``repeat``, whose effect happens again once a reviewer
    approves it. Refused, changing nothing, for a task that is not failed, a step out of range, a run
    that is finished, cancelling or compensating, an operation at or after ``step`` whose outcome is
    unknown (an operator resolves it first), or a step in ``repeat`` with no committed effect at or
    after ``step``. Audited (``actor``, ``via``), with the steps executed again, the receipts reused and
    the effects chosen to happen again."""
    now = timezone.now()
    run_id = _run_id(task_id)
    who = {"actor": actor, "via": via, "request": request}
    with audited("task_retry_from", **who, target=f"task {task_id}", run_id=run_id, detail=detail) as act:
        run = Run.objects.select_for_update().get(id=run_id)  # lock order: run, then task
        task = Task.objects.select_for_update().get(id=task_id)
        act.update(target=f"task {task.id} ({task.key})", project_id=run.project_id)
        journal = list(Span.objects.filter(task_id=task.id, step__isnull=False).order_by("step"))
        last = journal[-1].step if journal else 0
        ops = _operations(task.id, step)
        unresolved = list(ops.filter(status__in=UNRESOLVED))
        answering = _answering(ops)
        refused = task_retry_refusal(
            run, task, step=step, last=last, unresolved=unresolved, repeat=repeat, repeatable=answering
        )
        if refused is not None:
            raise refused

        repeated = _choose_repeats(task, answering, repeat)
        superseded = _supersede_steps(task, journal, ops, step=step, now=now)
        task.journal_epoch += 1
        task.save(update_fields=["journal_epoch"])
        _retry_span(run, task, step=step, superseded=superseded, reason=reason, now=now)
        task_retry_locked(run=run, task=task, reason=reason, now=now)
        act["detail"] = {
            "reason": reason,
            "task": task.key,
            "from_step": step,
            "journal_epoch": task.journal_epoch,
            "re_executed": [span.attributes["journal_step"] for span in superseded],
            "reused_receipts": sorted(set(answering.values()) - set(repeated)),
            "repeated_operations": repeated,
            **act["detail"],
        }
    return task


def _outcome(op, spec, *, plain: bool, new_key: str, answers: bool, repeat: bool) -> str:
    """What the retry does about one ledger operation of the task, in an operator's words."""
    status = op.status
    if plain:
        if status in HAPPENED:
            return "done already: its stored receipt answers the step, nothing is called"
        if status in UNRESOLVED:
            if spec is not None and spec.lookup is not None:
                return "outcome unknown: looked up by its key first, called again with it only if it did not happen"
            return "outcome unknown and the tool has no lookup: resolve it first, or the task fails again"
        if status == "rejected":
            return "not done: the agent is told so"
        if status in ("proposed", "awaiting_approval"):
            return "still waits for its approval"
        return "called again with the same key"
    if status in UNRESOLVED:
        return "outcome unknown: resolve it before retrying from this step"
    if status in HAPPENED:
        if op.tool_class == "read_only":
            return f"read again, under {new_key}"
        if repeat:
            return f"happened; chosen to happen AGAIN under {new_key} (a second effect), once a reviewer approves"
        if answers:
            return "happened; its receipt answers the same call again: not repeated"
        if status != "committed":
            return f"happened and was undone ({status}): made afresh under {new_key} if asked for again"
        return "happened; a later receipt of the same step answers it"
    if status in NOT_DONE_YET:
        return f"withdrawn (not done); asked for again under {new_key}"
    return f"called afresh under {new_key}"


def task_retry_preview(*, task_id: int, step: int | None = None, repeat=()) -> dict:
    """What retrying the task would do, changing nothing: plainly (``step`` None) or from ``step``, with
    the committed effects at ``repeat`` steps made again. Lists the journal (for a step picker), the steps
    executed again and the task's ledger operations at or after the first of them — committed writes
    flagged: reused (their receipts answer) or, where chosen, repeated after an approval — and, if the
    retry would be refused now, why."""

    task = Task.objects.select_related("run").filter(id=task_id).first()
    if task is None:
        raise NotFound(f"task {task_id} does not exist")
    run = task.run
    journal = _journal(task.id)
    last = journal[-1]["step"] if journal else 0
    plain = step is None
    first = last + 1 if plain else step
    ops = list(_operations(task.id, first))
    unresolved = [op for op in ops if op.status in UNRESOLVED]
    answering = _answering(ops)
    refusal = task_retry_refusal(
        run, task, step=step, last=last, unresolved=unresolved, repeat=repeat, repeatable=answering
    )
    chosen = {answering[s] for s in repeat if s in answering}
    epoch = task.journal_epoch if plain else task.journal_epoch + 1
    operations = [
        _preview_operation(op, run, task, epoch, plain=plain, answering=answering, chosen=chosen) for op in ops
    ]
    return {
        "task_id": task.id,
        "task_key": task.key,
        "run_id": run.id,
        "mode": "retry" if plain else "retry_from",
        "from_step": first,
        "last_step": last,
        "journal_epoch": task.journal_epoch,
        "journal": [{**entry, "re_executed": entry["step"] >= first} for entry in journal],
        "re_executed": [
            {"step": e["step"], "kind": e["kind"], "name": e["name"]} for e in journal if e["step"] >= first
        ],
        "operations": operations,
        "repeated_effects": [op for op in operations if op["repeated"]],
        "reused_receipts": [op for op in operations if op["reused"]],
        "refusal": "" if refusal is None else str(refusal),
    }


def _preview_operation(op, run, task, epoch: int, *, plain: bool, answering: dict, chosen: set) -> dict:
    """One ledger operation of the preview: what the retry does with it."""
    spec = tool_spec(op.tool, run.project_id)
    key = idempotency_key(run_id=run.id, task_key=task.key, step=op.step, epoch=epoch)
    happened = op.status in HAPPENED
    answers = not plain and answering.get(op.step) == op.id
    return {
        "id": op.id,
        "step": op.step,
        "tool": op.tool,
        "status": op.status,
        "tool_class": op.tool_class,
        "reversibility": op.reversibility,
        "idempotency_key": op.idempotency_key,
        "new_key": key,
        "committed_write": happened and op.tool_class != "read_only",
        "repeatable": answers,
        "repeated": op.id in chosen,
        "reused": answers and op.id not in chosen,
        "irreversible": op.reversibility == "irreversible",
        "unresolved": op.status in UNRESOLVED,
        "has_lookup": spec is not None and spec.lookup is not None,
        "outcome": _outcome(op, spec, plain=plain, new_key=key, answers=answers, repeat=op.id in chosen),
    }


def task_retry_from_preview(*, task_id: int, step: int, repeat=()) -> dict:
    """What task_retry_from(task_id=…, step=…, repeat=…) would do; see task_retry_preview."""
    return task_retry_preview(task_id=task_id, step=step, repeat=repeat)
