"""The circuit breaker's states, in the shared cache (locmem embedded, Redis scaled): closed until enough
failures in a row, open for its open period, then half-open (one probe call at a time: its success
closes it, its failure opens it again); one per project for a project's own tool; the opening announced
once, the close by a probe once."""

import random
import types

import pytest

from core import bus
from core.circuit import CLOSED, HALF_OPEN, OPEN, Breaker, BreakerRef, breaker_reason, parked_by, rate_wait


class Clock:
    def __init__(self):
        self.now = 1_000_000.0

    def time(self):
        return self.now


@pytest.fixture
def clock(monkeypatch):
    c = Clock()
    monkeypatch.setattr("core.circuit.time", types.SimpleNamespace(time=c.time))
    return c


@pytest.fixture
def heard():
    """What the breaker announces on core.bus (outside a transaction: at once)."""
    told = types.SimpleNamespace(opened=[], closed=[])

    def opened(ref, opened_at):
        told.opened.append(ref)

    def closed(ref):
        told.closed.append(ref)

    bus.on_breaker_opened(opened)
    bus.on_breaker_closed(closed)
    yield told
    bus._breaker_opened_listeners.remove(opened)
    bus._breaker_closed_listeners.remove(closed)


@pytest.fixture
def breaker(settings, transactional_db):
    settings.WARDEN = {**settings.WARDEN, "TOOL_CIRCUIT_FAILURES": 3, "TOOL_CIRCUIT_OPEN_SECONDS": 30}
    b = Breaker(what="tool", prefix="warden:test-circuit", failures_setting="TOOL_CIRCUIT_FAILURES",
                open_setting="TOOL_CIRCUIT_OPEN_SECONDS")  # fmt: skip
    b.reset_all()
    yield b
    b.reset_all()


def fail(breaker, n, name="crm.read", project_id=None):
    for _ in range(n):
        breaker.record(name, False, project_id=project_id)


def test_failures_in_a_row_open_it_and_a_success_in_between_starts_the_count_again(breaker, clock, heard):
    fail(breaker, 2)
    breaker.record("crm.read", True)
    fail(breaker, 2)
    assert breaker.state("crm.read").state == CLOSED and breaker.admit("crm.read") == 0
    fail(breaker, 1)
    state = breaker.state("crm.read")
    assert state.state == OPEN and state.seconds_left == 30 and state.opened_at == clock.now
    assert breaker.admit("crm.read") == 30
    assert heard.opened == [BreakerRef("tool", "crm.read")] and heard.closed == []
    assert [s.ref.name for s in breaker.open_now()] == ["crm.read"]


def test_after_its_open_period_one_call_probes_it_and_its_success_closes_it(breaker, clock, heard):
    fail(breaker, 3)
    clock.now += 31
    assert breaker.state("crm.read").state == HALF_OPEN
    assert breaker.admit("crm.read") == 0  # the probe goes
    assert breaker.admit("crm.read") > 0  # the others wait while it is under way
    breaker.record("crm.read", True)
    assert breaker.state("crm.read").state == CLOSED and breaker.admit("crm.read") == 0
    assert heard.closed == [BreakerRef("tool", "crm.read")]
    breaker.record("crm.read", True)  # a second success closes nothing more: announced once
    assert len(heard.closed) == 1 and breaker.open_now() == []


def test_a_failed_probe_opens_it_again_without_a_second_announcement(breaker, clock, heard):
    fail(breaker, 3)
    opened_at = clock.now
    clock.now += 31
    assert breaker.admit("crm.read") == 0
    breaker.record("crm.read", False)
    state = breaker.state("crm.read")
    assert state.state == OPEN and state.seconds_left == 30 and state.opened_at == opened_at
    clock.now += 31
    assert breaker.admit("crm.read") == 0  # the next period's probe
    assert len(heard.opened) == 1 and heard.closed == []
    breaker.record("crm.read", True)
    fail(breaker, 3)  # a new opening after a close is announced again
    assert len(heard.opened) == 2


def test_a_call_let_through_before_it_opened_does_not_extend_it(breaker, clock):
    fail(breaker, 3)
    clock.now += 10
    fail(breaker, 1)
    assert breaker.open_for("crm.read") == 20


def test_each_project_has_its_own_breaker_for_its_own_tool(breaker, clock, heard):
    fail(breaker, 3, "payments.get_charge", project_id=1)
    assert breaker.state("payments.get_charge", project_id=1).state == OPEN
    assert breaker.state("payments.get_charge", project_id=2).state == CLOSED
    assert breaker.state("payments.get_charge").state == CLOSED  # nor the deployment's of that name
    assert heard.opened == [BreakerRef("tool", "payments.get_charge", 1)]
    breaker.reset(["payments.get_charge"], project_id=2)  # closing another's changes nothing
    assert breaker.state("payments.get_charge", project_id=1).state == OPEN
    assert [s.ref for s in breaker.open_now()] == [BreakerRef("tool", "payments.get_charge", 1)]


def test_reset_closes_by_hand_without_announcing_and_forgets_it(breaker, clock, heard):
    fail(breaker, 3, "payments.get_charge", project_id=1)
    breaker.reset(["payments.get_charge"], project_id=1)
    assert breaker.state("payments.get_charge", project_id=1).state == CLOSED
    assert breaker.open_now() == [] and heard.closed == []


def test_the_sweeper_may_probe_once_per_open_period(breaker, clock):
    fail(breaker, 3)
    assert breaker.probe_due("crm.read") and not breaker.probe_due("crm.read")


def test_rate_limits_are_counted_per_key(transactional_db, clock):
    clock.now = 60.0 * random.randrange(10**6, 10**7) + 5  # a minute window of its own
    assert [rate_wait("1/payments.get_charge", 1), rate_wait("1/payments.get_charge", 1)][1] > 0
    assert rate_wait("2/payments.get_charge", 1) == 0 and rate_wait("payments.get_charge", 1) == 0


def test_a_parked_tasks_reason_names_its_breaker_and_is_read_back():
    own, shared = BreakerRef("tool", "payments.get_charge", 7), BreakerRef("tool", "crm.read")
    reason = breaker_reason(own, 12.4, project="payments")
    assert reason == "the tool payments.get_charge of project payments is failing: its breaker is open for another 12s"
    assert parked_by(reason, project_id=7) == own
    assert parked_by(breaker_reason(shared, 3), project_id=7) == shared
    provider = BreakerRef("provider", "openai")
    assert parked_by(breaker_reason(provider, 3), project_id=7) == provider
    assert parked_by("payments.get_charge: HTTP 503", project_id=7) is None
