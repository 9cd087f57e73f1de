"""The client's own tests: what goes over the wire and how it retries, against httpx's mock transport
(the server side is Warden's own suite: tests/integrations/test_external_agent.py drives it against Warden)."""

import asyncio
import json

import httpx
import pytest
from warden_client import AsyncWardenClient, Retry, WardenClient, WardenError

FAST = Retry(attempts=4, base_seconds=0.001, cap_seconds=0.01)
RUN = {"id": 7, "kind": "external", "status": "running", "status_reason": ""}
OPERATION = {"id": 3, "idempotency_key": "warden:i1:7:refunds:1", "status": "awaiting_approval",
             "status_reason": "", "approval_id": 11, "result": None}  # fmt: skip


class Server:
    """Answers from a script of (status, body, headers) and records every request."""

    def __init__(self, *answers):
        self.answers, self.requests = list(answers), []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        status, body, headers = self.answers.pop(0)
        if isinstance(body, Exception):
            raise body
        return httpx.Response(status, json=body, headers=headers or {})


def sync_client(server) -> WardenClient:
    return WardenClient("http://warden.test", "wdn_token", retry=FAST, transport=httpx.MockTransport(server))


def test_starting_the_same_workflow_twice_with_the_same_input_starts_two_runs():
    server = Server((201, RUN, None), (201, {**RUN, "id": 8}, None))
    with sync_client(server) as warden:
        run = warden.run_start("external-agent", goal="Refund")
        again = warden.run_start("external-agent", goal="Refund")
    first, second = server.requests
    assert run.id == 7 and first.url.path == "/api/v1/runs" and first.headers["authorization"] == "Bearer wdn_token"
    assert json.loads(first.content) == json.loads(second.content)
    assert json.loads(first.content) == {"workflow": "external-agent", "goal": "Refund", "input": {}}
    # Two calls, two keys: the server starts a second run instead of replaying the first.
    assert first.headers["idempotency-key"] != second.headers["idempotency-key"]
    assert again.id == 8


def test_a_run_start_whose_answer_was_lost_is_sent_again_with_its_own_key():
    server = Server(
        (0, httpx.ReadTimeout("lost"), None),
        (502, {"code": "bad_gateway", "message": "proxy"}, None),
        (201, RUN, None),
        (201, {**RUN, "id": 8}, None),
    )
    with sync_client(server) as warden:
        assert warden.run_start("external-agent", goal="Refund").id == 7
        assert warden.run_start("external-agent", goal="Refund").id == 8
    keys = [r.headers["idempotency-key"] for r in server.requests]
    assert keys[0] == keys[1] == keys[2] and keys[3] != keys[0]  # one call's retries share its key


def test_a_caller_deduplicates_across_processes_with_its_own_key():
    server = Server((201, RUN, None), (201, RUN, None))
    for _ in range(2):  # two processes, say: each its own client
        with sync_client(server) as warden:
            warden.run_start("external-agent", goal="Refund", idempotency_key="ticket-4711")
    assert [r.headers["idempotency-key"] for r in server.requests] == ["ticket-4711", "ticket-4711"]


def test_an_operations_intent_is_keyed_by_what_it_names_its_run_task_and_step():
    server = Server((201, OPERATION, None), (201, OPERATION, None), (201, OPERATION, None))
    intent = {"task": "refunds", "tool": "payments.refund", "arguments": {"charge": "c"}}
    for step in (1, 1, 2):  # a restarted agent sends step 1 again: the same key, the first answer back
        with sync_client(server) as warden:
            warden.operation_intent(7, step=step, **intent)
    first, again, other = (r.headers["idempotency-key"] for r in server.requests)
    assert first == again and other != first


def test_a_lost_answer_and_a_busy_server_are_retried_with_the_same_key():
    server = Server(
        (0, httpx.ReadTimeout("lost"), None),
        (409, {"code": "idempotency_key_in_flight", "message": "busy"}, {"Retry-After": "0"}),
        (429, {"code": "rate_limited", "message": "slow down"}, {"Retry-After": "0"}),
        (201, OPERATION, None),
    )
    with sync_client(server) as warden:
        op = warden.operation_intent(7, task="refunds", step=1, tool="payments.refund", arguments={"charge": "c"},
                                     tool_class="non_idempotent_write", reversibility="irreversible")  # fmt: skip
    assert op.id == 3 and not op.decided and len(server.requests) == 4
    assert len({r.headers["idempotency-key"] for r in server.requests}) == 1


def test_an_explicit_key_is_sent_as_given_and_a_refusal_raises_with_the_apis_code():
    error = {"code": "invalid_input", "message": "the request is invalid", "errors": [{"field": "workflow"}]}
    server = Server((422, error, None))
    with sync_client(server) as warden, pytest.raises(WardenError) as raised:
        warden.run_start("nope", idempotency_key="ticket-4711")
    assert server.requests[0].headers["idempotency-key"] == "ticket-4711"
    assert (raised.value.status, raised.value.code, raised.value.errors) == (422, "invalid_input", error["errors"])
    assert len(server.requests) == 1  # a refusal is not retried


def test_retries_stop_after_the_last_attempt():
    server = Server(*[(503, {"code": "unavailable", "message": "down"}, None)] * 4)
    with sync_client(server) as warden, pytest.raises(WardenError) as raised:
        warden.run_get(7)
    assert raised.value.status == 503 and len(server.requests) == 4


def test_waiting_for_a_decision_long_polls_until_it_is_made():
    server = Server((200, OPERATION, None), (200, {**OPERATION, "status": "approved"}, None))
    with sync_client(server) as warden:
        op = warden.operation_wait(3, poll=5)
    assert op.approved and [r.url.params.get("wait") for r in server.requests] == ["5", "5"]


def test_the_async_client_sends_the_same_calls():
    server = Server(
        (0, httpx.ConnectError("refused"), None), (201, RUN, None), (200, {**OPERATION, "status": "rejected"}, None)
    )

    async def main():
        async with AsyncWardenClient("http://warden.test", "wdn_token", retry=FAST,
                                     transport=httpx.MockTransport(server)) as warden:  # fmt: skip
            run = await warden.run_start("external-agent", idempotency_key="k-1")
            op = await warden.operation_wait(3)
            return run, op

    run, op = asyncio.run(main())
    assert run.id == 7 and op.decided and not op.approved
    assert [r.headers.get("idempotency-key") for r in server.requests] == ["k-1", "k-1", None]


def test_the_async_client_starts_two_runs_for_two_calls_and_retries_each_with_its_key():
    server = Server((0, httpx.ConnectError("refused"), None), (201, RUN, None), (201, {**RUN, "id": 8}, None))

    async def main():
        async with AsyncWardenClient("http://warden.test", "wdn_token", retry=FAST,
                                     transport=httpx.MockTransport(server)) as warden:  # fmt: skip
            return [(await warden.run_start("external-agent")).id for _ in range(2)]

    assert asyncio.run(main()) == [7, 8]
    keys = [r.headers["idempotency-key"] for r in server.requests]
    assert keys[0] == keys[1] != keys[2]
