"""Retention: what a finished run keeps once it is old.

A run finished (completed, failed, cancelled or compensated) more than ``WARDEN["RETENTION_DAYS"]`` ago
loses the bulk of its journal: span bodies are replaced by a marker, the large bodies kept by reference
(``Payload``) are deleted, and so are the bodies of its quarantined results. What it did and what was
decided stays: the span rows (tree, timings, tokens, cost, status), the tasks' and the run's figures, the
side-effect ledger with its idempotency keys and results, approvals and decisions, the audit log,
artifacts and the blackboard. Nothing reads a finished run's journal again: its tasks cannot be retried,
and compensating a failed or cancelled run works from the ledger alone (saga/compensation.py).

``runs_prune`` works in batches, one transaction each; ``manage.py prune_runs`` and the recovery sweeper
(``retention_sweep``) call it.
"""

import logging
import time
from collections.abc import Callable

from django.conf import settings
from django.db import connection, transaction
from django.db.models import Q
from django.utils import timezone

from .models import QuarantinedResult, Run, Span
from .services import sql

log = logging.getLogger("warden.retention")
PRUNED = {"pruned": True}  # what a pruned body reads: the preview says why it is gone
SWEEP_BATCH = 20  # runs per sweep: a pass stays well under a second even for runs of 1,000 spans

# Stored bytes of a JSON column as each database keeps it: PostgreSQL's on-disk (maybe compressed)
# size, read from the datum's header without decompressing it; SQLite's JSON text in UTF-8.
_SIZE = {"postgresql": "pg_column_size({})", "sqlite": "length(CAST({} AS BLOB))"}


def stored_bytes_sql(column: str) -> str:
    """SQL for the stored size of a JSON ``column`` in this database (NULL when the column is)."""
    return _SIZE[connection.vendor].format(column)


def _due(cutoff):
    return Run.objects.filter(status__in=Run.TERMINAL, pruned_at__isnull=True, finished_at__lt=cutoff)


def _measure(ids: list[int]) -> dict:
    """What pruning these runs removes: spans with a body, payloads, quarantined bodies, and their bytes."""
    in_runs, params = sql.in_list("run_id", ids)
    spans, span_bytes = sql.fetchone(
        f"SELECT COUNT(*), SUM({stored_bytes_sql('body')}) FROM runs_span "
        f"WHERE {in_runs} AND (body IS NOT NULL OR payload_id IS NOT NULL)",
        params,
    )
    payloads, payload_bytes = sql.fetchone(
        f"SELECT COUNT(*), SUM({stored_bytes_sql('body')}) FROM runs_payload "
        f"WHERE id IN (SELECT payload_id FROM runs_span WHERE {in_runs} AND payload_id IS NOT NULL)",
        params,
    )
    quarantined, quarantined_bytes = sql.fetchone(
        f"SELECT COUNT(*), SUM({stored_bytes_sql('body')}) FROM runs_quarantinedresult "
        f"WHERE {in_runs} AND body IS NOT NULL",
        params,
    )
    return {
        "runs": len(ids),
        "spans": spans,
        "payloads": payloads,
        "quarantined": quarantined,
        "bytes": (span_bytes or 0) + (payload_bytes or 0) + (quarantined_bytes or 0),
    }


def _prune_batch(candidates: list[int], cutoff, now) -> dict:
    """Prune those of ``candidates`` still due, in one transaction."""
    with transaction.atomic():
        # The run rows are locked (skip those another pruner or a compensation holds) and re-checked:
        # a failed run may have started compensating since it was listed.
        ids = list(
            _due(cutoff).filter(id__in=candidates).select_for_update(skip_locked=True).values_list("id", flat=True)
        )
        if not ids:
            return {"runs": 0, "spans": 0, "payloads": 0, "quarantined": 0, "bytes": 0}
        done = _measure(ids)
        in_runs, params = sql.in_list("run_id", ids)
        # Payloads first, by a subquery on their spans: Django's delete() would look for the spans
        # pointing at them by payload_id, which has no index. The foreign key is checked at commit,
        # by when the spans below no longer point at them.
        sql.execute(
            f"DELETE FROM runs_payload WHERE id IN "
            f"(SELECT payload_id FROM runs_span WHERE {in_runs} AND payload_id IS NOT NULL)",
            params,
        )
        Span.objects.filter(run_id__in=ids).filter(Q(body__isnull=False) | Q(payload__isnull=False)).update(
            body=PRUNED, payload=None
        )
        QuarantinedResult.objects.filter(run_id__in=ids, body__isnull=False).update(body=PRUNED)
        # No run_changed broadcast: a page open on a month-old run shows it at its next load, and the
        # runs list's viewers would have every pruned row re-rendered for nothing they can see.
        Run.objects.filter(id__in=ids).update(pruned_at=now)
    return done


def runs_prune(
    *,
    older_than_days: int,
    now=None,
    batch: int = 200,
    dry_run: bool = False,
    max_batches: int | None = None,
    on_batch: Callable[[int, dict], None] | None = None,
) -> dict:
    """Prune the journals of runs finished more than ``older_than_days`` ago (0: none), oldest first,
    ``batch`` runs per transaction. ``dry_run`` counts what would go and changes nothing. ``on_batch``
    is called with each batch's number and counts. Returns the totals: runs, spans (bodies emptied),
    payloads and quarantined bodies deleted, bytes (their stored size), batches, and whether ``more``
    may be due (the last batch was full)."""
    totals = {"runs": 0, "spans": 0, "payloads": 0, "quarantined": 0, "bytes": 0, "batches": 0, "more": False}
    if older_than_days <= 0:
        return totals
    now = now or timezone.now()
    cutoff = now - timezone.timedelta(days=older_than_days)
    batch = max(1, batch)
    after = None  # (finished_at, id) of the last run looked at: a run skipped (locked) is not listed again
    while max_batches is None or totals["batches"] < max_batches:
        due = _due(cutoff)
        if after is not None:
            due = due.filter(Q(finished_at__gt=after[0]) | Q(finished_at=after[0], id__gt=after[1]))
        listed = list(due.order_by("finished_at", "id").values_list("finished_at", "id")[:batch])
        if not listed:
            break
        after = listed[-1]
        candidates = [run_id for _, run_id in listed]
        done = _measure(candidates) if dry_run else _prune_batch(candidates, cutoff, now)
        totals["batches"] += 1
        for key, value in done.items():
            totals[key] += value
        if not dry_run:
            log.info("retention: pruned %s", done)
        if on_batch is not None:
            on_batch(totals["batches"], done)
        if len(listed) < batch:
            break
    totals["more"] = totals["batches"] > 0 and len(listed) == batch  # stopped by max_batches: more may be due
    return totals


_next_prune = 0.0  # time.monotonic() of this process's next look; the sweeper is one thread per process


def retention_sweep(now) -> int:
    """Sweeper step: one batch of ``runs_prune``, at most once per ``RETENTION_INTERVAL_SECONDS`` while
    nothing more is due; a backlog (a full batch) goes on at the next sweep. Returns the runs pruned."""
    global _next_prune
    days = settings.WARDEN["RETENTION_DAYS"]
    if not days or time.monotonic() < _next_prune:
        return 0
    # Set before the prune: one that fails waits for the interval, not for the next sweep a second later.
    _next_prune = time.monotonic() + settings.WARDEN["RETENTION_INTERVAL_SECONDS"]
    done = runs_prune(older_than_days=days, now=now, batch=SWEEP_BATCH, max_batches=1)
    if done["more"]:
        _next_prune = 0.0
    return done["runs"]
