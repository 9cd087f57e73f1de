"""The gateway with real providers: the official openai and anthropic SDKs talk to a local HTTP server
that speaks their protocol (tool calls, 429 with Retry-After, 500, 529, garbled JSON). Nothing of the
SDKs is mocked: what is checked is what went over the wire and what the run recorded."""

import http.server
import json
import threading
import time

import pytest
from django.urls import reverse

from agents.gateway import ModelRequest, circuit_reset, model_complete
from agents.models import Agent, ModelPrice, Workflow
from core.errors import StepFailure, TransientFailure
from runs.models import Run, Span
from runs.services import run_start
from tenancy.access import default_project
from tenancy.models import Project
from tests.conftest import wait_for

API_KEY = "sk-test-canary-7f3a91"


def completion(*, content=None, tool=None, arguments="{}", prompt_tokens=1000, completion_tokens=200) -> dict:
    message = {"role": "assistant", "content": content}
    if tool:
        message["tool_calls"] = [
            {"id": "call_1", "type": "function", "function": {"name": tool, "arguments": arguments}}
        ]
    return {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "created": 1764400000,
        "model": "gpt-test",
        "choices": [{"index": 0, "message": message, "finish_reason": "tool_calls" if tool else "stop"}],
        "usage": {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
        },
    }


class FakeOpenAI:
    """Answers POST /v1/chat/completions from a queue of (status, headers, body); records each request."""

    def __init__(self):
        self.queue: list[tuple[int, dict, bytes]] = []
        self.default: tuple[int, dict, bytes] | None = None
        self.respond = None  # or a function of the request's JSON that answers 200 with its result
        self.requests: list[dict] = []
        server = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                server.requests.append(
                    {
                        "at": time.monotonic(),
                        "path": self.path,
                        "headers": {k.lower(): v for k, v in self.headers.items()},
                        "json": json.loads(body),
                    }
                )
                if server.respond is not None:
                    status, headers, payload = 200, {}, json.dumps(server.respond(server.requests[-1]["json"])).encode()
                else:
                    status, headers, payload = server.queue.pop(0) if server.queue else server.default
                self.send_response(status)
                for name, value in {"Content-Type": "application/json", **headers}.items():
                    self.send_header(name, value)
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            def log_message(self, *args):
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"
        threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()

    def answer(self, status=200, body=None, headers=None, raw: bytes | None = None):
        self.queue.append((status, headers or {}, raw if raw is not None else json.dumps(body).encode()))


@pytest.fixture
def provider(settings, monkeypatch):
    fake = FakeOpenAI()
    settings.WARDEN = {
        **settings.WARDEN,
        "OPENAI_BASE_URL": fake.url,
        "OPENAI_API_KEY_ENV": "WARDEN_TEST_OPENAI_KEY",
        "ANTHROPIC_BASE_URL": fake.url.removesuffix("/v1"),
        "ANTHROPIC_API_KEY_ENV": "WARDEN_TEST_ANTHROPIC_KEY",
    }
    monkeypatch.setenv("WARDEN_TEST_OPENAI_KEY", API_KEY)
    monkeypatch.setenv("WARDEN_TEST_ANTHROPIC_KEY", API_KEY)
    circuit_reset()
    yield fake
    circuit_reset()
    fake.httpd.shutdown()
    fake.httpd.server_close()


def ask(provider="openai", **request) -> object:
    request = ModelRequest(
        agent_slug="gpt", instructions="Be brief.", prompt="Objective: look up c-1", turn=1, attempt=1, **request
    )
    return model_complete(provider=provider, script=[], model="gpt-test", request=request)


def message(*blocks, input_tokens=900, output_tokens=80) -> dict:
    return {
        "id": "msg_1",
        "type": "message",
        "role": "assistant",
        "model": "claude-test",
        "content": list(blocks),
        "stop_reason": "tool_use" if any(b["type"] == "tool_use" for b in blocks) else "end_turn",
        "stop_sequence": None,
        "usage": {"input_tokens": input_tokens, "output_tokens": output_tokens},
    }


def test_anthropic_tool_use_goes_out_with_input_schemas_and_comes_back_parsed(provider, db):
    overloaded = {"type": "error", "error": {"type": "overloaded_error", "message": "overloaded"}}
    provider.answer(529, overloaded)
    provider.answer(
        body=message({"type": "tool_use", "id": "toolu_1", "name": "crm__read", "input": {"customer_id": "c-1"}})
    )
    provider.answer(body=message({"type": "text", "text": '{"answer": "42"}'}))
    response = ask("anthropic", tool_names=["crm.read"])
    assert response.tool_call == {"id": "toolu_1", "name": "crm.read", "arguments": {"customer_id": "c-1"}}
    assert (response.tokens_in, response.tokens_out, response.retries) == (900, 80, 1)  # the 529 was retried
    sent = provider.requests[-1]
    assert sent["path"] == "/v1/messages" and sent["headers"]["authorization"] == f"Bearer {API_KEY}"
    assert sent["json"]["system"] == "Be brief." and sent["json"]["messages"][0]["role"] == "user"
    [tool] = sent["json"]["tools"]
    assert tool["name"] == "crm__read" and "customer_id" in tool["input_schema"]["properties"]
    assert ask("anthropic").final == {"answer": "42"}


def test_a_tool_call_goes_out_with_the_tools_schemas_and_comes_back_parsed(provider, db):
    provider.answer(body=completion(tool="crm__read", arguments='{"customer_id": "c-1"}'))
    response = ask(tool_names=["crm.read", "no.such-tool"])
    assert response.tool_call == {"id": "call_1", "name": "crm.read", "arguments": {"customer_id": "c-1"}}
    assert (response.tokens_in, response.tokens_out, response.retries) == (1000, 200, 0)

    [sent] = provider.requests
    assert sent["path"] == "/v1/chat/completions" and sent["headers"]["authorization"] == f"Bearer {API_KEY}"
    assert sent["json"]["model"] == "gpt-test"
    assert [m["role"] for m in sent["json"]["messages"]] == ["system", "user"]
    [tool] = sent["json"]["tools"]  # an unknown tool is not offered
    assert tool["function"]["name"] == "crm__read"
    assert "customer_id" in tool["function"]["parameters"]["properties"]


def test_garbled_tool_arguments_reach_the_broker_as_text_and_a_garbled_answer_is_retried(provider, db):
    provider.answer(raw=b'{"choices": [')  # not JSON at all
    provider.answer(body=completion(tool="crm__read", arguments='{"customer_id": '))
    response = ask(tool_names=["crm.read"])
    assert response.retries == 1 and len(provider.requests) == 2
    assert response.tool_call == {"id": "call_1", "name": "crm.read", "arguments": '{"customer_id": '}


def test_an_identical_request_of_a_caching_agent_is_answered_once_and_paid_once(provider, db):
    import uuid

    ModelPrice.objects.create(provider="openai", model="gpt-test", input_usd_per_mtok="2.5", output_usd_per_mtok="10")
    prompt = f"Objective: look up c-1 ({uuid.uuid4()})"  # the cache is shared: nothing of another test's
    for _ in range(2):
        provider.answer(body=completion(content='{"answer": "42"}'))

    def ask_cached(text, cache_seconds=60):
        request = ModelRequest(agent_slug="gpt", instructions="", prompt=text, turn=1, attempt=1,
                               cache_seconds=cache_seconds)  # fmt: skip
        return model_complete(provider="openai", script=[], model="gpt-test", request=request)

    first, again = ask_cached(prompt), ask_cached(prompt)
    assert len(provider.requests) == 1
    assert (first.cached, first.cost_micros) == (False, 4500)
    assert (again.cached, again.cost_micros, again.final) == (True, 0, {"answer": "42"})
    assert again.as_journal()["cached"] is True
    ask_cached(prompt + " and c-2")  # another request: a call
    assert len(provider.requests) == 2
    provider.answer(body=completion(content="{}"))
    ask_cached(prompt, cache_seconds=0)  # an agent that does not cache: a call, even for the same request
    assert len(provider.requests) == 3


def test_over_the_providers_rate_limit_a_step_waits_or_is_retried_later_without_calling(provider, db, settings,
                                                                                       monkeypatch):  # fmt: skip
    import random
    import types

    import core.circuit
    from core.errors import TransientFailure

    minute = 60 * random.randint(10**6, 10**7)  # a window of its own, whatever the shared cache holds
    clock = types.SimpleNamespace(time=lambda: minute + 5.0)  # 55 s left in the window
    monkeypatch.setattr(core.circuit, "time", clock)
    settings.WARDEN = {**settings.WARDEN, "MODEL_RATE_PER_MINUTE": {"openai": 2}, "MODEL_RETRY_CAP_SECONDS": 2.0}
    for _ in range(2):
        provider.answer(body=completion(content="{}"))
        ask()
    with pytest.raises(TransientFailure, match="over its rate limit for 55s"):
        ask()  # waiting 55 s would hold the worker: the task retries later instead
    assert len(provider.requests) == 2
    clock.time = lambda: minute + 59.5  # half a second left: worth waiting for
    sleeps = []  # the gateway's clock only: other threads keep the real sleep
    monkeypatch.setattr("agents.gateway.time", types.SimpleNamespace(sleep=sleeps.append, time=time.time))
    provider.answer(body=completion(content="{}"))
    ask()
    assert sleeps == [0.5] and len(provider.requests) == 3


def test_a_simple_step_goes_to_the_cheaper_model_the_agents_rule_names(provider, db):
    rule = {"max_prompt_chars": 100, "model": "gpt-mini"}
    for _ in range(2):
        provider.answer(body=completion(content="{}"))
    ask(routing=rule)  # "Objective: look up c-1": a short prompt
    request = ModelRequest(agent_slug="gpt", instructions="", prompt="Objective: " + "x" * 200, turn=1, attempt=1,
                           routing=rule)  # fmt: skip
    model_complete(provider="openai", script=[], model="gpt-test", request=request)
    assert [r["json"]["model"] for r in provider.requests] == ["gpt-mini", "gpt-test"]
    with pytest.raises(StepFailure, match="routing needs max_prompt_chars and model"):
        ask(routing={"model": "gpt-mini"})


def test_a_refusal_is_not_retried(provider, db):
    provider.answer(400, {"error": {"message": "model not found", "type": "invalid_request_error"}})
    with pytest.raises(StepFailure, match="refused the call \\(400\\)"):
        ask()
    assert len(provider.requests) == 1


def test_no_key_in_the_environment_is_a_clear_error_and_no_call(provider, db, monkeypatch):
    monkeypatch.delenv("WARDEN_TEST_OPENAI_KEY")
    with pytest.raises(StepFailure, match="WARDEN_TEST_OPENAI_KEY is not set"):
        ask()
    assert provider.requests == []


@pytest.fixture
def one_model_workflow(transactional_db):
    agent = Agent.objects.create(slug="gpt", name="GPT", provider="openai", model="gpt-test", max_attempts=3)
    ModelPrice.objects.create(provider="openai", model="gpt-test", input_usd_per_mtok="2.5", output_usd_per_mtok="10")
    return Workflow.objects.create(
        slug="ask-gpt", name="Ask", tasks=[{"key": "answer", "agent": agent.slug, "objective": "Answer."}]
    )


def test_429_twice_then_200_is_one_journaled_call_paid_once(provider, one_model_workflow, worker):
    limited = {"error": {"message": "slow down", "type": "rate_limit_error"}}
    provider.answer(429, limited, headers={"Retry-After": "0.6"})
    provider.answer(429, limited, headers={"Retry-After": "0.6"})
    provider.answer(body=completion(content='{"answer": "42"}', prompt_tokens=1234, completion_tokens=321))
    run = run_start(workflow="ask-gpt")
    wait_for(lambda: Run.objects.get(id=run.id).is_terminal, timeout=30, message="the run")

    run.refresh_from_db()
    assert run.status == "completed", run.status_reason
    assert len(provider.requests) == 3
    gaps = [b["at"] - a["at"] for a, b in zip(provider.requests, provider.requests[1:], strict=False)]
    assert all(gap >= 0.55 for gap in gaps), gaps  # Retry-After honoured
    [call] = Span.objects.filter(run=run, kind="model_call")
    assert call.body["retries"] == 2 and (call.tokens_in, call.tokens_out) == (1234, 321)
    # What was sent is kept with the answer, and it is what reached the provider.
    sent = provider.requests[-1]["json"]["messages"]
    assert call.body["request"]["system"] == sent[0]["content"] and call.body["request"]["user"] == sent[1]["content"]
    # The price table applied to the recorded tokens, once: 1234 × 2.5 + 321 × 10 micro-dollars.
    assert call.cost_micros == run.cost_micros == 6295
    assert run.tokens_used == 1555
    assert not any(API_KEY in json.dumps([s.body, s.attributes], default=str) for s in Span.objects.filter(run=run))


def test_a_provider_that_is_down_opens_the_breaker_and_the_run_waits_for_a_human(provider, one_model_workflow, worker):
    provider.default = (500, {}, json.dumps({"error": {"message": "upstream down"}}).encode())
    run = run_start(workflow="ask-gpt")
    wait_for(lambda: Run.objects.get(id=run.id).status != "running", timeout=30, message="the run to stop")

    run.refresh_from_db()
    assert run.status == "needs_attention" and "breaker is open" in run.status_reason
    task = run.tasks.get()
    assert task.failure_class == "provider" and task.attempts == 2  # retried once, then the breaker
    # Five tries in all (MODEL_CIRCUIT_FAILURES), none of them paid or journaled as an answer.
    assert len(provider.requests) == 5
    assert run.cost_micros == 0 and run.tokens_used == 0
    assert not Span.objects.filter(run=run, kind="model_call", status="ok").exists()


class IncidentModel:
    """A model behind the OpenAI protocol that handles incident-fanout the way the demo's script does, from
    what the request carries: the agent's instructions (system), its objective, and how many turns the
    same task has had. It knows nothing of Warden's internals."""

    def __init__(self, fake: FakeOpenAI):
        self.fake, self.turns = fake, {}
        fake.respond = self.respond

    def respond(self, request: dict) -> dict:
        system, prompt = request["messages"][0]["content"], request["messages"][1]["content"]
        objective = prompt.splitlines()[0]
        turn = self.turns[objective] = self.turns.get(objective, 0) + 1
        if system.startswith("Split the incident"):
            workers = [{"key": f"worker-{n}", "agent": "incident-worker", "objective": f"Handle customer {n}"}
                       for n in range(1, 4)]  # fmt: skip
            summary = {"key": "summary", "agent": "incident-summarizer", "objective": "Summarise",
                       "depends_on": [w["key"] for w in workers]}  # fmt: skip
            return completion(content=json.dumps({"tasks": [*workers, summary]}))
        if system.startswith("Summarise"):
            return completion(content=json.dumps({"summary": "3 customers handled"}))
        customer = f"cust-{objective.rsplit(' ', 1)[-1]}"
        calls = [
            ("crm__read", {"customer_id": customer}),
            ("tickets__create", {"customer_id": customer, "title": "Incident follow-up"}),
            ("crm__update", {"customer_id": customer, "fields": {"incident_ticket": "open"}}),
            ("email__send", {"to": f"{customer}@customers.example", "subject": "Incident", "body": "On it."}),
        ]
        if turn <= len(calls):
            name, arguments = calls[turn - 1]
            return completion(tool=name, arguments=json.dumps(arguments), prompt_tokens=500, completion_tokens=40)
        return completion(content=json.dumps({"summary": f"{customer}: handled"}), prompt_tokens=700)


def test_incident_fanout_runs_end_to_end_on_a_model_behind_the_openai_protocol(provider, demo_tx, worker):
    from tools.models import SandboxCall, ToolOperation

    IncidentModel(provider)
    Agent.objects.filter(slug__startswith="incident-").update(provider="openai", model="gpt-test")
    ModelPrice.objects.create(provider="openai", model="gpt-test", input_usd_per_mtok="2.5", output_usd_per_mtok="10")
    run = run_start(workflow="incident-fanout")
    wait_for(lambda: Run.objects.get(id=run.id).status != "running", timeout=60, message="the run to end")

    run.refresh_from_db()
    assert run.status == "completed", run.status_reason
    # 1 plan + 3 workers × (4 tool calls + 1 answer) + 1 summary, each journaled once.
    assert len(provider.requests) == 17
    calls = Span.objects.filter(run=run, kind="model_call")
    assert calls.count() == 17
    assert run.cost_micros == sum(c.tokens_in * 2.5 + c.tokens_out * 10 for c in calls)
    for system in ("tickets", "email"):
        effects = SandboxCall.objects.filter(system=system, is_effect=True)
        assert effects.count() == 3 and len({e.idempotency_key for e in effects}) == 3
    assert ToolOperation.objects.filter(run=run, status="committed").exclude(tool_class="read_only").count() == 9
    worker_request = next(r for r in provider.requests if "tools" in r["json"])
    offered = {t["function"]["name"] for t in worker_request["json"]["tools"]}
    assert offered == {"crm__read", "tickets__create", "crm__update", "email__send"}
    # A later request carries the earlier steps as the protocol's own messages (assistant tool calls and
    # tool results), not the prompts that were sent for them.
    later = [r["json"]["messages"] for r in provider.requests if len(r["json"]["messages"]) > 2]
    assert later and all(m["role"] in ("system", "user", "assistant", "tool") for ms in later for m in ms)
    assert any(m["role"] == "tool" for ms in later for m in ms)
    assert not any('"request"' in json.dumps(ms) for ms in later)


def test_while_the_breaker_is_open_the_agent_falls_back_to_its_other_provider(provider, one_model_workflow, worker):
    Agent.objects.filter(slug="gpt").update(fallback_provider="anthropic", fallback_model="claude-test")
    ModelPrice.objects.create(provider="anthropic", model="claude-test", input_usd_per_mtok=3, output_usd_per_mtok=15)
    for _ in range(5):  # the first attempt's four tries, then the one that opens the breaker
        provider.answer(500, {"error": {"message": "upstream down"}})
    provider.answer(body=message({"type": "text", "text": '{"answer": "42"}'}, input_tokens=100, output_tokens=10))
    run = run_start(workflow="ask-gpt")
    wait_for(lambda: Run.objects.get(id=run.id).status != "running", timeout=30, message="the run to end")

    run.refresh_from_db()
    assert run.status == "completed", run.status_reason
    assert [r["path"] for r in provider.requests] == ["/v1/chat/completions"] * 5 + ["/v1/messages"]
    [call] = Span.objects.filter(run=run, kind="model_call", status="ok")  # the first attempt's failure is there too
    assert call.name == "claude-test" and run.cost_micros == 100 * 3 + 10 * 15


# --- an agent's own endpoint (docs/agents.md, "Providers") ---------------------------------------------------

KEYS = {"ENDPOINT_A_KEY": "sk-endpoint-a-51c0d9", "ENDPOINT_B_KEY": "sk-endpoint-b-8e2f47"}


@pytest.fixture
def endpoints(provider, settings, monkeypatch):
    """Two model servers beside the deployment's, each with its own key granted to the default project."""
    for name, value in KEYS.items():
        monkeypatch.setenv(name, value)
    settings.WARDEN = {**settings.WARDEN, "SECRET_GRANTS": {name: ["default"] for name in KEYS}}
    servers = [FakeOpenAI(), FakeOpenAI()]
    yield servers
    for server in servers:
        server.httpd.shutdown()
        server.httpd.server_close()


def endpoint_agent(slug: str, server: FakeOpenAI, key: str, **fields) -> Agent:
    return Agent.objects.create(slug=slug, name=slug, provider="openai", model="gpt-4.1-mini", base_url=server.url,
                                api_key_secret=key, project=default_project(), max_attempts=1, **fields)  # fmt: skip


def test_two_agents_call_their_own_endpoints_with_their_own_keys(endpoints, provider, worker):
    a, b = endpoints
    for server in endpoints:
        server.respond = lambda request: completion(content='{"answer": "42"}', completion_tokens=100)
    endpoint_agent("agent-a", a, "ENDPOINT_A_KEY")
    endpoint_agent("agent-b", b, "ENDPOINT_B_KEY")
    tasks = [{"key": slug, "agent": f"agent-{slug}", "objective": "Answer."} for slug in ("a", "b")]
    Workflow.objects.create(slug="two-endpoints", name="Two", tasks=tasks)
    run = run_start(workflow="two-endpoints")
    wait_for(lambda: Run.objects.get(id=run.id).is_terminal, timeout=30, message="the run")

    run.refresh_from_db()
    assert run.status == "completed", run.status_reason
    assert [r["headers"]["authorization"] for r in a.requests] == [f"Bearer {KEYS['ENDPOINT_A_KEY']}"]
    assert [r["headers"]["authorization"] for r in b.requests] == [f"Bearer {KEYS['ENDPOINT_B_KEY']}"]
    assert provider.requests == []  # the deployment's endpoint, and its key, are not used
    # Priced from the package (gpt-4.1-mini: $0.40 and $1.60 per million): 1000 × 0.4 + 100 × 1.6, twice.
    assert run.cost_micros == 2 * 560
    spans = json.dumps([[s.body, s.attributes] for s in Span.objects.filter(run=run)], default=str)
    assert not any(key in spans for key in KEYS.values())


def test_a_key_not_granted_to_the_agents_project_is_refused_at_save_and_at_call(endpoints, admin_client, db):
    a, _ = endpoints
    form = {
        "slug": "agent-c", "name": "C", "provider": "openai", "model": "gpt-test", "allowed_tools": "[]",
        "output_schema": "{}", "script": "[]", "routing": "{}", "cache_seconds": "0", "max_attempts": "3",
        "base_url": a.url, "api_key_secret": "ENDPOINT_C_KEY", "project": default_project().id,
        "versions-TOTAL_FORMS": "0", "versions-INITIAL_FORMS": "0",
    }  # fmt: skip
    refused = admin_client.post(reverse("admin:agents_agent_add"), form)
    assert refused.status_code == 200
    errors = refused.context["adminform"].form.errors
    assert "not granted to project default" in errors["api_key_secret"][0]
    bad = admin_client.post(reverse("admin:agents_agent_add"), {**form, "api_key_secret": "lower", "base_url": "x"})
    assert {"api_key_secret", "base_url"} <= set(bad.context["adminform"].form.errors)
    anthropic = admin_client.post(reverse("admin:agents_agent_add"), {**form, "provider": "anthropic",
                                                                      "api_key_secret": "ENDPOINT_A_KEY"})  # fmt: skip
    assert "OpenAI-compatible" in anthropic.context["adminform"].form.errors["base_url"][0]
    assert not Agent.objects.filter(slug="agent-c").exists()
    saved = admin_client.post(reverse("admin:agents_agent_add"), {**form, "api_key_secret": "ENDPOINT_A_KEY"})
    assert saved.status_code == 302 and Agent.objects.get(slug="agent-c").api_key_secret == "ENDPOINT_A_KEY"

    # At the call: a name granted to no project, or a run of another project, is refused before any request.
    written_around_the_form = endpoint_agent("agent-d", a, "ENDPOINT_C_KEY")
    with pytest.raises(StepFailure, match="ENDPOINT_C_KEY is not granted to project default"):
        ask(endpoint=written_around_the_form.endpoint, project_id=default_project().id)
    other = Project.objects.create(slug="other", name="Other")
    with pytest.raises(StepFailure, match="a run of another project may not use it"):
        ask(endpoint=Agent.objects.get(slug="agent-c").endpoint, project_id=other.id)
    assert a.requests == []


def test_max_tokens_goes_to_an_endpoint_that_takes_it(endpoints, db):
    a, _ = endpoints
    a.respond = lambda request: completion(content="{}")
    ask(endpoint=endpoint_agent("agent-a", a, "ENDPOINT_A_KEY").endpoint, project_id=default_project().id)
    ask(endpoint=endpoint_agent("agent-b", a, "ENDPOINT_A_KEY", send_max_tokens=True).endpoint,
        project_id=default_project().id)  # fmt: skip
    sent = [r["json"] for r in a.requests]
    assert sent[0]["max_completion_tokens"] == 4096 and "max_tokens" not in sent[0]  # OpenAI's name, as before
    assert sent[1]["max_tokens"] == 4096 and "max_completion_tokens" not in sent[1]


def test_one_agents_endpoint_down_opens_its_own_breaker_not_the_others(endpoints, provider, db):
    down, up = endpoints
    down.default = (500, {}, json.dumps({"error": {"message": "upstream down"}}).encode())
    up.respond = provider.respond = lambda request: completion(content='{"answer": "42"}')
    project = default_project().id
    agents = {"agent-a": endpoint_agent("agent-a", down, "ENDPOINT_A_KEY"),
              "agent-b": endpoint_agent("agent-b", up, "ENDPOINT_B_KEY")}  # fmt: skip

    def ask_as(slug: str):
        endpoint = agents[slug].endpoint if slug in agents else {}
        request = ModelRequest(agent_slug=slug, instructions="", prompt="Objective: answer", turn=1, attempt=1,
                               endpoint=endpoint, project_id=project)  # fmt: skip
        return model_complete(provider="openai", script=[], model="gpt-test", request=request)

    with pytest.raises(TransientFailure):  # four tries
        ask_as("agent-a")
    with pytest.raises(StepFailure, match="the provider openai:agent-a is failing") as refused:
        ask_as("agent-a")  # the fifth failure in a row opens agent-a's breaker
    assert len(down.requests) == 5
    assert refused.value.failure_class == "provider" and down.url not in str(refused.value)
    assert ask_as("agent-b").final == {"answer": "42"}  # another endpoint, another breaker
    assert ask_as("gpt").final == {"answer": "42"}  # and the deployment's
