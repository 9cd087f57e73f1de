"""The framework adapters, each with its real package and its shipped example against a live Warden and a
local model server that scripts the tool call (no network): the OpenAI Agents SDK
(warden_client.openai_agents, examples/openai_agents_refund.py) and LangGraph (warden_client.langgraph,
examples/langgraph_refund.py, where the wait is a LangGraph interrupt). For each: the irreversible refund
waits for a reviewer and is made once after the yes; a rejection reaches the model as the tool's answer
and nothing is made; the agent killed after the refund and started again does not refund twice; the
framework's spans show in the run's trace."""

import http.server
import json
import os
import signal
import subprocess
import threading

import pytest

from approvals.models import ApprovalRequest
from runs.models import Run, Span
from tests.conftest import ROOT, wait_for
from tests.runs.test_external_agent import call
from tools.models import ToolOperation

# The adapters are the client's and the frameworks' code; Warden's side of them (the external agent's API)
# is the same in both modes and tested in both (tests/runs/test_external_agent.py). Run once, beside the
# scaled half of ./warden test, so the two halves end together.
pytestmark = pytest.mark.embedded

EXAMPLES = {
    "openai-agents": ROOT / "examples" / "openai_agents_refund.py",
    "langgraph": ROOT / "examples" / "langgraph_refund.py",
}


class ChatModel:
    """A chat-completions server: with no tool result yet it asks for the refund; with one, it answers
    with what the tool said. ``hold``: the first answer after a tool result waits for ``release``."""

    def __init__(self, *, hold: bool = False):
        self.requests: list[dict] = []
        self.release, self.hold, self.answered_after_tool = threading.Event(), hold, 0
        model = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self):
                request = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))))
                model.requests.append(request)
                data = json.dumps(model.answer(request)).encode()
                try:
                    self.send_response(200)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                except OSError:
                    pass

            def log_message(self, *args):
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def tool_answers(self, request: dict) -> list[str]:
        return [m["content"] for m in request["messages"] if m["role"] == "tool"]

    def answer(self, request: dict) -> dict:
        answers = self.tool_answers(request)
        if not answers:
            arguments = json.dumps({"charge": "ch_1001", "amount_cents": 2500})
            message = {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {"id": "call_refund", "type": "function", "function": {"name": "refund", "arguments": arguments}}
                ],
            }
        else:
            self.answered_after_tool += 1
            if self.hold and self.answered_after_tool == 1:
                self.release.wait(120)
            message = {"role": "assistant", "content": f"Done. The refund tool said: {answers[-1]}"}
        return {
            "id": "chatcmpl-1", "object": "chat.completion", "created": 1764400000, "model": "gpt-test",
            "choices": [{"index": 0, "message": message, "finish_reason": "tool_calls" if not answers else "stop"}],
            "usage": {"prompt_tokens": 120, "completion_tokens": 30, "total_tokens": 150},
        }  # fmt: skip

    def stop(self):
        self.release.set()
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def model():
    server = ChatModel()
    yield server
    server.stop()


def start_agent(agent_python, live_url, token, model, tmp_path, framework) -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "DJANGO_SETTINGS_MODULE")}
    env.update(WARDEN_URL=live_url, WARDEN_TOKEN=token, OPENAI_API_KEY="sk-local", OPENAI_BASE_URL=model.url,
               MODEL="gpt-test", REFUNDS_FILE=str(tmp_path / "refunds.jsonl"))  # fmt: skip
    return subprocess.Popen([agent_python, str(EXAMPLES[framework]), "ch_1001"], cwd=tmp_path, env=env,
                            stdout=open(tmp_path / "agent.log", "a"), stderr=subprocess.STDOUT)  # fmt: skip


def refunds(tmp_path) -> list[dict]:
    path = tmp_path / "refunds.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def decide(client, reviewer, *, approve: bool, note: str = "") -> None:
    wait_for(lambda: ApprovalRequest.objects.filter(status="pending").exists(), timeout=90, message="the approval")
    request = ApprovalRequest.objects.get(status="pending")
    body = {"decision": "approve" if approve else "reject", "note": note, "arguments_hash": request.arguments_hash}
    answer = call(client, reviewer, f"/api/v1/approvals/{request.id}/decision", body)
    assert answer.status_code == 200, answer.content


def finished(process, tmp_path, timeout=120) -> None:
    process.wait(timeout=timeout)
    assert process.returncode == 0, (tmp_path / "agent.log").read_text()[-3000:]


@pytest.mark.processes
@pytest.mark.parametrize("framework", list(EXAMPLES))
def test_the_refund_waits_for_a_reviewer_and_is_made_once_after_the_yes(
    people,
    live_url,
    agent_python,
    model,
    client,
    tmp_path,
    framework,
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
    run = Run.objects.get(id=op.run_id)
    assert run.status == "completed"
    # The framework's spans: its model calls with their tokens, and the tool call.
    assert Span.objects.filter(run=run, kind="model_call").count() == 2 and run.tokens_used >= 300
    assert Span.objects.filter(run=run, kind="tool_call", name="refund").exists()
    assert made["refund"] in model.tool_answers(model.requests[-1])[-1]  # the model saw the receipt


@pytest.mark.processes
@pytest.mark.parametrize("framework", list(EXAMPLES))
def test_a_rejection_reaches_the_model_as_the_tools_answer_and_nothing_is_made(
    people,
    live_url,
    agent_python,
    model,
    client,
    tmp_path,
    framework,
):
    agent, reviewer = people
    process = start_agent(agent_python, live_url, agent, model, tmp_path, framework)
    decide(client, reviewer, approve=False, note="no refunds for this customer")
    finished(process, tmp_path)
    assert refunds(tmp_path) == []
    said = model.tool_answers(model.requests[-1])[-1]
    assert "Warden did not allow payments.refund" in said and "no refunds for this customer" in said
    assert ToolOperation.objects.get(tool="payments.refund").status == "rejected"


@pytest.mark.processes
@pytest.mark.parametrize("framework", list(EXAMPLES))
def test_the_agent_killed_after_the_refund_and_started_again_does_not_refund_twice(
    people,
    live_url,
    agent_python,
    client,
    tmp_path,
    framework,
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

        second = start_agent(agent_python, live_url, agent, model, tmp_path, framework)
        finished(second, tmp_path)
        assert len(refunds(tmp_path)) == 1  # the restarted agent got the recorded receipt
        receipt = refunds(tmp_path)[0]["refund"]
        assert receipt in model.tool_answers(model.requests[-1])[-1]
        assert ToolOperation.objects.get(tool="payments.refund").status == "committed"
    finally:
        model.stop()
