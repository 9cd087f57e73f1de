"""The supervisor's executor holds a lease on its run and checks it just before each call, as an
agent's attempt does: one frozen after it wrote an intent (SIGSTOP, heartbeat and all) sends nothing
that its successor already reconciled and sent, when it wakes. Real worker processes, PostgreSQL and
Redis; the e-mail service does not dedupe by key, so a second send would be a second e-mail.

Checked by hand (not kept): with the lease check in ``tools.broker._fenced`` removed, the woken
executor sends worker-1's e-mail a second time and this test fails on the count of e-mails by key."""

import os
import signal
import time
from collections import Counter

import pytest

from policy.models import ApprovalRequest
from runs.models import Run
from runs.services import run_start
from tenancy.access import default_project, membership_grant
from tests.conftest import decide, wait_for
from tools.installation import run_key_prefix
from tools.models import SandboxEmail, ToolOperation

pytestmark = [pytest.mark.services, pytest.mark.processes]
# A short executor lease, renewed often; a time limit far above the freeze (Dramatiq cannot interrupt
# blocking work, so only the lease stands between the frozen executor's late call and the customer).
FROZEN = {"WARDEN_LEASE_SECONDS": 2, "WARDEN_HEARTBEAT_SECONDS": 0.3, "WARDEN_ACTOR_TIME_LIMIT_SECONDS": 60}


def test_a_frozen_executor_sends_nothing_its_successor_already_sent(demo_tx, processes, django_user_model):
    reviewer = django_user_model.objects.create_user(username="rita", password="rita-pass-123")
    membership_grant(user=reviewer, project=default_project(), role="reviewer")
    # worker-1's e-mail: the executor writes its intent, then stops there a while (a "freeze" drill fault)
    freeze = {"task": "worker-1", "call": 4, "mode": "freeze"}
    run = run_start(workflow="incident-fanout", input={"propose_tools": ["email.send"], "faults": [freeze]})
    first = processes.worker(threads=2, **FROZEN)
    wait_for(
        lambda: Run.objects.get(id=run.id).status == Run.Status.WAITING_FOR_APPROVAL, timeout=60, message="the bundle"
    )
    bundle = ApprovalRequest.objects.get(run=run, kind=ApprovalRequest.Kind.BUNDLE)
    decide(request_id=bundle.id, user=reviewer, approve=True)

    mail = ToolOperation.objects.get(run=run, tool="email.send", task__key="worker-1")
    wait_for(
        lambda: ToolOperation.objects.get(id=mail.id).status == ToolOperation.Status.EXECUTING,
        timeout=30,
        message="the executor's intent",
    )
    owner_pid = int(Run.objects.get(id=run.id).ops_lease_owner.split(":")[1])
    assert owner_pid in processes.children(first)
    os.kill(owner_pid, signal.SIGSTOP)  # frozen between the intent and the call, heartbeat and all

    processes.worker(threads=2, **FROZEN)
    wait_for(lambda: Run.objects.get(id=run.id).status == Run.Status.COMPLETED, timeout=60, message="the takeover")
    keys = Counter(SandboxEmail.objects.filter(idempotency_key__startswith=run_key_prefix(run.id)).values_list(
        "idempotency_key", flat=True
    ))  # fmt: skip
    assert len(keys) == 5 and set(keys.values()) == {1}
    assert Run.objects.get(id=run.id).ops_lease_token >= 2  # the successor claimed the lease anew

    sent = SandboxEmail.objects.filter(idempotency_key__startswith=run_key_prefix(run.id))
    os.kill(owner_pid, signal.SIGCONT)  # it wakes, finishes its freeze, and reaches the call
    wait_for(
        lambda: "the executor stops" in processes.log(first) or sent.count() > 5,
        timeout=30,
        message="the woken executor to stop or to send",
    )
    time.sleep(0.5)
    assert Counter(sent.values_list("idempotency_key", flat=True)) == keys  # nothing sent twice
    assert "no longer holds the lease; the call is not made" in processes.log(first)
    assert ToolOperation.objects.get(id=mail.id).status == ToolOperation.Status.COMMITTED
