"""A tool that says no: the system's refusal (an HTTP tool's 4xx, an MCP error result) goes back to a
model-driven agent as the tool's result, {"error": {"code", "message"}}, scrubbed of the tool's secrets,
recorded in the ledger as refused and in the trace; the model corrects its call and the task goes on.
``on_refusal = fail`` fails the task as before; refusals in a row past WARDEN_MAX_CONSECUTIVE_REFUSALS
fail it with the last one's reason; refusals never count towards the tool's breaker, while unavailability
and timeouts still do. Against a local OpenAI-compatible model server, the payments service and the
ticketing MCP server of examples/refunds, on 127.0.0.1."""

import dataclasses
import http.server
import json
import threading
import time
import uuid

import pytest
from django.apps import apps

from agents.gateway import circuit_reset as model_circuit_reset
from agents.models import Agent, ModelPrice, Workflow
from core.circuit import CLOSED, OPEN
from core.errors import StepFailure
from examples.refunds.payments_service import PaymentsService
from runs.models import Run, Span, Task
from runs.services import run_start
from tenancy.access import default_project
from tests.conftest import wait_for
from tests.local_http import answer_json, serve
from tests.runs.test_engine import scripted_workflow
from tests.tools.test_http_tools import admin_form, declare, waive
from tests.tools.test_mcp_tools import effects
from tools import registry
from tools.broker import BREAKER, circuit_reset, tool_call
from tools.catalog import tool_spec
from tools.kit import ToolRefused
from tools.mcp_tools import mcp_list, mcp_tools_store
from tools.models import HttpTool, McpServer, ToolClassification, ToolOperation
from tools.registry import REDACTED
from tools.registry import _problems as registry_problems
from tools.transitions import OPERATION

OS = ToolOperation.Status
API_KEY = "sk-refusals-test"
CANARY = f"pay-{uuid.uuid4().hex}"
WRONG = {"charge_id": "ch_1001", "amount_cents": 20_000, "reason": "order 1001"}  # the charge is 12,500
RIGHT = {"charge_id": "ch_1001", "amount_cents": 12_500, "reason": "order 1001"}


class PlannedModel:
    """A local OpenAI chat-completions server whose n-th reply (n = the tool results in the request so
    far) is ``plan[n]``: ("call", tool, arguments) or ("final", answer). Every request is kept."""

    def __init__(self, plan: list, *, hold_at: int | None = None):
        self.plan, self.requests, self.hold_at = plan, [], hold_at
        self.release = threading.Event()
        model = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self):
                raw = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                model.requests.append(json.loads(raw))
                data = json.dumps(model.answer(model.requests[-1])).encode()
                answer_json(self, data)

            def log_message(self, *args):
                pass

        self.httpd, self.url = serve(Handler)

    def answer(self, request: dict) -> dict:
        n = sum(1 for m in request["messages"] if m["role"] == "tool")
        kind, *rest = self.plan[min(n, len(self.plan) - 1)]
        message = {"role": "assistant", "content": None}
        if kind == "final":
            message["content"] = json.dumps(rest[0])
        else:
            name, arguments = rest
            function = {"name": name.replace(".", "__"), "arguments": json.dumps(arguments)}
            message["tool_calls"] = [{"id": f"call_{uuid.uuid4().hex[:8]}", "type": "function", "function": function}]
        return {
            "id": "chatcmpl-x", "object": "chat.completion", "created": 1764400000, "model": "gpt-test",
            "choices": [{"index": 0, "message": message, "finish_reason": "stop" if kind == "final" else "tool_calls"}],
            "usage": {"prompt_tokens": 100, "completion_tokens": 20, "total_tokens": 120},
        }  # fmt: skip

    def tool_messages(self) -> list[dict]:
        """What the model was shown of each tool call, in the last request."""
        return [json.loads(m["content"]) for m in self.requests[-1]["messages"] if m["role"] == "tool"]

    def stop(self):
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def payments(monkeypatch, settings):
    monkeypatch.setenv("PAYMENTS_API_KEY", CANARY)
    settings.WARDEN = {**settings.WARDEN, "SECRET_GRANTS": {"PAYMENTS_API_KEY": ["default"],
                                                            "TICKETS_TOKEN": ["default"]}}  # fmt: skip
    service = PaymentsService(api_key=CANARY).start()
    circuit_reset()
    yield service
    circuit_reset()
    service.stop()


@pytest.fixture
def model_server(settings, monkeypatch):
    servers = []

    def start(plan) -> PlannedModel:
        server = PlannedModel(plan)
        servers.append(server)
        settings.WARDEN = {**settings.WARDEN, "OPENAI_BASE_URL": server.url + "/v1",
                           "OPENAI_API_KEY_ENV": "WARDEN_TEST_OPENAI_KEY"}  # fmt: skip
        return server

    monkeypatch.setenv("WARDEN_TEST_OPENAI_KEY", API_KEY)
    model_circuit_reset()
    yield start
    model_circuit_reset()
    for server in servers:
        server.stop()


def refund_workflow(tools=("payments.refund",), provider="openai") -> Workflow:
    slug = f"refunder-{uuid.uuid4().hex[:6]}"
    Agent.objects.create(slug=slug, name="Refunder", provider=provider, model="gpt-test",
                                 allowed_tools=list(tools), max_attempts=3)  # fmt: skip
    ModelPrice.objects.get_or_create(provider="openai", model="gpt-test",
                                     defaults={"input_usd_per_mtok": 1, "output_usd_per_mtok": 2})  # fmt: skip
    task = {"key": "refund", "agent": slug, "objective": "Refund order 1001 in full."}
    return Workflow.objects.create(slug=slug, name="Refund", tasks=[task])


def finished(run, timeout=60) -> Run:
    ended = (Run.Status.COMPLETED, Run.Status.NEEDS_ATTENTION, Run.Status.FAILED)
    wait_for(lambda: Run.objects.get(id=run.id).status in ended, timeout=timeout, message="the run to end")
    return Run.objects.get(id=run.id)


def refunds(service) -> list[dict]:
    return [e for e in service.effects if e["effect"] == "refund"]


def refund_tool(payments, **fields) -> HttpTool:
    row = declare(payments, **fields)
    waive("payments.refund")  # irreversible: the project lets it leave unattended (the refusal is the subject)
    return row


# --- end to end: the model reads the 4xx, corrects its call, completes -------------------------------


def test_a_wrong_refund_gets_the_services_4xx_back_and_the_model_corrects_it(
    demo_tx, worker, payments, model_server, client, django_user_model
):
    refund_tool(payments)
    model = model_server([("call", "payments.refund", WRONG), ("call", "payments.refund", RIGHT),
                          ("final", {"refunded": 12_500})])  # fmt: skip
    run = finished(run_start(workflow=refund_workflow().slug))
    assert run.status == Run.Status.COMPLETED, run.status_reason

    # The model was shown the service's answer as the wrong call's result, then the right call's result.
    refused, committed = model.tool_messages()
    assert refused["error"]["code"] == "http_422"
    assert "at most the charge" in refused["error"]["message"] and "result" not in refused
    assert committed["result"]["amount_cents"] == 12_500
    # The ledger: one refused, one committed; one refund at the service, none for the wrong amount.
    ops = list(ToolOperation.objects.filter(run=run).order_by("step"))
    assert [(op.tool, op.status) for op in ops] == [("payments.refund", OS.REFUSED), ("payments.refund", OS.COMMITTED)]
    assert "at most the charge" in ops[0].status_reason and ops[0].result == {"error": refused["error"]}
    assert [(r["charge_id"], r["amount_cents"]) for r in refunds(payments)] == [("ch_1001", 12_500)]
    # The trace marks the refused step; the breaker never heard of it.
    root = django_user_model.objects.create_superuser(username="root", password="root-pass-123", email="r@x.y")
    client.force_login(root)
    page = client.get(f"/runs/{run.id}/").content.decode()
    assert 'class="flag f-refused"' in page
    only = client.get(f"/runs/{run.id}/?only=refused").content.decode()  # the filter keeps the refused step
    assert only.count('class="flag f-refused"') == 1 and "step 2" in only and "step 4" not in only
    assert BREAKER.state("payments.refund", project_id=default_project().id).state == CLOSED


def test_the_refusal_the_model_sees_and_the_ledger_stores_is_scrubbed_of_the_credential(
    demo_tx, worker, payments, model_server
):
    refund_tool(payments)
    quoting = {**RIGHT, "reason": "quote"}  # the service quotes the request's Authorization in its 422
    model = model_server([("call", "payments.refund", quoting), ("call", "payments.refund", RIGHT),
                          ("final", {"refunded": 12_500})])  # fmt: skip
    run = finished(run_start(workflow=refund_workflow().slug))
    assert run.status == Run.Status.COMPLETED, run.status_reason
    refused = model.tool_messages()[0]["error"]
    assert REDACTED in refused["message"], refused  # the service did quote it
    assert CANARY not in json.dumps(model.requests)
    for table in apps.get_models():
        assert CANARY not in json.dumps(list(table._default_manager.values()), default=str), table.__name__
    assert ToolOperation.objects.get(run=run, status=OS.REFUSED).status_reason == refused["message"]


def test_on_refusal_fail_fails_the_task_as_before(demo_tx, worker, payments, model_server):
    refund_tool(payments, on_refusal="fail")
    model = model_server([("call", "payments.refund", WRONG), ("call", "payments.refund", RIGHT),
                          ("final", {"refunded": 12_500})])  # fmt: skip
    run = finished(run_start(workflow=refund_workflow().slug))
    assert run.status == Run.Status.NEEDS_ATTENTION
    task = Task.objects.get(run=run)
    assert (
        task.status == Task.Status.FAILED
        and "HTTP 422" in task.status_reason
        and "at most the charge" in (task.status_reason)
    )
    assert [op.status for op in ToolOperation.objects.filter(run=run)] == [OS.FAILED]
    assert len(model.requests) == 1 and refunds(payments) == []


def test_a_scripted_agent_keeps_failing_on_a_refusal(demo_tx, worker, payments):
    """The drills' agents: a script cannot read a refusal, so the default for them is fail."""
    refund_tool(payments)
    wf = scripted_workflow(f"scripted-refund-{uuid.uuid4().hex[:6]}",
                           [{"tool": "payments.refund", "arguments": WRONG}, {"final": {"answer": "{last}"}}],
                           tools=["payments.refund"])  # fmt: skip
    run = finished(run_start(workflow=wf.slug))
    assert run.status == Run.Status.NEEDS_ATTENTION and "HTTP 422" in Task.objects.get(run=run).status_reason
    assert [op.status for op in ToolOperation.objects.filter(run=run)] == [OS.FAILED]


def test_refusals_in_a_row_past_the_bound_fail_the_task_naming_the_last(demo_tx, worker, payments, model_server):
    refund_tool(payments)
    unknown = {"charge_id": "ch_9999", "amount_cents": 100, "reason": "order 9999"}
    again = {**WRONG, "amount_cents": 13_000}
    model = model_server([("call", "payments.refund", WRONG), ("call", "payments.refund", again),
                          ("call", "payments.refund", unknown), ("final", {"refunded": 0})])  # fmt: skip
    run = finished(run_start(workflow=refund_workflow().slug))
    assert run.status == Run.Status.NEEDS_ATTENTION
    reason = Task.objects.get(run=run).status_reason
    assert reason.startswith("3 refused calls in a row; the last: payments.refund: HTTP 404"), reason
    assert "no charge ch_9999" in reason
    assert [op.status for op in ToolOperation.objects.filter(run=run)] == [OS.REFUSED] * 3
    assert len(model.requests) == 3 and refunds(payments) == []  # the model was not asked a fourth time


def test_a_success_between_refusals_starts_the_count_again(demo_tx, worker, payments, model_server, settings):
    settings.WARDEN = {**settings.WARDEN, "MAX_CONSECUTIVE_REFUSALS": 2}
    refund_tool(payments)
    other = {"charge_id": "ch_1002", "amount_cents": 4_000, "reason": "order 1002"}
    model_server([("call", "payments.refund", WRONG), ("call", "payments.refund", RIGHT),
                  ("call", "payments.refund", {**other, "amount_cents": 5_000}), ("call", "payments.refund", other),
                  ("final", {"refunded": 16_500})])  # fmt: skip
    run = finished(run_start(workflow=refund_workflow().slug))
    assert run.status == Run.Status.COMPLETED, run.status_reason
    statuses = [op.status for op in ToolOperation.objects.filter(run=run).order_by("step")]
    assert statuses == [OS.REFUSED, OS.COMMITTED, OS.REFUSED, OS.COMMITTED]


# --- the breaker: refusals do not count; unavailability and timeouts do ----------------------------


class StatusService:
    """Answers GET /<mode>: ok 200, refuse 422, down 503, slow (after 2 s) 200."""

    def __init__(self):
        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                mode = self.path.strip("/").split("?")[0]
                if mode == "slow":
                    time.sleep(2)
                code = {"ok": 200, "refuse": 422, "down": 503, "slow": 200}.get(mode, 404)
                data = json.dumps({"mode": mode} if code == 200 else {"error": f"said no to {mode}"}).encode()
                answer_json(self, data, code)

            def log_message(self, *args):
                pass

        self.httpd, self.url = serve(Handler)

    def stop(self):
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def status_tool(demo, settings):
    settings.WARDEN = {**settings.WARDEN, "TOOL_CIRCUIT_FAILURES": 2, "TOOL_CIRCUIT_OPEN_SECONDS": 1}
    service = StatusService()
    schema = {"type": "object", "properties": {"mode": {"type": "string"}}, "required": ["mode"]}
    HttpTool.objects.create(project=default_project(), name="status.check", method="GET", url=service.url + "/{mode}",
                            arguments_schema=schema, tool_class="read_only", timeout_seconds=0.5)  # fmt: skip
    circuit_reset()
    run = run_start(workflow="incident-fanout")
    task = Task.objects.get(run=run, key="plan")
    task.allowed_tools = ["status.check"]
    steps = iter(range(1, 1000))

    def call(mode):
        return tool_call(run=run, task=task, step=next(steps), call_number=1, name="status.check",
                         arguments={"mode": mode}, on_refusal="model")  # fmt: skip

    call.state = lambda: BREAKER.state("status.check", project_id=default_project().id).state
    yield call
    circuit_reset()
    service.stop()


def test_refusals_leave_the_breaker_closed_while_unavailability_and_timeouts_open_it(status_tool):
    for _ in range(5):  # more than TOOL_CIRCUIT_FAILURES
        outcome = status_tool("refuse")
        assert outcome.refused and outcome.error["code"] == "http_422"
    assert status_tool.state() == CLOSED
    with pytest.raises(StepFailure) as first:
        status_tool("down")  # 503: unavailable, counted
    assert first.value.failure_class == "transient" and status_tool.state() == CLOSED
    with pytest.raises(StepFailure) as second:
        status_tool("slow")  # cut off at its deadline: counted, and the breaker opens
    assert second.value.failure_class == "breaker" and status_tool.state() == OPEN


def test_a_refused_probe_gives_its_turn_back_and_a_success_closes_the_breaker(status_tool):
    for mode in ("down", "down"):
        with pytest.raises(StepFailure):
            status_tool(mode)
    assert status_tool.state() == OPEN
    time.sleep(1.1)  # half-open: the next call is the probe
    assert status_tool("refuse").refused  # the probe, refused: it tells nothing of the system's health
    assert status_tool("ok").result == {"mode": "ok"}  # so the next call may probe at once, and closes it
    assert status_tool.state() == CLOSED


# --- MCP: an error result goes back to the model too ------------------------------------------------


def test_an_mcp_error_result_goes_back_to_the_model(demo_tx, worker, payments, model_server, monkeypatch, tmp_path):
    monkeypatch.setenv("TICKETS_TOKEN", CANARY)
    monkeypatch.setenv("TICKETS_EFFECTS", str(tmp_path / "tickets.jsonl"))
    server = McpServer.objects.create(project=default_project(), name="helpdesk", transport="stdio", command="tickets",
                                      secrets=["TICKETS_TOKEN"], timeout_seconds=20)  # fmt: skip
    mcp_tools_store(server, mcp_list(server))
    ToolClassification.objects.create(project=default_project(), tool="helpdesk.create_ticket",
                                      tool_class="non_idempotent_write", reversibility="irreversible")  # fmt: skip
    waive("helpdesk.create_ticket")
    # "quote": the server raises a ToolError quoting its token (an isError result).
    model = model_server([("call", "helpdesk.create_ticket", {"title": "quote"}),
                          ("call", "helpdesk.create_ticket", {"title": "Refund for order 1001"}),
                          ("final", {"ticket": "opened"})])  # fmt: skip
    run = finished(run_start(workflow=refund_workflow(tools=["helpdesk.create_ticket"]).slug))
    assert run.status == Run.Status.COMPLETED, run.status_reason
    refused, created = model.tool_messages()
    assert refused["error"]["code"] == "tool_error" and REDACTED in refused["error"]["message"]
    assert created["result"]["title"] == "Refund for order 1001"
    assert [op.status for op in ToolOperation.objects.filter(run=run).order_by("step")] == [OS.REFUSED, OS.COMMITTED]
    assert [e["title"] for e in effects(tmp_path / "tickets.jsonl")] == ["Refund for order 1001"]
    assert CANARY not in json.dumps(model.requests)


# --- the ledger's refused state, and a resumed step -----------------------------------------------


def test_a_refused_operation_is_final_and_a_repeated_step_is_answered_from_the_ledger(demo, payments):
    refund_tool(payments)
    run = run_start(workflow="incident-fanout")
    task = Task.objects.get(run=run, key="plan")
    task.allowed_tools = ["payments.refund"]

    def call(arguments, on_refusal="model"):
        return tool_call(run=run, task=task, step=4, call_number=1, name="payments.refund", arguments=arguments,
                         on_refusal=on_refusal)  # fmt: skip

    first = call(WRONG)
    op = ToolOperation.objects.get(run=run)
    assert first.refused and op.status == OS.REFUSED and op.attempts == 1
    requests = len(payments.requests)
    again = call(WRONG)  # the same step delivered again (a resumed attempt): the same answer, no second call
    assert again.error == first.error and again.refused
    assert len(payments.requests) == requests
    with pytest.raises(StepFailure, match="HTTP 422"):  # the tool now says fail: the stored refusal fails it
        call(WRONG, on_refusal="fail")
    assert all(not OPERATION.allowed(OS.REFUSED, to) for to in OS.values)  # nothing leaves refused
    assert OPERATION.allowed(OS.EXECUTING, OS.REFUSED)


@pytest.mark.services
@pytest.mark.processes
def test_a_worker_killed_after_a_refusal_is_journaled_resumes_without_calling_again(
    transactional_db, processes, settings, payments
):
    refund_tool(payments)
    model = PlannedModel([("call", "payments.refund", WRONG), ("call", "payments.refund", RIGHT),
                          ("final", {"refunded": 12_500})])  # fmt: skip
    try:
        env = {
            "WARDEN_OPENAI_BASE_URL": model.url + "/v1",
            "WARDEN_OPENAI_API_KEY_ENV": "WARDEN_TEST_OPENAI_KEY",
            "WARDEN_TEST_OPENAI_KEY": API_KEY,
            # Long enough that a loaded machine's late heartbeat does not hand the step to another attempt
            # mid-call (which would find the intent without its refusal and rightly call again).
            "WARDEN_LEASE_SECONDS": "10",
            "PAYMENTS_API_KEY": CANARY,
            "WARDEN_SECRET_GRANTS": json.dumps({"PAYMENTS_API_KEY": ["default"]}),
        }
        crash = {"faults": [{"task": "refund", "call": 1, "mode": "crash", "point": "after_advance"}]}
        run = run_start(workflow=refund_workflow().slug, input=crash)
        first = processes.worker(**env)  # turn 1, the refused call, journaled; then it dies
        wait_for(lambda: first.poll() is not None, timeout=90, message="the first worker to die")
        assert ToolOperation.objects.get(run=run).status == OS.REFUSED, processes.log(first)
        wrong = [r for r in payments.requests if r["method"] == "POST"]
        assert len(wrong) == 1, processes.log(first)
        processes.worker(**env)
        wait_for(lambda: Run.objects.get(id=run.id).is_terminal, timeout=90, message="the run to end")
        run.refresh_from_db()
        assert run.status == Run.Status.COMPLETED, run.status_reason
        assert len([r for r in payments.requests if r["method"] == "POST"]) == 2  # the wrong one was not sent again
        statuses = [op.status for op in ToolOperation.objects.filter(run=run).order_by("step")]
        assert statuses == [OS.REFUSED, OS.COMMITTED]
        steps = Span.objects.filter(run=run, step__isnull=False, kind="tool_call").order_by("step")
        assert [s.body.get("refused", False) for s in steps] == [True, False]
    finally:
        model.stop()


# --- the setting: a Python tool's attribute, the admin's field --------------------------------------


def test_a_python_tools_on_refusal_tells_even_a_scripted_callers_model_and_its_code_is_kept(demo, monkeypatch):
    spec = registry.TOOLS["crm.read"]

    def refuses(arguments, **kwargs):
        raise ToolRefused("no customer c404", code="unknown_customer")

    monkeypatch.setitem(registry.TOOLS, "crm.read", dataclasses.replace(spec, execute=refuses, on_refusal="model"))
    run = run_start(workflow="incident-fanout")
    task = Task.objects.get(run=run, key="plan")
    task.allowed_tools = ["crm.read"]
    outcome = tool_call(run=run, task=task, step=3, call_number=1, name="crm.read", arguments={"customer_id": "c404"})
    assert outcome.refused and outcome.error == {"code": "unknown_customer", "message": "no customer c404"}
    assert ToolOperation.objects.get(run=run).status == OS.REFUSED  # a read's refusal is recorded too
    monkeypatch.setitem(registry.TOOLS, "crm.read", dataclasses.replace(spec, execute=refuses, on_refusal="sometimes"))
    assert any("on_refusal" in p for p in registry_problems(registry.TOOLS["crm.read"], set(registry.TOOLS)))


def test_the_admin_saves_on_refusal_and_refuses_a_value_it_does_not_know(admin_client, db, payments):
    form = {**admin_form(payments), "on_refusal": "sometimes"}
    answer = admin_client.post("/admin/tools/httptool/add/", form)
    assert answer.status_code == 200 and "Select a valid choice" in answer.content.decode()
    assert not HttpTool.objects.exists()
    answer = admin_client.post("/admin/tools/httptool/add/", {**form, "on_refusal": "fail"})
    assert answer.status_code == 302, answer.content.decode()[:2000]
    assert HttpTool.objects.get().on_refusal == "fail"
    assert tool_spec("payments.refund", default_project().id).on_refusal == "fail"
