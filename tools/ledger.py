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
