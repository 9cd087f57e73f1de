"""The native agent loop: a real provider's conversation in its own message format (OpenAI-compatible and
Anthropic), several tool calls in one reply each keyed, gated and journaled on its own, whole tool results
within the context budget (trimmed oldest first, by structure, visibly), and a resume that rebuilds the
exact messages from the journal: a worker SIGKILLed between two calls of one reply repeats nothing, and
the request it sends next is byte-identical to the one the killed worker sent."""

import http.server
import json
import signal
import threading

import pytest

from agents.conversation import TRIMMED, anthropic_messages, fit, openai_messages, turns
from agents.gateway import circuit_reset
from agents.models import Agent, ModelPrice, Workflow
from approvals.policies import demo_waivers_load
from runs.models import Run, Span
from runs.services import run_start
from tests.conftest import wait_for
from tests.local_http import answer_json, serve
from tools.models import SandboxCall, ToolOperation

API_KEY = "sk-native-loop-test"
HITS = [{"id": f"doc-{n}", "title": f"Runbook {n}", "text": "restart the pods in order; " * 14} for n in range(5)]
MAILS = [
    {"to": "a@customers.example", "subject": "Incident", "body": "We are on it."},
    {"to": "b@customers.example", "subject": "Incident", "body": "We are on it."},
]


# --- the conversation, as a pure function of the journal ---------------------------------------------


def journal_of_two_calls(result) -> list[dict]:
    calls = [{"id": "call_a", "name": "docs.search", "arguments": {"query": "pods"}},
             {"id": "call_b", "name": "email.send", "arguments": MAILS[0]}]  # fmt: skip
    return [
        {
            "step": 1,
            "kind": "model_call",
            "name": "m",
            "body": {"text": "", "tool_calls": calls, "tool_call": calls[0]},
        },
        {"step": 2, "kind": "tool_call", "name": "docs.search", "body": {"result": result, "call_id": "call_a"}},
        {"step": 3, "kind": "tool_call", "name": "email.send", "body": {"result": {"id": "m1"}, "call_id": "call_b"}},
    ]


def test_a_five_hit_search_reaches_the_model_whole_and_in_the_providers_formats():
    history, dropped = fit(turns(journal_of_two_calls({"hits": HITS})), 12_000)
    assert dropped == 0 and json.loads(history[1]["content"]) == {"result": {"hits": HITS}}  # whole, not a preview
    openai = openai_messages("sys", "task", history)
    assert [m["role"] for m in openai] == ["system", "user", "assistant", "tool", "tool"]
    assert [c["id"] for c in openai[2]["tool_calls"]] == ["call_a", "call_b"]
    assert openai[2]["tool_calls"][0]["function"]["name"] == "docs__search"
    assert [m["tool_call_id"] for m in openai[3:]] == ["call_a", "call_b"]
    anthropic = anthropic_messages("task", history)
    assert [m["role"] for m in anthropic] == ["user", "assistant", "user"]  # both results in one message
    assert [b["tool_use_id"] for b in anthropic[2]["content"]] == ["call_a", "call_b"]
    assert [b["id"] for b in anthropic[1]["content"] if b["type"] == "tool_use"] == ["call_a", "call_b"]


def test_past_the_budget_the_oldest_result_is_trimmed_by_structure_with_a_marker():
    journal = journal_of_two_calls({"hits": HITS})
    later = journal_of_two_calls({"hits": HITS[:2]})
    for entry in later:
        entry["step"] += 3
    history, dropped = fit(turns(journal + later), 3_000)
    oldest, newest = history[1]["content"], history[4]["content"]
    assert TRIMMED in oldest and json.loads(oldest)["result"]["hits"][0]["id"] == "doc-0"  # still JSON, still keyed
    assert newest == json.dumps({"result": {"hits": HITS[:2]}}, sort_keys=True)  # the newest kept whole
    assert dropped == 0
    # Far too small a budget: the oldest exchanges go whole, never the newest.
    history, dropped = fit(turns(journal + later), 500)
    assert dropped == 1 and history[0]["role"] == "assistant" and len(history) == 3


def test_the_messages_are_the_same_bytes_each_time_they_are_rebuilt():
    journal = journal_of_two_calls({"hits": HITS})
    first = json.dumps(openai_messages("s", "u", fit(turns(journal), 4_000)[0]))
    again = json.dumps(openai_messages("s", "u", fit(turns(json.loads(json.dumps(journal))), 4_000)[0]))
    assert first == again


# --- end to end against local protocol servers ------------------------------------------------------


class ScriptedModel:
    """A local server speaking the OpenAI chat-completions and Anthropic messages protocols. Turn 1 of
    a task asks for two e-mails in one reply; once both results are in the conversation it answers.
    ``hold``: the first request of turn 2 is held until released (a worker is killed meanwhile)."""

    def __init__(self, *, hold: bool = False):
        self.bodies: list[bytes] = []
        self.turn2: list[bytes] = []
        self.release = threading.Event()
        self.hold = hold
        model = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self):
                raw = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                model.bodies.append(raw)
                answer = model.answer(self.path, json.loads(raw), raw)
                data = json.dumps(answer).encode()
                answer_json(self, data)

            def log_message(self, *args):
                pass

        self.httpd, self.url = serve(Handler)

    def answer(self, path: str, request: dict, raw: bytes) -> dict:
        anthropic = path.endswith("/messages")
        results = sum(1 for m in request["messages"] if m["role"] == "tool" or _has_results(m))
        if results == 0:
            calls = [("email__send", MAILS[0], "call_a"), ("email__send", MAILS[1], "call_b")]
            return anthropic_reply(calls) if anthropic else openai_reply(calls)
        self.turn2.append(raw)
        if self.hold and len(self.turn2) == 1:
            self.release.wait(120)
        final = json.dumps({"sent": 2})
        return anthropic_reply([], text=final) if anthropic else openai_reply([], text=final)

    def stop(self):
        self.release.set()
        self.httpd.shutdown()
        self.httpd.server_close()


def _has_results(message: dict) -> bool:
    content = message["content"]
    return isinstance(content, list) and any(b.get("type") == "tool_result" for b in content)


def openai_reply(calls, text=None) -> dict:
    message = {"role": "assistant", "content": text}
    if calls:
        message["tool_calls"] = [
            {"id": ident, "type": "function", "function": {"name": name, "arguments": json.dumps(args)}}
            for name, args, ident in calls
        ]
    return {
        "id": "chatcmpl-x", "object": "chat.completion", "created": 1764400000, "model": "gpt-test",
        "choices": [{"index": 0, "message": message, "finish_reason": "tool_calls" if calls else "stop"}],
        "usage": {"prompt_tokens": 100, "completion_tokens": 20, "total_tokens": 120},
    }  # fmt: skip


def anthropic_reply(calls, text=None) -> dict:
    blocks = [{"type": "tool_use", "id": ident, "name": name, "input": args} for name, args, ident in calls]
    if text:
        blocks.insert(0, {"type": "text", "text": text})
    return {
        "id": "msg_x", "type": "message", "role": "assistant", "model": "claude-test", "content": blocks,
        "stop_reason": "tool_use" if calls else "end_turn", "stop_sequence": None,
        "usage": {"input_tokens": 100, "output_tokens": 20},
    }  # fmt: skip


def provider_env(model: ScriptedModel) -> dict:
    return {
        "WARDEN_OPENAI_BASE_URL": model.url + "/v1",
        "WARDEN_OPENAI_API_KEY_ENV": "WARDEN_TEST_OPENAI_KEY",
        "WARDEN_ANTHROPIC_BASE_URL": model.url,
        "WARDEN_ANTHROPIC_API_KEY_ENV": "WARDEN_TEST_ANTHROPIC_KEY",
        "WARDEN_TEST_OPENAI_KEY": API_KEY,
        "WARDEN_TEST_ANTHROPIC_KEY": API_KEY,
    }


@pytest.fixture
def scripted_model(settings, monkeypatch):
    model = ScriptedModel()
    env = provider_env(model)
    settings.WARDEN = {
        **settings.WARDEN,
        "OPENAI_BASE_URL": env["WARDEN_OPENAI_BASE_URL"],
        "OPENAI_API_KEY_ENV": "WARDEN_TEST_OPENAI_KEY",
        "ANTHROPIC_BASE_URL": env["WARDEN_ANTHROPIC_BASE_URL"],
        "ANTHROPIC_API_KEY_ENV": "WARDEN_TEST_ANTHROPIC_KEY",
    }
    monkeypatch.setenv("WARDEN_TEST_OPENAI_KEY", API_KEY)
    monkeypatch.setenv("WARDEN_TEST_ANTHROPIC_KEY", API_KEY)
    circuit_reset()
    yield model
    circuit_reset()
    model.stop()


def mailing_workflow(provider: str) -> Workflow:
    model = "claude-test" if provider == "anthropic" else "gpt-test"
    agent = Agent.objects.create(slug=f"mailer-{provider}", name="Mailer", provider=provider, model=model,
                                 allowed_tools=["email.send"], max_attempts=5)  # fmt: skip
    ModelPrice.objects.get_or_create(provider=provider, model=model,
                                     defaults={"input_usd_per_mtok": 1, "output_usd_per_mtok": 2})  # fmt: skip
    task = {"key": "answer", "agent": agent.slug, "objective": "Tell both customers."}
    demo_waivers_load()  # the e-mails leave unattended, as in the demo project: the calls are the subject
    return Workflow.objects.create(slug=f"mail-{provider}", name="Mail", tasks=[task])


def mails(run) -> list[SandboxCall]:
    return list(SandboxCall.objects.filter(tool="email.send", is_effect=True, idempotency_key__contains=f":{run.id}:"))


@pytest.mark.parametrize("provider", ["openai", "anthropic"])
def test_two_calls_in_one_reply_are_each_keyed_gated_journaled_and_answered_in_the_providers_format(
    provider, scripted_model, transactional_db, worker
):
    run = run_start(workflow=mailing_workflow(provider).slug)
    wait_for(lambda: Run.objects.get(id=run.id).is_terminal, timeout=60, message="the run to end")
    run.refresh_from_db()
    assert run.status == Run.Status.COMPLETED, run.status_reason
    ops = list(ToolOperation.objects.filter(run=run).order_by("step"))
    assert [(op.step, op.status) for op in ops] == [(2, "committed"), (3, "committed")]
    assert len({op.idempotency_key for op in ops}) == 2 and len(mails(run)) == 2
    assert [s.kind for s in Span.objects.filter(run=run, step__isnull=False).order_by("step")] == [
        "model_call", "tool_call", "tool_call", "model_call"
    ]  # fmt: skip
    [turn2] = scripted_model.turn2
    messages = json.loads(turn2)["messages"]
    if provider == "openai":
        assert [m["role"] for m in messages] == ["system", "user", "assistant", "tool", "tool"]
        assert [m["tool_call_id"] for m in messages[3:]] == ["call_a", "call_b"]
        assert json.loads(messages[3]["content"])["result"] == ops[0].result  # the whole result
    else:
        assert [m["role"] for m in messages] == ["user", "assistant", "user"]
        assert [b["tool_use_id"] for b in messages[2]["content"]] == ["call_a", "call_b"]


@pytest.mark.services
@pytest.mark.processes
def test_a_worker_killed_between_two_calls_and_again_mid_turn_repeats_nothing_and_resends_the_same_bytes(
    transactional_db, processes, settings
):
    model = ScriptedModel(hold=True)
    try:
        env = {**provider_env(model), "WARDEN_LEASE_SECONDS": "4"}
        workflow = mailing_workflow("openai")
        crash = {"faults": [{"task": "answer", "call": 1, "mode": "crash", "point": "after_advance"}]}
        run = run_start(workflow=workflow.slug, input=crash)

        first = processes.worker(**env)  # sends turn 1, makes call 1, journals it, dies before call 2
        wait_for(lambda: first.poll() is not None, timeout=90, message="the first worker to die")
        assert len(mails(run)) == 1 and len(model.bodies) == 1, processes.log(first)

        second = processes.worker(**env)  # resumes: call 2 only, then turn 2, which the model holds
        wait_for(lambda: len(model.turn2) == 1, timeout=90, message="turn 2 to be asked")
        assert len(mails(run)) == 2
        for pid in processes.children(second):
            __import__("os").kill(pid, signal.SIGKILL)  # killed while waiting for the model's answer
        wait_for(lambda: second.poll() is not None, timeout=30, message="the second worker to go")
        model.release.set()

        processes.worker(**env)  # asks turn 2 again, from the journal alone
        wait_for(lambda: Run.objects.get(id=run.id).is_terminal, timeout=90, message="the run to end")
        run.refresh_from_db()
        assert run.status == Run.Status.COMPLETED, run.status_reason
        assert len(mails(run)) == 2 and len({m.idempotency_key for m in mails(run)}) == 2  # 0 duplicates
        assert len(model.turn2) == 2 and model.turn2[0] == model.turn2[1]  # byte-identical after resume
        assert len(model.bodies) == 3  # turn 1 was never asked again
    finally:
        model.stop()
