"""An agent that runs outside Warden and uses it as its supervisor (see docs/api.md).

It handles a refund ticket: opens an external run, reports its model calls, and sends the refund — an
irreversible side effect — through Warden's ledger first. The refund waits for a reviewer; once
approved, the agent calls the payment provider with Warden's idempotency key and records the receipt.
Run it twice with the same ticket: the second time Warden answers with what is already done, and the
provider is not called again.

    WARDEN_URL=http://127.0.0.1:8000 WARDEN_TOKEN=wdn_… .venv/bin/python examples/external_agent.py T-4711

The "payment provider" here is a file of refunds (PROVIDER_LOG, default refunds.jsonl) standing in for
a real API: a refund appended there is the side effect.
"""

import json
import os
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "clients" / "python"))

from warden_client import WardenClient  # noqa: E402


def provider_refund(charge: str, amount: int, *, idempotency_key: str) -> dict:
    """The stand-in payment provider: one refund line per call (it does not dedupe, like many APIs)."""
    log = Path(os.environ.get("PROVIDER_LOG", "refunds.jsonl"))
    receipt = {"refund": f"re_{len(log.read_text().splitlines()) + 1 if log.exists() else 1}", "charge": charge,
               "amount": amount, "idempotency_key": idempotency_key}  # fmt: skip
    with log.open("a") as out:
        out.write(json.dumps(receipt) + "\n")
    return receipt


def main(ticket: str) -> int:
    client = WardenClient(os.environ["WARDEN_URL"], os.environ["WARDEN_TOKEN"])
    run = client.run_start("external-agent", goal=f"Refund the duplicate charge of {ticket}",
                           idempotency_key=f"refund-run-{ticket}")  # fmt: skip
    print(f"run {run.id} ({run.status})")
    client.task_open(run.id, "refund", agent="billing-agent", objective=f"Refund ticket {ticket}")

    # What the agent's model did, reported as a span (with its usage); a fixed key: a rerun adds nothing.
    started = datetime(2026, 1, 1, tzinfo=UTC)
    client.span_report(
        run.id, task="refund", name="gpt-4.1-mini", started_at=started, ended_at=started + timedelta(seconds=1),
        tokens_in=420, tokens_out=64, cost_usd=0.0003, step=1, idempotency_key=f"refund-span-{ticket}-1",
    )  # fmt: skip

    # The side effect: the intent first. Warden says whether it waits for a reviewer and gives the key.
    arguments = {"charge": f"ch_{ticket}", "amount": 1200}
    op = client.operation_intent(run.id, task="refund", step=2, tool="payments.refund", arguments=arguments,
                                 tool_class="non_idempotent_write", reversibility="irreversible")  # fmt: skip
    print(f"operation {op.id}: {op.status} (key {op.idempotency_key})")
    if op.status in ("awaiting_approval", "proposed"):
        print("waiting for a reviewer…", flush=True)
        op = client.operation_wait(op.id, timeout=float(os.environ.get("WAIT_SECONDS", 600)))
        print(f"decided: {op.status} {op.status_reason}")
    if op.status == "approved":
        client.operation_start(op.id)
        receipt = provider_refund(arguments["charge"], arguments["amount"], idempotency_key=op.idempotency_key)
        op = client.operation_outcome(op.id, committed=True, result=receipt, external_id=receipt["refund"])
        print(f"refunded: {receipt['refund']}")
    elif op.status == "committed":
        print(f"already refunded earlier: {op.raw['external_id']}")
    else:
        print(f"not refunded: {op.status} {op.status_reason}")
    done = op.status == "committed"
    run = client.run_finish(run.id, completed=done, reason="refund done" if done else f"refund {op.status}")
    print(f"run {run.id}: {run.status}")
    return 0 if done else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else "T-4711"))
