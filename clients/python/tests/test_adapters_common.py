"""What both framework adapters rely on, without the frameworks: a call's step is its identity, the key
reaches the tool through a context variable, and an exception after which the service may have acted
is told from one after which it did not."""

import asyncio
import http.client
import threading

import httpx
import pytest
from warden_client import current_idempotency_key, outcome_unknown
from warden_client._adapters import cost_usd, idempotency_key_set, step_of

pytestmark = pytest.mark.anymode


def test_a_step_is_the_calls_identity_whatever_the_key_order_and_not_its_position():
    first = step_of("payments.refund", {"charge": "ch_1", "amount_cents": 2500})
    assert first == step_of("payments.refund", {"amount_cents": 2500, "charge": "ch_1"})
    assert first == step_of("payments.refund", {"charge": "ch_1", "amount_cents": 2500, "idempotency_key": "k"})
    others = {
        step_of("payments.refund", {"charge": "ch_2", "amount_cents": 2500}),
        step_of("payments.refund", {"charge": "ch_1", "amount_cents": 2501}),
        step_of("payments.charge", {"charge": "ch_1", "amount_cents": 2500}),
        step_of("payments.refund", {"charge": "ch_1", "amount_cents": 2500}, occurrence=2),
    }
    assert first not in others and len(others) == 4
    assert all(1 <= step <= 2_000_000_000 for step in {first, *others})  # the ledger's positive integer


def test_the_key_is_the_tools_while_it_runs_in_threads_and_tasks_it_starts_and_only_then():
    seen = []

    async def tool():
        seen.append(current_idempotency_key())
        await asyncio.to_thread(lambda: seen.append(current_idempotency_key()))

    with idempotency_key_set("warden:k:1:billing:7"):
        asyncio.run(tool())
    assert seen == ["warden:k:1:billing:7"] * 2 and current_idempotency_key() is None
    other = []
    thread = threading.Thread(target=lambda: other.append(current_idempotency_key()))
    thread.start()
    thread.join()
    assert other == [None]


def _raised(error: BaseException, cause: BaseException | None = None) -> BaseException:
    try:
        raise error from cause
    except BaseException as exc:  # noqa: BLE001
        return exc


@pytest.mark.parametrize(
    "error, unknown",
    [
        (ValueError("charge disputed"), False),  # the service said no
        (httpx.ConnectError("refused"), False),  # nothing was sent
        (httpx.ConnectTimeout("no connection"), False),
        (ConnectionRefusedError(), False),
        (httpx.ReadTimeout("no answer"), True),  # sent, no answer
        (httpx.RemoteProtocolError("closed mid-answer"), True),
        (TimeoutError(), True),
        (ConnectionResetError(), True),
        (http.client.IncompleteRead(b""), True),
        (_raised(RuntimeError("refund failed"), httpx.ReadTimeout("no answer")), True),  # the cause counts
        (_raised(RuntimeError("refund failed"), httpx.ConnectError("refused")), False),
    ],
)
def test_an_exception_after_which_the_service_may_have_acted_is_an_unknown_outcome(error, unknown):
    assert outcome_unknown(error) is unknown


def test_a_model_calls_cost_is_the_providers_else_from_prices():
    prices = {"gpt-test": (2.0, 8.0)}
    assert cost_usd(prices, "gpt-test", 120, 30) == pytest.approx(0.00048)
    assert cost_usd(prices, "gpt-test", 120, 30, reported=0.01) == 0.01
    assert cost_usd(prices, "other", 120, 30) == 0.0
