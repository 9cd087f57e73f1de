"""The ledger's one writer: an operation enters it only with the gate's verdict (tools/gate.py).

The database refuses a row without one (the ``operation_has_a_verdict`` constraint), so a path that
forgot the gate fails loudly instead of sending a call nobody judged.
"""

from core import bus
from tenancy.audit import audit

from .gate import REFUSE, Verdict
from .models import ToolOperation


def operation_record(*, verdict: Verdict, run_id: int, project_id: int | None = None, **fields) -> ToolOperation:
    """Write one operation with its verdict, inside the caller's transaction. A refusal writes nothing
    (the caller answers the agent or the API with the refusal instead). The use of an allow rule is
    audited with the rule's id, in the same transaction."""
    if verdict.decision == REFUSE:
        raise ValueError("a refused call has no operation")
    op = ToolOperation.objects.create(
        run_id=run_id,
        gate=verdict.decision,
        verdict=verdict.to_json(),
        tool_class=verdict.tool_class,
        reversibility=verdict.reversibility,
        **fields,
    )
    if verdict.allow_rule:
        if project_id is None:
            project_id = ToolOperation.objects.filter(id=op.id).values_list("run__project_id", flat=True).first()
        audit(
            actor=None,
            action="allow_rule_use",
            project_id=project_id,
            run_id=run_id,
            target=f"operation {op.id}",
            detail={"rule": verdict.allow_rule, "tool": op.tool, "arguments_hash": op.arguments_hash},
        )
    bus.run_changed(run_id)
    return op


def operations_inherit(*, sources, run_id: int, task_ids: dict[int, int], key_of) -> list[ToolOperation]:
    """Carry committed operations into a fork (runs/services/fork.py) as receipts: each keeps the verdict
    it was made under (it is never judged again, because it is never called again), is keyed
    ``key_of(op)`` in the new run and points at the operation it copies. ``task_ids``: source task id →
    fork task id. Inside the caller's transaction."""
    copies = [
        ToolOperation(
            run_id=run_id,
            task_id=task_ids[op.task_id],
            step=op.step,
            call_number=op.call_number,
            kind=op.kind,
            tool=op.tool,
            idempotency_key=key_of(op),
            arguments_hash=op.arguments_hash,
            arguments=op.arguments,
            original_arguments=op.original_arguments,
            original_hash=op.original_hash,
            tool_class=op.tool_class,
            reversibility=op.reversibility,
            status=op.status,
            status_reason=f"inherited from run {op.run_id} (operation {op.id}): not called again",
            result=op.result,
            external_id=op.external_id,
            compensation=op.compensation,
            gate=op.gate,
            verdict=op.verdict,
            started_at=op.started_at,
            committed_at=op.committed_at,
            ended_at=op.ended_at,
            inherited_from_id=op.id,
        )
        for op in sources
    ]
    created = ToolOperation.objects.bulk_create(copies)
    if created:
        bus.run_changed(run_id)
    return created
