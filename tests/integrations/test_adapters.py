"""The framework adapters, each with its real package and its shipped example against a live Warden and a
local model server that asks for the refunds (no network): the OpenAI Agents SDK
(warden_client.openai_agents, examples/openai_agents_refund.py) and LangGraph (warden_client.langgraph,
examples/langgraph_refund.py, where the wait is a LangGraph interrupt and the checkpoints are in SQLite).
The model answers as a real one does: a fresh tool-call id in every response, parallel calls in any order.
For each: the irreversible refund waits for a reviewer and is made once after the yes, with Warden's
idempotency key; a rejection reaches the model as the tool's answer and nothing is made; a tool that
raises is recorded as failed (ambiguous when it may have acted), never committed; an agent killed between
a refund and its report, or after it, and started again refunds no charge twice; the framework's spans
show in the run's trace, with their cost."""

import http.server
import json
import os
import random
import re
import signal
import subprocess
import threading
import uuid

import httpx
import pytest

from policy.models import ApprovalRequest
from runs.models import Run, Span
from tests.conftest import ROOT, wait_for
from tests.integrations.test_external_agent import call
from tests.local_http import answer_json, serve
from tools.models import ToolOperation

# The adapters are the client's and the frameworks' code; Warden's side of them (the external agent's API)
# is the same in both modes and tested in both (tests/integrations/test_external_agent.py). Run once, beside the
# scaled half of ./warden test, so the two halves end together.
pytestmark = [pytest.mark.embedded, pytest.mark.processes]

EXAMPLES = {
    "openai-agents": ROOT / "examples" / "openai_agents_refund.py",
    "langgraph": ROOT / "examples" / "langgraph_refund.py",
}


class ChatModel:
    """A chat-completions server: with no tool result yet it asks for a refund of each charge the user
    names, in parallel calls, in a random order, each with a fresh id; with results, it answers with
    what the tools said. ``hold``: the first answer after a tool result waits for ``release``."""

    def __init__(self, *, hold: bool = False):
        self.requests: list[dict] = []
        self.release, self.hold, self.answered_after_tool = threading.Event(), hold, 0
        model = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self):
                request = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))))
                model.requests.append(request)
                data = json.dumps(model.answer(request)).encode()
                answer_json(self, data)

            def log_message(self, *args):
                pass

        self.httpd, _ = serve(Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"

    def tool_answers(self, request: dict) -> list[str]:
        return [m["content"] for m in request["messages"] if m["role"] == "tool"]

    def tool_calls(self, request: dict) -> list[dict]:
        asked = next(m["content"] for m in request["messages"] if m["role"] == "user")
        charges = re.findall(r"ch_\w+", asked)
        random.shuffle(charges)
        return [
            {"id": f"call_{uuid.uuid4().hex[:24]}", "type": "function",
             "function": {"name": "refund", "arguments": json.dumps({"charge": charge, "amount_cents": 2500})}}
            for charge in charges
        ]  # fmt: skip

    def answer(self, request: dict) -> dict:
        answers = self.tool_answers(request)
        if not answers:
            message = {"role": "assistant", "content": None, "tool_calls": self.tool_calls(request)}
        else:
            self.answered_after_tool += 1
            if self.hold and self.answered_after_tool == 1:
                self.release.wait(120)
            message = {"role": "assistant", "content": f"Done. The refund tool said: {' | '.join(answers)}"}
        return {
            "id": f"chatcmpl-{uuid.uuid4().hex[:12]}", "object": "chat.completion", "created": 1764400000,
            "model": "gpt-test",
            "choices": [{"index": 0, "message": message, "finish_reason": "tool_calls" if not answers else "stop"}],
            "usage": {"prompt_tokens": 120, "completion_tokens": 30, "total_tokens": 150},
        }  # fmt: skip

    def stop(self):
        self.release.set()
        self.httpd.shutdown()
        self.httpd.server_close()


class WardenProxy:
    """Between the agent and Warden: passes every request on, except that once ``hold_outcomes`` is set,
    the report of a tool call's outcome is held (never passed on): the refund is made, its report is not."""

    def __init__(self, target: str):
        self.hold_outcomes, self.held, self.gone = threading.Event(), threading.Event(), threading.Event()
        proxy = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def _pass(self):
                body = self.rfile.read(int(self.headers.get("Content-Length", 0) or 0))
                if proxy.hold_outcomes.is_set() and re.search(r"/operations/\d+/outcome$", self.path):
                    proxy.held.set()
                    proxy.gone.wait(120)
                    return
                headers = {k: v for k, v in self.headers.items() if k.lower() not in ("host", "content-length")}
                answer = httpx.request(self.command, target + self.path, content=body, headers=headers, timeout=60)
                try:
                    self.send_response(answer.status_code)
                    self.send_header("Content-Type", answer.headers.get("content-type", "application/json"))
                    self.send_header("Content-Length", str(len(answer.content)))
                    self.end_headers()
                    self.wfile.write(answer.content)
                except OSError:
                    pass

            do_GET = do_POST = _pass

            def log_message(self, *args):
                pass

        self.httpd, _ = serve(Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"

    def stop(self):
        self.gone.set()
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def model():
    server = ChatModel()
    yield server
    server.stop()


def start_agent(agent_python, warden_url, token, model, tmp_path, framework, *charges) -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "DJANGO_SETTINGS_MODULE")}
    env.update(WARDEN_URL=warden_url, WARDEN_TOKEN=token, OPENAI_API_KEY="sk-local", OPENAI_BASE_URL=model.url,
               MODEL="gpt-test", PRICE_IN="2.0", PRICE_OUT="8.0", REFUNDS_FILE=str(tmp_path / "refunds.jsonl"),
               CHECKPOINTS=str(tmp_path / "checkpoints.sqlite"))  # fmt: skip
    return subprocess.Popen([agent_python, str(EXAMPLES[framework]), *(charges or ["ch_1001"])], cwd=tmp_path,
                            env=env, stdout=open(tmp_path / "agent.log", "a"), stderr=subprocess.STDOUT)  # fmt: skip


def refunds(tmp_path) -> list[dict]:
    path = tmp_path / "refunds.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def decide(client, reviewer, *, approve: bool, note: str = "", count: int = 1) -> None:
    """The reviewer decides ``count`` refunds, as they come."""
    for _ in range(count):
        wait_for(lambda: ApprovalRequest.objects.filter(status="pending").exists(), timeout=90, message="an approval")
        request = ApprovalRequest.objects.filter(status="pending").first()
        body = {"decision": "approve" if approve else "reject", "note": note, "arguments_hash": request.arguments_hash}
        answer = call(client, reviewer, f"/api/v1/approvals/{request.id}/decision", body)
        assert answer.status_code == 200, answer.content


def finished(process, tmp_path, *, operations: int = 1, timeout=120) -> None:
    """The agent ends well, having asked Warden for no more refunds than ``operations`` (one asked again
    would wait for a reviewer: the agent would never end)."""
    wait_for(lambda: process.poll() is not None or ToolOperation.objects.count() > operations, timeout=timeout,
             message="the agent to end")  # fmt: skip
    asked = list(ToolOperation.objects.values_list("step", "arguments", "status"))
    assert len(asked) <= operations, f"a refund was asked for again, as another call: {asked}"
    assert process.returncode == 0, (tmp_path / "agent.log").read_text()[-3000:]


def test_the_refund_waits_for_a_reviewer_and_is_made_once_after_the_yes_with_wardens_key(
    people, live_url, agent_python, model, client, tmp_path, framework
):
    agent, reviewer = people
    process = start_agent(agent_python, live_url, agent, model, tmp_path, framework)
    wait_for(lambda: ApprovalRequest.objects.exists(), timeout=120, message="the refund held for a reviewer")
    assert refunds(tmp_path) == []  # held: nothing made before the yes
    decide(client, reviewer, approve=True)
    finished(process, tmp_path)
    [made] = refunds(tmp_path)
    op = ToolOperation.objects.get(tool="payments.refund")
    assert (op.status, op.result["refund"]) == ("committed", made["refund"])
    assert made["idempotency_key"] == op.idempotency_key  # the tool got Warden's key, and gave it to the provider
    assert "idempotency_key" not in json.dumps(model.requests[0]["tools"])  # the model never sees it
    run = Run.objects.get(id=op.run_id)
    assert run.status == "completed"
    # The framework's spans: its model calls with their tokens and cost, and the tool call.
    assert Span.objects.filter(run=run, kind="model_call").count() == 2 and run.tokens_used >= 300
    assert run.cost_micros == 2 * (120 * 2 + 30 * 8)  # 2 calls at $2 / $8 per million tokens
    assert Span.objects.filter(run=run, kind="tool_call", name="refund").exists()
    assert made["refund"] in model.tool_answers(model.requests[-1])[-1]  # the model saw the receipt


def test_a_rejection_reaches_the_model_as_the_tools_answer_and_nothing_is_made(
    people, live_url, agent_python, model, client, tmp_path, framework
):
    agent, reviewer = people
    process = start_agent(agent_python, live_url, agent, model, tmp_path, framework)
    decide(client, reviewer, approve=False, note="no refunds for this customer")
    finished(process, tmp_path)
    assert refunds(tmp_path) == []
    said = model.tool_answers(model.requests[-1])[-1]
    assert "Warden did not allow payments.refund" in said and "no refunds for this customer" in said
    assert ToolOperation.objects.get(tool="payments.refund").status == "rejected"


@pytest.mark.parametrize(
    "charge, status, made, said",
    [
        # The provider said no: the model is told as the framework tells it (the SDK's default failure
        # function hides the exception's text; LangGraph's ToolNode shows it).
        (
            "ch_disputed_7",
            "failed",
            0,
            {
                "openai-agents": "An error occurred while running the tool",
                "langgraph": "is disputed: it cannot be refunded",
            },
        ),  # fmt: skip
        (
            "ch_slow_7",
            "ambiguous",
            1,
            {"openai-agents": "may or may not have been done", "langgraph": "may or may not have been done"},
        ),  # it refunded, then timed out
    ],
)
def test_a_tool_that_raises_is_recorded_as_failed_or_ambiguous_never_committed(
    people, live_url, agent_python, model, client, tmp_path, framework, charge, status, made, said
):
    agent, reviewer = people
    process = start_agent(agent_python, live_url, agent, model, tmp_path, framework, charge)
    decide(client, reviewer, approve=True)
    finished(process, tmp_path)
    assert len(refunds(tmp_path)) == made
    op = ToolOperation.objects.get(tool="payments.refund")
    assert (op.status, op.result) == (status, None)
    assert said[framework] in model.tool_answers(model.requests[-1])[-1]  # the model was told; the run went on
    assert Run.objects.get(id=op.run_id).status == "completed"


def restart_modes():
    # LangGraph resumes from its checkpoints (the tool node runs again, with the recorded calls), or,
    # its checkpoints lost, asks the model again: fresh ids. The OpenAI Agents SDK always asks again.
    return [
        pytest.param("openai-agents", False, id="openai-agents"),
        pytest.param("langgraph", False, id="langgraph-resumed"),
        pytest.param("langgraph", True, id="langgraph-checkpoints-lost"),
    ]


@pytest.mark.parametrize("framework, lose_checkpoints", restart_modes())
def test_an_agent_killed_between_a_refund_and_its_report_refunds_each_charge_once(
    people, live_url, agent_python, model, client, tmp_path, framework, lose_checkpoints
):
    agent, reviewer = people
    proxy = WardenProxy(live_url)
    try:
        first = start_agent(agent_python, proxy.url, agent, model, tmp_path, framework, "ch_1001", "ch_1002")
        wait_for(lambda: ApprovalRequest.objects.count() == 2, timeout=120, message="both refunds held")
        proxy.hold_outcomes.set()
        decide(client, reviewer, approve=True, count=2)
        wait_for(proxy.held.is_set, timeout=120, message="a refund made and its report on its way")
        first.send_signal(signal.SIGKILL)  # the refund is made; Warden has not heard of it
        first.wait(timeout=30)
    finally:
        proxy.stop()
    assert ToolOperation.objects.filter(status="executing").exists() and len(refunds(tmp_path)) >= 1
    if lose_checkpoints:
        (tmp_path / "checkpoints.sqlite").unlink()

    second = start_agent(agent_python, live_url, agent, model, tmp_path, framework, "ch_1001", "ch_1002")
    finished(second, tmp_path, operations=2)
    made = refunds(tmp_path)
    assert sorted(r["charge"] for r in made) == ["ch_1001", "ch_1002"]  # each once
    ops = ToolOperation.objects.filter(tool="payments.refund")
    assert {op.status for op in ops} == {"committed"}
    assert {op.idempotency_key for op in ops} == {r["idempotency_key"] for r in made}
    said = model.tool_answers(model.requests[-1])
    assert all(any(r["refund"] in answer for answer in said) for r in made)  # the model saw both receipts


@pytest.mark.parametrize("framework, lose_checkpoints", restart_modes())
def test_an_agent_killed_after_the_refund_and_started_again_does_not_refund_twice(
    people, live_url, agent_python, client, tmp_path, framework, lose_checkpoints
):
    agent, reviewer = people
    model = ChatModel(hold=True)
    try:
        first = start_agent(agent_python, live_url, agent, model, tmp_path, framework)
        decide(client, reviewer, approve=True)
        wait_for(lambda: model.answered_after_tool == 1, timeout=120, message="the refund to be made")
        assert len(refunds(tmp_path)) == 1
        first.send_signal(signal.SIGKILL)  # while it waits for the model's next answer
        first.wait(timeout=30)
        model.release.set()
        if lose_checkpoints:
            (tmp_path / "checkpoints.sqlite").unlink()

        second = start_agent(agent_python, live_url, agent, model, tmp_path, framework)
        finished(second, tmp_path)
        assert len(refunds(tmp_path)) == 1  # the restarted agent got the recorded receipt
        receipt = refunds(tmp_path)[0]["refund"]
        assert receipt in model.tool_answers(model.requests[-1])[-1]
        assert ToolOperation.objects.get(tool="payments.refund").status == "committed"
    finally:
        model.stop()


def pytest_generate_tests(metafunc):
    if "framework" in metafunc.fixturenames and not any(
        "framework" in (m.args[0] if m.args else "") for m in metafunc.definition.iter_markers("parametrize")
    ):
        metafunc.parametrize("framework", list(EXAMPLES))
