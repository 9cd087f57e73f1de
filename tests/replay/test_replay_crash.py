"""A replay of a run whose worker process was SIGKILLed mid-way and resumed by a fresh one, in both modes:
scaled (``rundramatiq`` processes on PostgreSQL + Redis) and embedded (the server process and its worker
threads on the SQLite file). Effects are counted in the sandbox systems, from outside the engine."""

import pytest

from agents.models import AgentVersion
from replay.services import replay_diff, replay_settled, replay_start
from runs.models import FaultFiring, Run, Span, Task
from runs.services import run_start
from tests.conftest import wait_for
from tools.models import SandboxCall, ToolOperation
from tools.replaying import RECORDED

SHORT_LEASE = {"WARDEN_LEASE_SECONDS": 2, "WARDEN_HEARTBEAT_SECONDS": 0.5}
CRASH_AT_WORKER_3_UPDATE = {"faults": [{"task": "worker-3", "call": 3, "mode": "crash"}]}


def answers(run_id: int) -> list[dict]:
    """How each of a replay run's tool calls was answered: the journal's ``replay`` records."""
    spans = Span.objects.filter(run_id=run_id, kind=Span.Kind.TOOL_CALL, step__isnull=False)
    bodies = [s.body if s.payload_id is None else s.payload.body for s in spans.select_related("payload")]
    return [body["replay"] for body in bodies]


def committed(run_id: int, **where) -> set[int]:
    ops = ToolOperation.objects.filter(run_id=run_id, kind=ToolOperation.Kind.ACTION, **where)
    return set(ops.filter(status=ToolOperation.Status.COMMITTED).values_list("id", flat=True))


@pytest.mark.processes
def test_a_replay_of_a_run_whose_worker_died_mid_way_reads_the_receipts_it_left(demo_tx, processes):
    """The original's worker process dies between worker-3's ticket and its CRM update; a fresh one
    finishes the run. Its replay reads every receipt, the ones written before the crash included: nothing
    differs, nothing is sent."""
    run = run_start(workflow="incident-fanout", input=CRASH_AT_WORKER_3_UPDATE)
    # One thread, so the crash cannot catch another task between a call and its journal entry.
    first = processes.runner(threads=1, **SHORT_LEASE)
    wait_for(lambda: first.poll() is not None, timeout=60, message="the process to die at worker-3's third call")
    assert FaultFiring.objects.filter(run=run, task_key="worker-3").exists(), processes.log(first)
    assert Task.objects.get(run=run, key="worker-3").status == Task.Status.RUNNING  # an orphaned lease
    # Its ticket was opened before the crash: a receipt the resumed run and the replay must both use.
    assert SandboxCall.objects.filter(idempotency_key__contains=":worker-3:", is_effect=True).count() == 1
    before_crash = committed(run.id, task__key="worker-3")
    assert len(before_crash) == 2  # crm.read and tickets.create

    processes.runner(threads=2, **SHORT_LEASE)
    wait_for(lambda: Run.objects.get(id=run.id).is_terminal, timeout=90, message="the run to finish")
    run.refresh_from_db()
    assert run.status == Run.Status.COMPLETED, run.status_reason
    assert Task.objects.get(run=run, key="worker-3").recoveries == 1
    effects = list(SandboxCall.objects.filter(is_effect=True).values_list("tool", "idempotency_key"))
    assert len(effects) == len(set(effects)) == 15  # 5 tickets, 5 updates, 5 e-mails: no duplicate

    sandbox = list(SandboxCall.objects.values_list("id", "tool", "idempotency_key", "is_effect"))
    version = AgentVersion.objects.filter(agent__slug="incident-worker", draft=False).order_by("-number").first()
    replay = replay_start(run_ids=[run.id], agent="incident-worker", version=version.number, via="test")
    wait_for(lambda: replay_settled(replay), timeout=60, message=f"replay {replay.id} to settle")
    diff = replay_diff(replay)
    (pair,) = diff["runs"]
    assert pair["difference"] is False and pair["calls_added"] == [] and pair["calls_removed"] == [], pair
    assert pair["output_equal"] and pair["first_divergence"] is None, pair
    replayed = answers(pair["replay"])
    assert len(replayed) == 20 and {a["answered"] for a in replayed} == {RECORDED}, replayed
    assert {a["operation"] for a in replayed} == committed(run.id) >= before_crash
    # No system was reached, not even for a read, and the replay wrote no ledger row of its own.
    assert list(SandboxCall.objects.values_list("id", "tool", "idempotency_key", "is_effect")) == sandbox
    assert not ToolOperation.objects.filter(run_id=pair["replay"]).exists()
