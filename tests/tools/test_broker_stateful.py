"""A stateful property test of the tool broker: random calls, drill faults, simulated crashes, duplicate
deliveries and retries, against the sandbox systems, through `tools.broker.tool_call` only.

Invariants (1 after every rule; 3 whenever a committed step is repeated; all three again in the teardown,
once it has retried, without faults, whatever is pending):

1. at most one effect per idempotency key reaches a sandbox system. The tracker and the CRM dedupe by key;
   the e-mail service does not, so for ``email.send`` this holds only because the broker reconciles by
   lookup before it calls again (never a blind retry);
2. after the teardown retried every pending step, each ledger row of the run is terminal, or ``ambiguous``
   with a reason a human can act on. A row left ``executing`` by a crash is resolved by a retry;
3. a committed operation's ``result`` is what a repeat of the same step returns, and the repeat reaches
   no system (replay returns the stored receipt).

A crash point normally SIGKILLs the worker (`core.faults.crash_now`); here it raises `SimulatedCrash`.
No broker crash point sits inside a transaction, so what a real crash would leave committed is exactly
what this leaves in the database.

Checked by hand (not kept): replacing `tools.broker.reconcile` with a blind "call again" makes this fail
with two e-mails for one key (a crash after the send, then a retry), in both embedded and scaled mode.
"""

import os

import pytest
from django.db.models import Count
from hypothesis import HealthCheck, Phase, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from approvals.policies import demo_waivers_load
from core.errors import StepFailure, TransientFailure
from runs.services import run_start
from tests.runs.test_engine import scripted_workflow
from tools import broker
from tools.installation import run_key_prefix
from tools.models import SandboxCall, SandboxEmail, ToolOperation

OS = ToolOperation.Status
TERMINAL = {OS.COMMITTED, OS.FAILED, OS.REJECTED, OS.COMPENSATED, OS.COMPENSATION_FAILED}
# The e-mail first: hypothesis favours early elements, and the non-deduplicating system is the one where a
# blind retry would show.
WRITES = ["email.send", "tickets.create", "crm.update"]
TOOLS = [*WRITES, "crm.read"]

# A handful of argument sets per tool: collisions between steps (same customer, same e-mail) are wanted,
# since the broker must keep them apart by step, not by content.
ARGUMENTS = {
    "crm.read": [{"customer_id": "cust-a"}, {"customer_id": "cust-b"}],
    "tickets.create": [{"customer_id": "cust-a", "title": "Checkout down"}, {"customer_id": "cust-b", "title": "Slow"}],
    "crm.update": [
        {"customer_id": "cust-a", "fields": {"status": "incident"}},
        {"customer_id": "cust-b", "fields": {"note": "called", "status": "watch"}},
    ],
    "email.send": [
        {"to": "a@customer.example", "subject": "Incident", "body": "We are on it."},
        {"to": "b@customer.example", "subject": "Resolved", "body": "All good again."},
    ],
}

# One drill fault per delivery, crashes first (they leave the rows a retry must reconcile); no fault is common
# too, so that steps also commit cleanly. `slow` is left out: its deadline (10 s) is far above its delay, so
# it would only add 0.5 s per call and no behaviour.
FAULTS = st.sampled_from(
    [
        {"mode": "crash", "point": "after_call"},
        {"mode": "crash", "point": "after_intent"},
        None,
        {"mode": "timeout_after_commit"},
        {"mode": "transient"},
        {"mode": "error"},
        {"mode": "crash", "point": "after_receipt"},
        None,
    ]
)


class SimulatedCrash(Exception):
    """Stands in for the SIGKILL of a crash drill."""


def _crash():
    raise SimulatedCrash()


class BrokerMachine(RuleBasedStateMachine):
    workflow = "broker-stateful"  # created by the broker_machine fixture

    def __init__(self):
        super().__init__()
        self.calls: dict[int, tuple[str, dict]] = {}  # step -> (tool, arguments) as first delivered
        self.next_step = 1

    @initialize()
    def start_run(self):
        # A fresh run per example: keys and fault firings include the run id, so examples never interfere.
        self.run = run_start(workflow=self.workflow)
        self.task = self.run.tasks.get()
        self.prefix = f"{run_key_prefix(self.run.id)}{self.task.key}:"

    # --- helpers -----------------------------------------------------------------------------------

    def key(self, step: int) -> str:
        return broker.idempotency_key(run_id=self.run.id, task_key=self.task.key, step=step)

    def op(self, step: int) -> ToolOperation | None:
        return ToolOperation.objects.filter(idempotency_key=self.key(step)).first()

    def served(self) -> int:
        return SandboxCall.objects.filter(idempotency_key__startswith=self.prefix).count()

    def deliver(self, step: int, fault: dict | None, *, arguments: dict | None = None, resumed: bool = False):
        """One delivery of the step's call; returns the outcome or the exception it ended with."""
        name, args = self.calls[step]
        # Faults are read from run.input at each call, so this one applies to this delivery only.
        self.run.input = {"faults": [{"task": self.task.key, "call": step, **fault}] if fault else []}
        # The breaker would refuse new keys after 5 failures of a tool; that calls nothing and is not the
        # subject here.
        broker.circuit_reset()
        try:
            return broker.tool_call(
                run=self.run,
                task=self.task,
                step=step,
                call_number=step,
                name=name,
                arguments=dict(arguments if arguments is not None else args),
                resumed=resumed,
            )
        except (StepFailure, SimulatedCrash) as exc:
            return exc  # anything else (a sandbox exception escaping, say) fails the test

    # --- rules -------------------------------------------------------------------------------------

    @rule(name=st.sampled_from(TOOLS), which=st.integers(0, 1), fault=FAULTS)
    def new_call(self, name, which, fault):
        step = self.next_step
        self.next_step += 1
        self.calls[step] = (name, ARGUMENTS[name][which])
        before = self.served()
        outcome = self.deliver(step, fault)
        op, mode = self.op(step), (fault or {}).get("mode")
        point = (fault or {}).get("point")
        if name not in WRITES:
            # A read has no intent: its row is written after the call, and only if nothing went wrong. (The
            # sandbox's reads ignore timeout_after_commit: there is nothing to commit.)
            if mode in ("error", "transient"):
                assert isinstance(outcome, StepFailure) and op is None
                assert isinstance(outcome, TransientFailure) == (mode == "transient"), outcome
            elif point in (None, "after_receipt"):
                assert op is not None and op.status == OS.COMMITTED
            return
        effects = SandboxCall.objects.filter(idempotency_key=self.key(step), is_effect=True).count()
        # The intent is committed before the call, whatever happens next.
        assert op is not None and op.tool == name
        if mode is None or mode == "timeout_after_commit" or point == "after_receipt":
            assert op.status == OS.COMMITTED and effects == 1, (op.status, op.status_reason)
            if mode == "timeout_after_commit":
                assert op.status_reason == "reconciled: committed" and outcome.result == op.result
        elif mode in ("error", "transient"):
            assert op.status == OS.FAILED and effects == 0
            assert isinstance(outcome, StepFailure)
            assert isinstance(outcome, TransientFailure) == (mode == "transient"), outcome  # retry only if transient
            assert self.served() == before  # refused before anything happened
        else:  # crashed between intent and receipt: the row says executing, the effect may exist
            assert isinstance(outcome, SimulatedCrash)
            assert op.status == OS.EXECUTING and effects == (1 if point == "after_call" else 0)

    @precondition(lambda self: self.calls)
    @rule(data=st.data(), fault=FAULTS, resumed=st.booleans())
    def repeat(self, data, fault, resumed):
        """A retry of the step (resumed) or a duplicate delivery of the same message (not resumed)."""
        step = data.draw(st.sampled_from(sorted(self.calls)), label="step")
        before_op, before = self.op(step), self.served()
        outcome = self.deliver(step, fault, resumed=resumed)
        if before_op is not None and before_op.status == OS.COMMITTED:
            # Invariant 3: replay is the stored receipt and calls nothing, whatever fault was set.
            assert not isinstance(outcome, BaseException), outcome
            assert outcome.error is None and outcome.result == before_op.result
            assert self.served() == before
            assert self.op(step).status == OS.COMMITTED

    @precondition(lambda self: any(self.op(s) is not None for s in self.calls))
    @rule(data=st.data())
    def reuse_key_with_other_arguments(self, data):
        """A step's key may not carry other arguments: refused before any system is asked."""
        step = data.draw(st.sampled_from([s for s in sorted(self.calls) if self.op(s) is not None]), label="step")
        name, args = self.calls[step]
        other = next(a for a in ARGUMENTS[name] if a != args)
        before_op, before = self.op(step), self.served()
        outcome = self.deliver(step, None, arguments=other)
        assert isinstance(outcome, StepFailure) and "other arguments" in str(outcome), outcome
        assert self.served() == before
        after = self.op(step)
        assert (after.status, after.attempts, after.result) == (before_op.status, before_op.attempts, before_op.result)

    # --- invariants --------------------------------------------------------------------------------

    @invariant()
    def at_most_one_effect_per_key(self):
        doubled = (
            SandboxCall.objects.filter(idempotency_key__startswith=self.prefix, is_effect=True)
            .values("idempotency_key")
            .annotate(n=Count("id"))
            .filter(n__gt=1)
        )
        assert not doubled.exists(), list(doubled)
        # The sent folder itself, not just the call log: the e-mail service keeps real duplicates.
        emails = SandboxEmail.objects.filter(idempotency_key__startswith=self.prefix).values("idempotency_key")
        assert not emails.annotate(n=Count("id")).filter(n__gt=1).exists()

    def teardown(self):
        if not hasattr(self, "run"):
            return
        # "finish": retry, with no fault, every step whose ledger row is not terminal (an executing row left
        # by a crash, an ambiguous or approved one). One round should do; a few allow for chains.
        for _ in range(3):
            pending = [s for s in sorted(self.calls) if (op := self.op(s)) is not None and op.status not in TERMINAL]
            if not pending:
                break
            for step in pending:
                self.deliver(step, None, resumed=True)
        self.at_most_one_effect_per_key()
        for op in ToolOperation.objects.filter(run_id=self.run.id):
            # Invariant 2.
            assert op.status in TERMINAL or (op.status == OS.AMBIGUOUS and op.status_reason), (
                op.idempotency_key,
                op.status,
                op.status_reason,
            )
            if op.status != OS.COMMITTED:
                continue
            # A write's receipt is the system of record's answer for the key (for e-mail: the first sent).
            lookup = broker.TOOLS[op.tool].lookup
            if lookup is not None:
                assert lookup(op.idempotency_key) == op.result, (op.idempotency_key, op.result)
            # Invariant 3 once more, for every committed step.
            before = self.served()
            outcome = self.deliver(op.step, None, resumed=True)
            assert not isinstance(outcome, BaseException) and outcome.result == op.result, outcome
            assert self.served() == before


@pytest.fixture
def broker_machine(db, monkeypatch):
    scripted_workflow("broker-stateful", [{"final": {}}], tools=TOOLS)
    demo_waivers_load()  # the e-mails leave unattended, as in the demo project: effects are the subject here
    monkeypatch.setattr("core.faults.crash_now", _crash)  # where the fault injector finds it
    broker.circuit_reset()
    yield BrokerMachine
    broker.circuit_reset()


def test_broker_keeps_one_effect_per_key_through_faults_crashes_and_duplicates(broker_machine):
    run_state_machine_as_test(
        broker_machine,
        settings=settings(
            max_examples=25,
            stateful_step_count=15,
            deadline=None,
            database=None,  # examples hold run ids of a rolled-back test database: nothing worth replaying
            # CI replays one fixed set of examples (a red build must be reproducible); local runs explore anew.
            derandomize=os.environ.get("WARDEN_REQUIRE_SERVICES") == "1",
            # The explain phase re-runs failing examples under a tracer: minutes here, for little news.
            phases=[Phase.explicit, Phase.generate, Phase.shrink],
            suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
        ),
    )


@pytest.mark.parametrize("mode", ["error", "transient"])
def test_a_system_fault_on_a_read_is_a_step_failure_of_the_right_class(broker_machine, mode):
    """A read's system fault must reach the engine as a StepFailure (transient ones retryable), not as the
    sandbox's own exception, which the engine would count as a permanent internal error."""
    run = run_start(workflow="broker-stateful", input={"faults": [{"task": "only", "call": 1, "mode": mode}]})
    with pytest.raises(StepFailure) as failure:
        broker.tool_call(
            run=run, task=run.tasks.get(), step=1, call_number=1, name="crm.read", arguments={"customer_id": "c"}
        )
    assert isinstance(failure.value, TransientFailure) == (mode == "transient")
    assert not ToolOperation.objects.filter(run=run).exists()  # nothing to record: a retry reads again
