"""An OpenAI Agents SDK agent whose refunds go through Warden first (docs/integrations.md).

The agent has one tool, a refund. Wrapped with warden_client.openai_agents.WardenTools, each call is
recorded in Warden's ledger before it runs and, being an irreversible payment, waits in Warden's reviewer
queue (/approvals/) until a reviewer approves or rejects it; the agent's run waits with it. The refund
receives Warden's idempotency key (its ``idempotency_key`` argument, which the model never sees) and hands
it to the payment provider, which refunds once per key. Its model calls (tokens and cost) and tool calls
appear in the Warden run's trace as they end (WardenTracing).

    pip install "./clients/python[openai-agents]"
    WARDEN_URL=http://127.0.0.1:8000 WARDEN_TOKEN=wdn_… OPENAI_API_KEY=sk-… \\
        python examples/openai_agents_refund.py ch_1001 [ch_1002 …]

OPENAI_BASE_URL and MODEL point it at any OpenAI-compatible server; PRICE_IN and PRICE_OUT are its USD per
million input and output tokens. The "payment provider" is a file of refunds (REFUNDS_FILE, default
refunds.jsonl): one line per refund made, with its key. It refuses a disputed charge (ch_disputed…: Warden
records the call as failed) and loses its answer for a slow one (ch_slow…: refunded, then a timeout:
Warden records it as ambiguous, for a person to check). Run it again after it finished, or after killing
it at any point: no charge is refunded twice.
"""

import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "clients" / "python"))

from agents.tracing import set_trace_processors  # noqa: E402
from openai import AsyncOpenAI  # noqa: E402
from warden_client import WardenClient  # noqa: E402
from warden_client.openai_agents import WardenTools, WardenTracing  # noqa: E402

from agents import Agent, OpenAIChatCompletionsModel, Runner, function_tool  # noqa: E402


def pay_out(charge: str, amount_cents: int, key: str) -> dict:
    """The payment provider: a refund per idempotency key (a call made again with the key gets the first
    refund's receipt, as Stripe answers)."""
    refunds = Path(os.environ.get("REFUNDS_FILE", "refunds.jsonl"))
    made = [json.loads(line) for line in refunds.read_text().splitlines()] if refunds.exists() else []
    for receipt in made:
        if receipt["idempotency_key"] == key:
            return receipt
    if charge.startswith("ch_disputed"):
        raise ValueError(f"charge {charge} is disputed: it cannot be refunded")
    receipt = {"refund": f"re_{len(made) + 1}", "charge": charge, "amount_cents": amount_cents, "idempotency_key": key}
    with refunds.open("a") as out:
        out.write(json.dumps(receipt) + "\n")
    if charge.startswith("ch_slow"):
        raise TimeoutError("the payment provider did not answer in time")  # after it refunded
    return receipt


@function_tool
def refund(charge: str, amount_cents: int, idempotency_key: str | None = None) -> dict:
    """Refund part or all of a card charge."""
    return pay_out(charge, amount_cents, idempotency_key or "")


def main(charges: list[str]) -> int:
    warden = WardenClient(os.environ["WARDEN_URL"], os.environ["WARDEN_TOKEN"])
    which = "-".join(charges)
    run = warden.run_start("external-agent", goal=f"Refund {which}", idempotency_key=f"openai-agents-refund-{which}")
    warden.task_open(run.id, "billing", agent="billing-agent", objective=f"Refund {which}")
    print(f"Warden run {run.id}: {os.environ['WARDEN_URL']}/runs/{run.id}/", flush=True)

    tools = WardenTools(
        warden, run.id, "billing", classes={"payments.refund": ("non_idempotent_write", "irreversible")}
    )
    name = os.environ.get("MODEL", "gpt-4.1-mini")
    prices = {name: (float(os.environ.get("PRICE_IN", "0.40")), float(os.environ.get("PRICE_OUT", "1.60")))}
    set_trace_processors([WardenTracing(warden, run.id, "billing", prices=prices)])  # to Warden, and nowhere else
    model = OpenAIChatCompletionsModel(
        model=name,
        openai_client=AsyncOpenAI(base_url=os.environ.get("OPENAI_BASE_URL"), api_key=os.environ["OPENAI_API_KEY"]),
    )
    agent = Agent(
        name="billing-agent",
        instructions="You handle refunds. Refund exactly what you are asked to with the refund tool; say what you did.",
        # deduplicates: the provider refunds once per key, so a refund cut off by a restart is asked again
        tools=[tools.wrap(refund, name="payments.refund", deduplicates=True)],
        model=model,
    )
    print("asking the agent; its refunds wait for a reviewer in Warden's /approvals/", flush=True)
    result = Runner.run_sync(agent, f"Refund 25.00 (2500 cents) of each of these charges: {', '.join(charges)}.")
    print(result.final_output, flush=True)
    warden.run_finish(run.id, completed=True, reason=str(result.final_output)[:500])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:] or ["ch_1001"]))
