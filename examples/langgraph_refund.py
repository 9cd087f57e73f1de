"""A LangGraph agent whose refund goes through Warden first (docs/integrations.md).

A model node (any OpenAI-compatible model, through langchain-openai) and a tool node from
warden_client.langgraph.WardenGate: the refund is recorded in Warden's ledger before it runs and, being
an irreversible payment, waits in Warden's reviewer queue as a LangGraph interrupt; the graph resumes when
the decision lands. The graph's nodes, model calls and tool calls appear in the Warden run's trace.

    pip install "./clients/python[langgraph]"
    WARDEN_URL=http://127.0.0.1:8000 WARDEN_TOKEN=wdn_… OPENAI_API_KEY=sk-… \\
        python examples/langgraph_refund.py ch_1001

OPENAI_BASE_URL and MODEL point it at any OpenAI-compatible server. The "payment provider" is a file of
refunds (REFUNDS_FILE, default refunds.jsonl).
"""

import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "clients" / "python"))

from langchain_core.tools import tool  # noqa: E402
from langchain_openai import ChatOpenAI  # noqa: E402
from langgraph.checkpoint.memory import InMemorySaver  # noqa: E402
from langgraph.graph import END, START, MessagesState, StateGraph  # noqa: E402
from warden_client import WardenClient  # noqa: E402
from warden_client.langgraph import WardenCallbacks, WardenGate  # noqa: E402


@tool
def refund(charge: str, amount_cents: int) -> dict:
    """Refund part or all of a card charge."""
    refunds = Path(os.environ.get("REFUNDS_FILE", "refunds.jsonl"))
    receipt = {"refund": f"re_{len(refunds.read_text().splitlines()) + 1 if refunds.exists() else 1}",
               "charge": charge, "amount_cents": amount_cents}  # fmt: skip
    with refunds.open("a") as out:  # the side effect: this provider does not deduplicate
        out.write(json.dumps(receipt) + "\n")
    return receipt


def graph_for(gate: WardenGate):
    model = ChatOpenAI(model=os.environ.get("MODEL", "gpt-4.1-mini"), base_url=os.environ.get("OPENAI_BASE_URL"),
                       max_retries=0).bind_tools([refund])  # fmt: skip

    def think(state: MessagesState) -> dict:
        return {"messages": [model.invoke(state["messages"])]}

    def route(state: MessagesState) -> str:
        return "tools" if getattr(state["messages"][-1], "tool_calls", None) else END

    builder = StateGraph(MessagesState)
    builder.add_node("model", think)
    builder.add_node("tools", gate.tool_node([refund], names={"refund": "payments.refund"}))
    builder.add_edge(START, "model")
    builder.add_conditional_edges("model", route, ["tools", END])
    builder.add_edge("tools", "model")
    return builder.compile(checkpointer=InMemorySaver())


def main(charge: str) -> int:
    warden = WardenClient(os.environ["WARDEN_URL"], os.environ["WARDEN_TOKEN"])
    run = warden.run_start("external-agent", goal=f"Refund {charge}", idempotency_key=f"langgraph-refund-{charge}")
    warden.task_open(run.id, "billing", agent="billing-graph", objective=f"Refund {charge}")
    print(f"Warden run {run.id}: {os.environ['WARDEN_URL']}/runs/{run.id}/", flush=True)
    gate = WardenGate(warden, run.id, "billing", classes={"payments.refund": ("non_idempotent_write", "irreversible")})
    config = {
        "configurable": {"thread_id": f"refund-{charge}"},
        "callbacks": [WardenCallbacks(warden, run.id, "billing")],
    }
    graph = graph_for(gate)
    result = graph.invoke({"messages": [("user", f"Refund 25.00 (2500 cents) of charge {charge}.")]}, config)
    if gate.pending(graph, config):
        print("the refund waits for a reviewer in Warden's /approvals/", flush=True)
        result = gate.resume_when_decided(graph, config)
    answer = result["messages"][-1].content
    print(answer, flush=True)
    warden.run_finish(run.id, completed=True, reason=str(answer)[:500])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else "ch_1001"))
