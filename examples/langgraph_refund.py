"""A LangGraph agent whose refunds go through Warden first (docs/integrations.md).

A model node (any OpenAI-compatible model, through langchain-openai) and a tool node from
warden_client.langgraph.WardenGate: each refund is recorded in Warden's ledger before it runs and, being
an irreversible payment, waits in Warden's reviewer queue as a LangGraph interrupt; the graph resumes when
the decisions land. The refund receives Warden's idempotency key (its injected ``idempotency_key``
argument, which the model never sees) and hands it to the payment provider, which refunds once per key.
The graph keeps its checkpoints in SQLite (CHECKPOINTS, default checkpoints.sqlite): started again after
a crash, it resumes where it stopped. The graph's nodes, model calls (tokens and cost) and tool calls
appear in the Warden run's trace.

    pip install "./clients/python[langgraph]"
    WARDEN_URL=http://127.0.0.1:8000 WARDEN_TOKEN=wdn_… OPENAI_API_KEY=sk-… \\
        python examples/langgraph_refund.py ch_1001 [ch_1002 …]

OPENAI_BASE_URL and MODEL point it at any OpenAI-compatible server; PRICE_IN and PRICE_OUT are its USD per
million input and output tokens. The "payment provider" is a file of refunds (REFUNDS_FILE, default
refunds.jsonl), as in examples/openai_agents_refund.py: ch_disputed… is refused, ch_slow… is refunded and
then times out.
"""

import json
import os
import sqlite3
import sys
from pathlib import Path
from typing import Annotated

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "clients" / "python"))

from langchain_core.tools import InjectedToolArg, tool  # noqa: E402
from langchain_openai import ChatOpenAI  # noqa: E402
from langgraph.checkpoint.sqlite import SqliteSaver  # noqa: E402
from langgraph.graph import END, START, MessagesState, StateGraph  # noqa: E402
from warden_client import WardenClient  # noqa: E402
from warden_client.langgraph import WardenCallbacks, WardenGate  # noqa: E402


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


@tool
def refund(charge: str, amount_cents: int, idempotency_key: Annotated[str, InjectedToolArg] = "") -> dict:
    """Refund part or all of a card charge."""
    return pay_out(charge, amount_cents, idempotency_key)


def graph_for(gate: WardenGate, checkpointer):
    model = ChatOpenAI(model=os.environ.get("MODEL", "gpt-4.1-mini"), base_url=os.environ.get("OPENAI_BASE_URL"),
                       max_retries=0).bind_tools([refund])  # fmt: skip

    def think(state: MessagesState) -> dict:
        return {"messages": [model.invoke(state["messages"])]}

    def route(state: MessagesState) -> str:
        return "tools" if getattr(state["messages"][-1], "tool_calls", None) else END

    builder = StateGraph(MessagesState)
    builder.add_node("model", think)
    # deduplicates: the provider refunds once per key, so a refund cut off by a restart is asked again
    builder.add_node("tools", gate.tool_node([refund], names={"refund": "payments.refund"}, deduplicates={"refund"}))
    builder.add_edge(START, "model")
    builder.add_conditional_edges("model", route, ["tools", END])
    builder.add_edge("tools", "model")
    return builder.compile(checkpointer=checkpointer)


def converse(gate: WardenGate, graph, config: dict, ask: str) -> dict:
    """The graph to its end: started, or resumed where a crash left it (its checkpoints say which)."""
    state = graph.get_state(config)
    if gate.pending(graph, config):
        print("the refunds wait for a reviewer in Warden's /approvals/", flush=True)
        return gate.resume_when_decided(graph, config)
    if state.next:  # stopped inside a step: LangGraph runs the step again
        return gate.run(graph, None, config)
    if state.values.get("messages"):
        return state.values  # done before
    return gate.run(graph, {"messages": [("user", ask)]}, config)


def main(charges: list[str]) -> int:
    warden = WardenClient(os.environ["WARDEN_URL"], os.environ["WARDEN_TOKEN"])
    which = "-".join(charges)
    run = warden.run_start("external-agent", goal=f"Refund {which}", idempotency_key=f"langgraph-refund-{which}")
    warden.task_open(run.id, "billing", agent="billing-graph", objective=f"Refund {which}")
    print(f"Warden run {run.id}: {os.environ['WARDEN_URL']}/runs/{run.id}/", flush=True)
    gate = WardenGate(warden, run.id, "billing", classes={"payments.refund": ("non_idempotent_write", "irreversible")})
    name = os.environ.get("MODEL", "gpt-4.1-mini")
    prices = {name: (float(os.environ.get("PRICE_IN", "0.40")), float(os.environ.get("PRICE_OUT", "1.60")))}
    config = {
        "configurable": {"thread_id": f"refund-{which}"},
        "callbacks": [WardenCallbacks(warden, run.id, "billing", prices=prices)],
    }
    with sqlite3.connect(os.environ.get("CHECKPOINTS", "checkpoints.sqlite"), check_same_thread=False) as db:
        graph = graph_for(gate, SqliteSaver(db))
        ask = f"Refund 25.00 (2500 cents) of each of these charges: {', '.join(charges)}."
        result = converse(gate, graph, config, ask)
    answer = result["messages"][-1].content
    print(answer, flush=True)
    warden.run_finish(run.id, completed=True, reason=str(answer)[:500])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:] or ["ch_1001"]))
