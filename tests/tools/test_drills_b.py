"""Drills B1-B4 (docs/scenarios.md) against PostgreSQL, Redis and real worker processes. Effects are counted
through the sandbox effects listing, from outside the engine, as an operator would count them."""

from collections import Counter

import pytest

from agents.models import Agent, Workflow
from policy.models import ApprovalRequest
from runs.models import Artifact, Run, Task
from runs.services import run_start
from saga.compensation import run_compensate
from tenancy.tokens import api_token_create
from tests.conftest import decide, wait_for
from tools.installation import run_key_prefix
from tools.models import SandboxCall, SandboxEmail, SandboxRecord, SandboxTicket, ToolOperation

SHORT_LEASE = {"WARDEN_LEASE_SECONDS": 2, "WARDEN_HEARTBEAT_SECONDS": 0.5}
OS = ToolOperation.Status
pytestmark = [pytest.mark.services, pytest.mark.processes]


@pytest.fixture
def effects_api(client, operator):
    """The effects listing, read through the API: a list of (system, kind, idempotency key)."""
    _, token = api_token_create(user=operator)

    def listing(run_id=None):
        rows, after = [], 0
        while True:
            query = {"after": after, "limit": 100}
            if run_id:
                query["key_prefix"] = run_key_prefix(run_id)
            page = client.get("/api/v1/sandbox/effects", query, HTTP_AUTHORIZATION=f"Bearer {token}").json()
            rows += [(e["system"], e["kind"], e["idempotency_key"]) for e in page["effects"]]
            if page["next_after"] is None:
                return rows
            after = page["next_after"]

    return listing


def terminal(run, statuses=None, timeout=90):
    wanted = statuses or Run.TERMINAL | {Run.Status.NEEDS_ATTENTION}
    wait_for(lambda: Run.objects.get(id=run.id).status in wanted, timeout=timeout, message=f"run {run.id} {wanted}")
    run.refresh_from_db()
    return run


def idle(run):
    wait_for(lambda: not run.tasks.filter(status=Task.Status.RUNNING).exists(), message="attempts in flight to end")


@pytest.mark.parametrize("mode", ["transient", "timeout_after_commit"])
def test_b1_resume_replays_calls_1_to_3_and_repeats_call_4_with_the_same_key(demo_tx, processes, effects_api, mode):
    run = run_start(workflow="incident-fanout", input={"faults": [{"task": "worker-3", "call": 4, "mode": mode}]})
    processes.worker(threads=2)
    run = terminal(run)
    assert run.status == Run.Status.COMPLETED, run.status_reason
    listed = effects_api(run.id)
    per_key = Counter(key for _, _, key in listed)
    assert max(per_key.values()) == 1  # no duplicate in any system
    assert Counter(kind for _, kind, _ in listed) == {"tickets.create": 5, "crm.update": 5, "email.send": 5}
    w3 = ToolOperation.objects.filter(run=run, task__key="worker-3").order_by("step")
    assert [op.tool for op in w3] == ["crm.read", "tickets.create", "crm.update", "email.send"]
    email = w3.last()
    assert email.status == OS.COMMITTED
    if mode == "timeout_after_commit":
        assert email.status_reason == "reconciled: committed"  # looked up by key before anything else
    else:
        assert email.attempts == 2  # the repeat used the same key; calls 1-3 came from the journal
        assert [op.attempts for op in w3[:3]] == [1, 1, 1]


def test_b2_compensation_survives_a_sigkill_and_undoes_nothing_twice(demo_tx, processes, effects_api, operator):
    faults = [
        {"task": "worker-3", "call": 4, "mode": "error"},
        # the worker dies during the compensation, after the second undo reached its system
        {"task": "compensation", "call": 2, "mode": "crash", "point": "after_call"},
    ]
    run = run_start(workflow="incident-fanout", input={"faults": faults})
    processes.worker(threads=2, **SHORT_LEASE)
    run = terminal(run)
    assert run.status == Run.Status.NEEDS_ATTENTION and "worker-3" in run.status_reason
    idle(run)
    opened = set(
        SandboxTicket.objects.filter(idempotency_key__startswith=run_key_prefix(run.id)).values_list("id", flat=True)
    )
    updated = set(
        SandboxRecord.objects.filter(changes__idempotency_key__startswith=run_key_prefix(run.id)).values_list(
            "id", flat=True
        )
    )
    emails_before = SandboxEmail.objects.count()
    assert not SandboxEmail.objects.filter(idempotency_key__contains=":worker-3:").exists()

    first = processes.started[-1]
    run_compensate(run_id=run.id)
    wait_for(lambda: first.poll() is not None, timeout=60, message="the worker to die during the compensation")
    assert Run.objects.get(id=run.id).status == Run.Status.COMPENSATING

    processes.worker(threads=2, **SHORT_LEASE)
    wait_for(
        lambda: not ToolOperation.objects.filter(run=run, status__in=[OS.APPROVED, OS.EXECUTING]).exists(),
        timeout=60,
        message="the compensations to finish",
    )
    assert set(SandboxTicket.objects.filter(id__in=opened).values_list("status", flat=True)) == {"closed"}
    for record in SandboxRecord.objects.filter(id__in=updated):
        assert record.fields == {"status": "active"}, record.fields
    assert SandboxEmail.objects.count() == emails_before  # no e-mail sent without a reviewer
    undo_keys = set(
        ToolOperation.objects.filter(run=run, kind="compensation").values_list("idempotency_key", flat=True)
    )
    listed = effects_api(run.id)
    undone = Counter(key for _, _, key in listed if key in undo_keys)
    assert len(undone) == len(opened) + len(updated) and max(undone.values()) == 1  # each undone once
    assert Counter(kind for _, kind, key in listed if key in undo_keys) == {
        "tickets.close": len(opened),
        "crm.restore": len(updated),
    }
    reconciled = ToolOperation.objects.get(run=run, kind="compensation", order=2)
    assert reconciled.status == OS.COMMITTED and reconciled.status_reason == "reconciled: committed"

    run.refresh_from_db()
    if emails_before:
        assert run.status == Run.Status.COMPENSATING  # corrections wait for a reviewer
        request = ApprovalRequest.objects.get(run=run, kind=ApprovalRequest.Kind.CORRECTION)
        decide(request_id=request.id, user=operator, approve=True)
    run = terminal(run, {Run.Status.COMPENSATED, Run.Status.NEEDS_ATTENTION}, timeout=60)
    assert run.status == Run.Status.COMPENSATED, run.status_reason
    assert SandboxEmail.objects.filter(kind="correction").count() == emails_before


@pytest.mark.parametrize("approve", [True, False])
def test_b3_one_approval_then_each_proposed_email_is_sent_once(demo_tx, processes, effects_api, operator, approve):
    run = run_start(workflow="incident-fanout", input={"propose_tools": ["email.send"]})
    processes.worker(threads=2)
    run = terminal(run, {Run.Status.WAITING_FOR_APPROVAL, Run.Status.NEEDS_ATTENTION, Run.Status.COMPLETED})
    assert run.status == Run.Status.WAITING_FOR_APPROVAL, run.status_reason
    assert not [e for e in effects_api(run.id) if e[0] == "email"]
    (bundle,) = ApprovalRequest.objects.filter(run=run, parent=None)
    assert bundle.kind == ApprovalRequest.Kind.BUNDLE and bundle.items.count() == 5
    decide(request_id=bundle.id, user=operator, approve=approve, note="drill B3")
    run = terminal(run)
    assert run.status == Run.Status.COMPLETED, run.status_reason
    emails = Counter(key for system, _, key in effects_api(run.id) if system == "email")
    assert len(emails) == (5 if approve else 0) and max(emails.values(), default=1) == 1


# --- B4 and the crash-point matrix ---------------------------------------------------------------------

CLASSES = {"read_only": 1, "idempotent_write": 2, "non_idempotent_write": 4}  # worker call numbers
POINTS = ["after_intent", "after_call", "after_receipt", "after_advance"]


@pytest.fixture
def crash_workflow(demo_tx):
    """One worker making the four incident calls, then a task that depends on it (so that finishing the
    worker enqueues or claims a successor)."""
    Agent.objects.create(
        slug="echo", name="echo", output_schema={"type": "object"}, script=[{"final": {"after": "{deps[w][summary]}"}}]
    )
    return Workflow.objects.create(
        slug="crash-matrix",
        name="crash matrix",
        tasks=[
            {"key": "w", "agent": "incident-worker", "objective": "Handle one customer"},
            {"key": "then", "agent": "echo", "objective": "Report", "depends_on": ["w"]},
        ],
    )


def _end_state(run: Run) -> dict:
    """What a user compares between runs: outcome, artifacts, ledger and effects (ids and times aside)."""
    keys = Counter(
        (c.system, c.operation)
        for c in SandboxCall.objects.filter(idempotency_key__startswith=run_key_prefix(run.id), is_effect=True)
    )
    return {
        "status": run.status,
        "artifacts": {a.key: a.content for a in Artifact.objects.filter(run=run)},
        "ledger": [(op.tool, op.step, op.status) for op in ToolOperation.objects.filter(run=run).order_by("step")],
        "effects": dict(keys),
    }


def test_crash_point_matrix_ends_in_the_state_of_a_run_without_the_crash(crash_workflow, processes, effects_api):
    cases = [(cls, call, point) for cls, call in CLASSES.items() for point in POINTS]
    cases.append(("task end", None, "after_enqueue"))
    reference = run_start(workflow="crash-matrix")
    runs = {}
    for cls, call, point in cases:
        fault = {"task": "w", "call": call or 1, "mode": "crash", "point": point}
        runs[(cls, point)] = run_start(workflow="crash-matrix", input={"faults": [fault]})
    crashes = 0
    # Each worker dies at the first crash point it reaches; a fresh one resumes, until every run is done.
    while not all(Run.objects.get(id=r.id).is_terminal for r in [reference, *runs.values()]):
        # One thread: the crash kills the process before another thread could fire its own crash fault.
        worker = processes.worker(threads=1, **SHORT_LEASE)
        wait_for(
            lambda worker=worker: (
                worker.poll() is not None or all(Run.objects.get(id=r.id).is_terminal for r in runs.values())
            ),
            timeout=90,
            message="a crash or the end of every run",
        )
        crashes += worker.poll() is not None
        assert crashes <= len(cases), "more crashes than crash faults"
    assert crashes == len(cases)

    reference.refresh_from_db()
    expected = _end_state(reference)
    assert expected["status"] == Run.Status.COMPLETED
    for (cls, point), run in runs.items():
        run.refresh_from_db()
        assert _end_state(run) == expected, (cls, point, run.status_reason)
        per_key = Counter(key for _, _, key in effects_api(run.id))
        assert max(per_key.values()) == 1, (cls, point, per_key)
