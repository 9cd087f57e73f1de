"""Each hand-written PostgreSQL statement of the hot path (runs/services/hot_sql.py) does what the portable
dialect's statements do: the one hot path (runs/services/hot.py) plays both here, on PostgreSQL, on two
runs built alike, and what they wrote is compared."""

import json

import pytest
from django.db import transaction
from django.utils import timezone

from agents.gateway import ModelResponse
from core.errors import LeaseLost
from runs.models import Artifact, Run, Span, Task
from runs.services import hot, run_start, sql
from runs.services.hot_sql import context_sql
from runs.services.leases import Lease, lease_expiry

pytestmark = pytest.mark.services

TWINS = {"pg": "postgresql", "portable": "portable"}  # the dialects of runs/services/hot_sql.py


def _claimed(twin: str, run=None, key="inventory"):
    """A first claim of a ready task of a deploy-review run (inventory and risk come first; verify joins
    them), by the twin's statement."""
    run = run or run_start(workflow="deploy-review")
    task = run.tasks.get(key=key)
    now = timezone.now()
    with transaction.atomic():
        Run.objects.select_for_update().get(id=run.id)
        claimed = hot.claim_fresh(
            task, owner="parity", now=now, token=task.fencing_token + 1, expires=lease_expiry(now), dialect=TWINS[twin]
        )
    task.refresh_from_db()
    lease = Lease(task.id, run.id, task.fencing_token, 1, claimed.span_id, "parity", claimed.task_span_id, True)
    return run, task, lease


def _journal(lease, twin: str, *, step: int, body: dict):
    response = ModelResponse(text="looking", tokens_in=11, tokens_out=7, cost_micros=42, model="m")
    started = timezone.now()
    p = hot.step_params(lease, step=step, kind=Span.Kind.MODEL_CALL, name="m", started=started, response=response)
    body_json = json.dumps(body)
    with transaction.atomic():
        return hot.journal_step(p, body, body_json, dialect=TWINS[twin])


def _finish(run, task, lease, twin: str):
    response = ModelResponse(final={"verdict": "APPROVE"}, tokens_in=20, tokens_out=5, cost_micros=100, model="m")
    with transaction.atomic():
        locked = Run.objects.select_for_update().get(id=run.id)
        return hot.finish(
            lease, locked, task, step=2, response=response, started=timezone.now(), now=timezone.now(),
            body=response.as_journal(), provenance={"task": task.key}, dialect=TWINS[twin],
        )  # fmt: skip


def _world(run) -> dict:
    """What the statements wrote, without ids and times."""
    tasks = {
        t.key: (t.status, t.steps_used, t.tokens_used, t.cost_micros, t.lease_owner, t.pending_deps)
        for t in Task.objects.filter(run=run)
    }
    spans = sorted(
        (s.kind, s.name, s.status, s.step, s.tokens_in, s.tokens_out, s.cost_micros, s.ended_at is not None)
        for s in Span.objects.filter(run=run)
    )
    artifacts = sorted((a.key, a.content, a.verification, a.version) for a in Artifact.objects.filter(run=run))
    usage = Run.objects.filter(id=run.id).values("steps_used", "tokens_used", "cost_micros", "status").get()
    return {"tasks": tasks, "spans": spans, "artifacts": artifacts, "run": usage}


def _strip(rows):
    return [tuple(r)[1:] for r in rows]  # the ready rows without their ids


def test_the_journal_and_the_completion_write_the_same_on_both_twins(demo):
    done = {}
    for twin in TWINS:
        run, inventory, first = _claimed(twin)
        claimed = _world(run)
        _, risk, second = _claimed(twin, run, "risk")
        counted = _journal(first, twin, step=1, body={"text": "looking", "n": 1})
        halfway = _finish(run, inventory, first, twin)  # verify still waits for risk
        joined = _finish(run, risk, second, twin)  # now verify is ready
        rows = [counted, halfway._replace(ready=_strip(halfway.ready)), joined._replace(ready=_strip(joined.ready))]
        done[twin] = (rows, claimed, _world(run))
    assert done["pg"] == done["portable"]
    (_, halfway, joined), claimed, world = done["pg"]
    assert claimed["tasks"]["inventory"][0] == Task.Status.RUNNING and claimed["tasks"]["inventory"][4] == "parity"
    assert [s[:3] for s in claimed["spans"] if s[0] in ("task", "attempt")] == [
        ("attempt", "attempt 1", "running"),
        ("task", "task inventory", "running"),
    ]
    assert halfway.ready == [] and [row[1] for row in joined.ready] == ["verify"]
    assert world["tasks"]["verify"][0] == Task.Status.READY and world["artifacts"]


def test_both_twins_refuse_a_lease_that_was_lost_and_write_nothing(demo):
    for twin in TWINS:
        run, task, lease = _claimed(twin)
        Task.objects.filter(id=task.id).update(fencing_token=lease.token + 1)  # a newer holder
        before = _world(run)
        with pytest.raises(LeaseLost):
            _journal(lease, twin, step=1, body={"text": "late"})
        with pytest.raises(LeaseLost):
            _finish(run, task, lease, twin)
        assert _world(run) == before, twin


def test_a_body_too_large_for_the_span_goes_to_a_payload_on_both_dialects(demo):
    for twin in TWINS:
        run, task, lease = _claimed(twin)
        body = {"text": "x" * (hot.INLINE_BODY_LIMIT + 1)}
        counted = _journal(lease, twin, step=1, body=body)
        span = Span.objects.select_related("payload").get(task=task, step=1)
        assert span.body is None and span.payload.body == body, twin
        assert (counted.task.steps, counted.run.steps) == (1, 1), twin


def test_the_context_a_claim_returns_is_the_one_read_after_it(demo):
    """PostgreSQL's claim returns the task's context in its own statement (its snapshot predates the claim,
    so the start time is taken as the claim sets it); the portable twin leaves it to a query of its own."""
    for twin in TWINS:
        run = run_start(workflow="deploy-review")
        task = run.tasks.get(key="inventory")
        now = timezone.now()
        with transaction.atomic():
            Run.objects.select_for_update().get(id=run.id)
            claimed = hot.claim_fresh(
                task, owner="parity", now=now, token=task.fencing_token + 1, expires=lease_expiry(now),
                dialect=TWINS[twin],
            )  # fmt: skip
        after = sql.fetchone(context_sql(), {"task": task.id, "now": sql.ts(timezone.now())})
        if twin == "pg":
            assert claimed.context is not None and tuple(claimed.context) == tuple(after)
        else:
            assert claimed.context is None


def test_checked_inputs_are_marked_verified_by_the_first_journal_statement_and_only_by_a_held_lease(demo):
    for twin in TWINS:
        run, inventory, first = _claimed(twin)
        _finish(run, inventory, first, twin)
        artifact = Artifact.objects.get(run=run, key="inventory")
        _, risk, second = _claimed(twin, run, "risk")
        lost = Lease(**{**second.__dict__, "token": second.token + 1, "verify": [artifact.id]})
        with pytest.raises(LeaseLost):
            _journal(lost, twin, step=1, body={"text": "late"})
        assert Artifact.objects.get(id=artifact.id).verification == "unverified", twin
        second.verify = [artifact.id]
        _journal(second, twin, step=1, body={"text": "reading"})
        assert Artifact.objects.get(id=artifact.id).verification == "verified", twin
        assert second.verify == [], twin  # marked once: the next step's statement marks nothing
