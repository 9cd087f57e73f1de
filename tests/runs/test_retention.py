"""Retention: an old finished run loses its step bodies and payloads and keeps what it did and what was
decided (ledger, approvals, decisions, audit, artifacts, blackboard, figures, the trace tree); recent,
unfinished and attention-needing runs are left alone; the command, the sweeper and the run page."""

import io
import random
import re
import string
import subprocess
import sys
from datetime import timedelta

import pytest
from django.core.management import call_command
from django.urls import reverse
from django.utils import timezone

from agents.models import Agent, Workflow
from policy.models import ApprovalRequest, Decision
from runs import retention
from runs.models import Artifact, BlackboardEntry, Payload, QuarantinedResult, Run, Span
from runs.retention import runs_prune
from runs.services import run_cancel, run_start
from runs.services.recovery import sweep_once
from saga.compensation import run_compensate
from saga.executor import run_operations
from tenancy.models import AuditEvent
from tenancy.tokens import api_token_create
from tests.conftest import ROOT, decide, process_env
from tests.runs.test_outbox_and_recovery import run_at_once
from tests.runs.test_run_actions import EMAIL_FAILS, drive
from tests.runs.test_run_page import NODE, text
from tools.models import ToolOperation

DAY = timedelta(days=1)
# A journaled step this large is kept by reference, as a Payload. Random letters, since PostgreSQL's
# stored size is after compression, and 40,000 x's compress to almost nothing.
BLOB = "".join(random.Random(7).choices(string.ascii_letters + string.digits, k=40_000))


@pytest.fixture(autouse=True)
def no_heartbeat(monkeypatch):
    from runs.heartbeat import lease_keeper

    monkeypatch.setattr(lease_keeper, "hold", lambda task_id, token: None)  # no heartbeat thread in a test


def age(run: Run, days: float) -> Run:
    """As if the run had finished ``days`` ago (the clock is the only thing a test cannot wait for)."""
    Run.objects.filter(id=run.id).update(finished_at=timezone.now() - days * DAY)
    run.refresh_from_db()
    return run


def bulky(slug: str = "bulky") -> Run:
    """A one-task run whose first step is a large model response (a Payload), with a blackboard entry."""
    write = {"key": "region", "kind": "text", "value": "eu-west-1", "expected_version": 0, "sources": []}
    agent = Agent.objects.create(
        slug=f"{slug}-agent",
        name=slug,
        script=[{"say": "{input[blob]}"}, {"tool": "blackboard.write", "arguments": write}, {"final": {"n": 1}}],
        allowed_tools=["blackboard.write"],
        output_schema={"type": "object"},
    )
    Workflow.objects.create(slug=slug, name=slug, tasks=[{"key": "only", "agent": agent.slug, "objective": "Do it"}])
    return drive(run_start(workflow=slug, input={"blob": BLOB}))


def stopped() -> Run:
    """incident-fanout stopped by a failing e-mail after workers created tickets, updated records and sent
    e-mails: a run that needs attention, with a ledger."""
    run = drive(run_start(workflow="incident-fanout", input=EMAIL_FAILS))
    assert run.status == Run.Status.NEEDS_ATTENTION, run.status_reason
    return run


def compensate(run: Run, reviewer) -> Run:
    """Undo what can be undone, correct what cannot once a reviewer approved (approval, decision, audit)."""
    run_compensate(run_id=run.id, reason="incident rolled back")
    run_operations(run.id)
    corrections = ApprovalRequest.objects.get(run=run, kind=ApprovalRequest.Kind.CORRECTION)
    decide(request_id=corrections.id, user=reviewer, approve=True, note="send the corrections")
    run_operations(run.id)
    run.refresh_from_db()
    assert run.status == Run.Status.COMPENSATED, run.status_reason
    return run


def record(run: Run) -> dict:
    """Everything retention must keep of a run, as a user would compare it before and after."""
    run.refresh_from_db()
    return {
        "run": (run.status, run.status_reason, run.steps_used, run.tokens_used, run.tool_calls_used, run.cost_micros,
                run.started_at, run.finished_at),
        "tasks": list(run.tasks.order_by("id").values_list(
            "key", "status", "attempts", "steps_used", "tokens_used", "tool_calls_used", "cost_micros", "started_at",
            "finished_at")),
        "spans": list(Span.objects.filter(run=run).order_by("id").values_list(
            "id", "parent_id", "kind", "name", "status", "step", "started_at", "ended_at", "tokens_in", "tokens_out",
            "cost_micros", "attributes")),
        "ledger": list(ToolOperation.objects.filter(run=run).order_by("id").values_list(
            "idempotency_key", "status", "arguments", "result", "external_id")),
        "approvals": list(ApprovalRequest.objects.filter(run=run).order_by("id").values_list("kind", "status")),
        "decisions": list(Decision.objects.filter(request__run=run).order_by("id").values_list("verdict", "comment")),
        "audit": list(AuditEvent.objects.filter(run_id=run.id).order_by("id").values_list("action", "outcome")),
        "artifacts": list(Artifact.objects.filter(run=run).order_by("id").values_list("key", "content", "provenance")),
        "blackboard": list(BlackboardEntry.objects.filter(run=run).order_by("id").values_list("key", "value")),
    }  # fmt: skip


def journal(run: Run) -> list:
    return list(Span.objects.filter(run=run).order_by("id").values_list("body", "payload_id"))


def page(client, run: Run) -> str:
    response = client.get(reverse("runs:detail", args=[run.id]))
    assert response.status_code == 200
    return text(response.content.decode())


def stored_bytes(client, run: Run) -> float:
    """The header's "stored 41.2 KB", in bytes."""
    number, unit = re.search(r"stored ([\d.]+) (bytes|KB|MB)", page(client, run)).groups()
    return float(number) * {"bytes": 1, "KB": 1024, "MB": 1024**2}[unit]


# --- the prune ----------------------------------------------------------------------------------------------
def test_an_old_finished_run_loses_bodies_and_payloads_and_keeps_what_it_did_and_what_was_decided(
    demo, operator, client
):
    old = age(compensate(stopped(), operator), 40)
    big = age(bulky(), 40)
    assert big.status == Run.Status.COMPLETED
    payload_id = Span.objects.get(run=big, step=1).payload_id
    assert payload_id and Payload.objects.filter(id=payload_id).exists()
    QuarantinedResult.objects.create(
        run=old, task=old.tasks.first(), reason="lease_lost", fencing_token=1, plan_version=1, body={"late": BLOB}
    )
    kept = {run.id: record(run) for run in (old, big)}
    assert kept[old.id]["decisions"] and kept[old.id]["audit"] and kept[old.id]["ledger"] and kept[old.id]["artifacts"]
    assert kept[big.id]["blackboard"] and kept[big.id]["artifacts"]

    done = runs_prune(older_than_days=30)

    assert done["runs"] == 2 and done["payloads"] == 1 and done["quarantined"] == 1
    assert done["spans"] == Span.objects.filter(run__in=[old, big], body={"pruned": True}).count() > 0
    assert done["bytes"] > 2 * len(BLOB)
    assert not Payload.objects.filter(id=payload_id).exists()
    for run in (old, big):
        assert all(body in (None, {"pruned": True}) and payload is None for body, payload in journal(run))
        assert record(run) == kept[run.id]  # everything else, to the last figure
        assert run.pruned_at is not None
    assert QuarantinedResult.objects.get(run=old).body == {"pruned": True}

    # The run page still draws the whole trace tree, the ledger and the figures, and says what happened.
    client.force_login(operator)
    response = client.get(reverse("runs:detail", args=[old.id]))
    assert response.status_code == 200
    assert set(NODE.findall(response.content.decode())) == {
        str(i) for i in Span.objects.filter(run=old).values_list("id", flat=True)
    }
    shown = text(response.content.decode())
    assert f"journal pruned {old.pruned_at:%Y-%m-%d}" in shown
    assert f"steps {old.steps_used} " in shown and f"tokens {old.tokens_used} " in shown
    for op in ToolOperation.objects.filter(run=old):
        assert op.idempotency_key in shown
    # A body asked for says it was pruned.
    download = client.get(reverse("runs:span-payload", args=[big.id, Span.objects.get(run=big, step=1).id]))
    assert download.status_code == 200 and download.json() == {"pruned": True}

    assert runs_prune(older_than_days=30)["runs"] == 0  # once is enough


def test_a_cancelled_run_pruned_then_compensated_is_undone_from_its_ledger(demo, operator):
    run = stopped()
    run_cancel(run_id=run.id, reason="wrong incident")
    run = age(run, 40)
    assert run.status == Run.Status.CANCELLED
    assert runs_prune(older_than_days=30)["runs"] == 1

    run = compensate(run, operator)  # months later, say: the ledger is all compensation needs

    writes = ToolOperation.objects.filter(run=run, kind="action").exclude(tool_class="read_only")
    assert set(writes.exclude(status="failed").values_list("status", flat=True)) == {"compensated"}
    undo = ToolOperation.objects.filter(run=run).exclude(kind="action")
    assert undo.count() == 8 and set(undo.values_list("status", flat=True)) == {"committed"}


def test_recent_unfinished_and_attention_needing_runs_are_left_alone(demo, operator):
    recent = age(bulky("recent"), 10)
    waiting = stopped()
    running = run_start(workflow="deploy-review")
    assert running.status == Run.Status.RUNNING
    # Even with a finished date long past: the status decides, not the date.
    for run in (waiting, running):
        age(run, 400)
    before = {run.id: (record(run), journal(run)) for run in (recent, waiting, running)}

    assert runs_prune(older_than_days=30)["runs"] == 0
    for run in (recent, waiting, running):
        assert (record(run), journal(run)) == before[run.id]
        assert Run.objects.get(id=run.id).pruned_at is None


def test_a_dry_run_counts_and_changes_nothing(demo):
    runs = [age(bulky(f"bulky-{i}"), 40 + i) for i in range(3)]
    before = {run.id: (record(run), journal(run)) for run in runs}
    payloads = Payload.objects.count()

    seen = []
    done = runs_prune(older_than_days=30, batch=2, dry_run=True, on_batch=lambda n, counts: seen.append(counts))

    assert (done["runs"], done["payloads"], done["batches"]) == (3, 3, 2)
    assert [counts["runs"] for counts in seen] == [2, 1]
    assert done["bytes"] > 3 * len(BLOB)
    assert Payload.objects.count() == payloads
    for run in runs:
        assert (record(run), journal(run)) == before[run.id] and Run.objects.get(id=run.id).pruned_at is None
    assert runs_prune(older_than_days=30, batch=2)["runs"] == 3  # what the dry run counted


def test_the_command_prints_each_batch_and_a_summary(demo):
    for i in range(3):
        age(bulky(f"bulky-{i}"), 40)
    out = io.StringIO()
    call_command("prune_runs", "--older-than-days", "30", "--batch", "2", "--dry-run", stdout=out)
    lines = out.getvalue().splitlines()
    assert lines[0].startswith("batch 1: would prune 2 runs: ") and lines[1].startswith("batch 2: would prune 1 run: ")
    assert lines[-1].startswith("dry run: would prune 3 runs finished before ")
    assert ", 3 payloads, " in lines[-1] and lines[-1].endswith(", in 2 batches")
    assert not Run.objects.filter(pruned_at__isnull=False).exists()

    out = io.StringIO()
    call_command("prune_runs", "--older-than-days", "30", stdout=out)
    assert re.fullmatch(
        r"pruned 3 runs finished before [-\d]+ [:\d]+ UTC: \d+ span bodies, 3 payloads, 0 quarantined bodies, "
        r"[\d.]+ KB, in 1 batch",
        out.getvalue().splitlines()[-1],
    )
    assert Run.objects.filter(pruned_at__isnull=False).count() == 3


@pytest.mark.services
def test_two_pruners_at_once_prune_each_run_once(demo_tx):
    runs = [age(bulky(f"bulky-{i}"), 40) for i in range(6)]

    done = run_at_once(2, lambda: runs_prune(older_than_days=30, batch=1))

    assert sum(d["runs"] for d in done) == 6 and sum(d["payloads"] for d in done) == 6
    assert Run.objects.filter(id__in=[r.id for r in runs], pruned_at__isnull=True).count() == 0
    assert not Payload.objects.exists()


# --- the sweeper ----------------------------------------------------------------------------------------
def test_the_sweeper_prunes_then_waits_for_the_interval(demo, settings, monkeypatch):
    settings.WARDEN = {**settings.WARDEN, "RETENTION_DAYS": 30, "RETENTION_INTERVAL_SECONDS": 3600}
    monkeypatch.setattr(retention, "_next_prune", 0.0)
    first = age(bulky("first"), 40)

    assert sweep_once()["runs_pruned"] == 1
    assert Run.objects.get(id=first.id).pruned_at is not None

    second = age(bulky("second"), 40)
    assert sweep_once()["runs_pruned"] == 0  # within the interval: not looked at
    assert Run.objects.get(id=second.id).pruned_at is None

    monkeypatch.setattr(retention, "_next_prune", 0.0)  # the hour has passed
    assert sweep_once()["runs_pruned"] == 1


def test_a_backlog_goes_on_at_the_next_sweep_one_batch_each(demo, settings, monkeypatch):
    settings.WARDEN = {**settings.WARDEN, "RETENTION_DAYS": 30}
    monkeypatch.setattr(retention, "_next_prune", 0.0)
    monkeypatch.setattr(retention, "SWEEP_BATCH", 2)
    for i in range(3):
        age(bulky(f"bulky-{i}"), 40)

    assert [sweep_once()["runs_pruned"] for _ in range(3)] == [2, 1, 0]  # the third waits for the interval


def test_retention_off_prunes_nothing(demo, settings, monkeypatch):
    settings.WARDEN = {**settings.WARDEN, "RETENTION_DAYS": 0}
    monkeypatch.setattr(retention, "_next_prune", 0.0)
    run = age(bulky(), 4000)
    assert sweep_once()["runs_pruned"] == 0
    out = io.StringIO()
    call_command("prune_runs", stdout=out)
    assert "retention is off" in out.getvalue()
    assert Run.objects.get(id=run.id).pruned_at is None


# --- the run page ---------------------------------------------------------------------------------------
def test_the_run_page_shows_the_stored_size_which_drops_after_pruning(demo, operator, client):
    run = age(bulky(), 40)
    client.force_login(operator)
    before = stored_bytes(client, run)
    assert before > len(BLOB)
    assert "journal pruned" not in page(client, run)

    runs_prune(older_than_days=30)

    after = stored_bytes(client, run)
    assert after < 1024 < before  # the markers and the artifact are what is left
    assert f"journal pruned {Run.objects.get(id=run.id).pruned_at:%Y-%m-%d}" in page(client, run)


def test_the_api_says_when_a_run_was_pruned(demo, operator, client):
    run = age(bulky(), 40)
    token = api_token_create(user=operator, scopes=["read"])[1]
    url, auth = f"/api/v1/runs/{run.id}", {"HTTP_AUTHORIZATION": f"Bearer {token}"}
    before = client.get(url, **auth).json()
    assert before.pop("pruned_at") is None
    runs_prune(older_than_days=30)
    after = client.get(url, **auth).json()
    assert after.pop("pruned_at").startswith(f"{Run.objects.get(id=run.id).pruned_at:%Y-%m-%dT%H:%M:%S.}")
    assert after == before  # status, usage, budget and tasks as they were


# --- settings -------------------------------------------------------------------------------------------
def test_idempotency_keys_kept_less_than_72_hours_are_refused_at_start_up():
    env = process_env(WARDEN_IDEMPOTENCY_KEEP_HOURS="24")
    started = subprocess.run(
        [sys.executable, "-c", "import django; django.setup()"], cwd=ROOT, env=env, capture_output=True, text=True
    )
    assert started.returncode != 0
    assert "ImproperlyConfigured: WARDEN_IDEMPOTENCY_KEEP_HOURS is 24" in started.stderr
    assert "kept at least 72 hours" in started.stderr
