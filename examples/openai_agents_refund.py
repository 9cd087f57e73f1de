"""An OpenAI Agents SDK agent whose refund goes through Warden first (docs/integrations.md).

The agent has one tool, a refund. Wrapped with warden_client.openai_agents.WardenTools, the call is
recorded in Warden's ledger before it runs and, being an irreversible payment, waits in Warden's reviewer
queue (/approvals/) until a reviewer approves or rejects it; the agent's run waits with it. Its model
calls and tool calls appear in the Warden run's trace as they end (WardenTracing).

    pip install "./clients/python[openai-agents]"
    WARDEN_URL=http://127.0.0.1:8000 WARDEN_TOKEN=wdn_… OPENAI_API_KEY=sk-… \\
        python examples/openai_agents_refund.py ch_1001

OPENAI_BASE_URL and MODEL point it at any OpenAI-compatible server. The "payment provider" is a file of
refunds (REFUNDS_FILE, default refunds.jsonl): one line per refund made. Run it again after it finished,
or after killing it once the refund was made: the refund is not made twice.
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


@function_tool
def refund(charge: str, amount_cents: int) -> dict:
    """Refund part or all of a card charge."""
    refunds = Path(os.environ.get("REFUNDS_FILE", "refunds.jsonl"))
    receipt = {"refund": f"re_{len(refunds.read_text().splitlines()) + 1 if refunds.exists() else 1}",
               "charge": charge, "amount_cents": amount_cents}  # fmt: skip
    with refunds.open("a") as out:  # the side effect: this provider does not deduplicate
        out.write(json.dumps(receipt) + "\n")
    return receipt


def main(charge: str) -> int:
    warden = WardenClient(os.environ["WARDEN_URL"], os.environ["WARDEN_TOKEN"])
    run = warden.run_start("external-agent", goal=f"Refund {charge}", idempotency_key=f"openai-agents-refund-{charge}")
    warden.task_open(run.id, "billing", agent="billing-agent", objective=f"Refund {charge}")
    print(f"Warden run {run.id}: {os.environ['WARDEN_URL']}/runs/{run.id}/", flush=True)

    tools = WardenTools(
        warden, run.id, "billing", classes={"payments.refund": ("non_idempotent_write", "irreversible")}
    )
    set_trace_processors([WardenTracing(warden, run.id, "billing")])  # to Warden, and nowhere else
    model = OpenAIChatCompletionsModel(
        model=os.environ.get("MODEL", "gpt-4.1-mini"),
        openai_client=AsyncOpenAI(base_url=os.environ.get("OPENAI_BASE_URL"), api_key=os.environ["OPENAI_API_KEY"]),
    )
    agent = Agent(
        name="billing-agent",
        instructions="You handle refunds. Refund exactly what you are asked to with the refund tool; say what you did.",
        tools=[tools.wrap(refund, name="payments.refund")],
        model=model,
    )
    print("asking the agent; its refund waits for a reviewer in Warden's /approvals/", flush=True)
    result = Runner.run_sync(agent, f"Refund 25.00 (2500 cents) of charge {charge}.")
    print(result.final_output, flush=True)
    warden.run_finish(run.id, completed=True, reason=str(result.final_output)[:500])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else "ch_1001"))
