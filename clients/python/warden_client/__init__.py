"""Warden's integration API for agents that run elsewhere: report a run's steps, and send each side
effect through Warden's ledger (an intent first; wait for a reviewer where the gate says so; the call
with Warden's idempotency key; the outcome).

    from warden_client import WardenClient

    with WardenClient("http://127.0.0.1:8000", token="wdn_…") as warden:
        run = warden.run_start("external-agent", goal="Refund the duplicate charge", idempotency_key="T-4711")
        warden.task_open(run.id, "refunds", agent="billing-agent")
        op = warden.operation_intent(run.id, task="refunds", step=1, tool="payments.refund",
                                     arguments={"charge": "ch_1"}, tool_class="non_idempotent_write",
                                     reversibility="irreversible")
        op = warden.operation_wait(op.id)            # long-polls while a reviewer decides
        if op.approved:
            warden.operation_start(op.id)            # the approval is checked again now
            receipt = provider.refund(..., idempotency_key=op.idempotency_key)
            warden.operation_outcome(op.id, committed=True, result=receipt)

``AsyncWardenClient`` has the same methods, awaited. Install with ``pip install ./clients/python``.
"""

from ._calls import Call, Retry
from ._models import Operation, Run, WardenError
from .aio import AsyncWardenClient
from .client import WardenClient

__all__ = ["AsyncWardenClient", "Call", "Operation", "Retry", "Run", "WardenClient", "WardenError"]
__version__ = "0.3.0"
