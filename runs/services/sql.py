"""The engine's own SQL pieces (spans, usage); the generic helpers are core/sql.py's, re-exported here."""

from django.db import connection

from core import bus
from core.sql import (  # noqa: F401  (the engine's modules read the generic helpers from here: sql.fetchone, ...)
    any_of_ids,
    dumps,
    execute,
    fetchall,
    fetchone,
    for_update,
    in_list,
    jsonb,
    loads,
    parse_ts,
    pinned,
    play,
    ts,
)

USAGE_FIELDS = (
    "steps_used",
    "tokens_used",
    "tool_calls_used",
    "cost_micros",
    "max_steps",
    "max_tokens",
    "max_tool_calls",
    "max_cost_micros",
)
USAGE_COLUMNS = (
    "status, steps_used, tokens_used, tool_calls_used, cost_micros, "
    "max_steps, max_tokens, max_tool_calls, max_cost_micros"
)


def with_root_span_end(statement: str, params: list, *, run_id: int, now, ok: bool) -> tuple[str, list]:
    """A run's final update (``statement``) and its root span's end: one statement where the database
    takes a data-modifying CTE (PostgreSQL); elsewhere the span's end runs now and the update is returned."""
    span = "UPDATE runs_span SET ended_at = %s, status = %s WHERE run_id = %s AND kind = 'run' AND ended_at IS NULL"
    span_params = [ts(now), "ok" if ok else "error", run_id]
    if connection.vendor == "postgresql":
        return f"WITH ended AS ({span}) {statement}", span_params + params
    execute(span, span_params)
    return statement, params


RUN_ROOT = object()
ROOT_SPAN_SQL = "(SELECT id FROM runs_span WHERE run_id = %s AND kind = 'run' ORDER BY id LIMIT 1)"


def insert_span(
    *,
    run_id: int,
    kind: str,
    name: str,
    started_at,
    task_id=None,
    parent_id=None,
    status="ok",
    attempt=None,
    step=None,
    fencing_token=None,
    ended_at=None,
    tokens_in=0,
    tokens_out=0,
    cost_micros=0,
    attributes=None,
    body=None,
    payload_id=None,
) -> int:
    """Insert a span; with ``parent_id=RUN_ROOT`` its parent is the run's root span."""
    bus.run_changed(run_id)
    j = jsonb()
    parent_sql, parent_params = (ROOT_SPAN_SQL, [run_id]) if parent_id is RUN_ROOT else ("%s", [parent_id])
    return fetchone(
        "INSERT INTO runs_span (run_id, task_id, parent_id, kind, name, status, attempt, step, fencing_token, "
        "started_at, ended_at, tokens_in, tokens_out, cost_micros, attributes, body, payload_id) "
        f"VALUES (%s, %s, {parent_sql}, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s{j}, %s{j}, %s) RETURNING id",
        [
            run_id,
            task_id,
            *parent_params,
            kind,
            name,
            status,
            attempt,
            step,
            fencing_token,
            ts(started_at),
            ts(ended_at) if ended_at else None,
            tokens_in,
            tokens_out,
            cost_micros,
            dumps(attributes or {}),
            dumps(body),
            payload_id,
        ],
    )[0]


def end_spans(ids, *, now, status: str, attributes: dict | None = None) -> None:
    ids = [i for i in ids if i]
    if not ids:
        return
    where, values = in_list("id", ids)
    if attributes is None:
        execute(f"UPDATE runs_span SET ended_at = %s, status = %s WHERE {where}", [ts(now), status, *values])
    else:
        execute(
            f"UPDATE runs_span SET ended_at = %s, status = %s, attributes = %s{jsonb()} WHERE {where}",
            [ts(now), status, dumps(attributes), *values],
        )


def add_usage(
    table: str,
    row_id: int,
    *,
    steps: int,
    tokens: int,
    tool_calls: int,
    cost: int,
    extra_set: str = "",
    extra_set_params=(),
    extra_where: str = "",
    extra_params=(),
    returning: str = USAGE_COLUMNS,
):
    """Add usage to a run or task row and return its new totals (UPDATE … RETURNING, one round trip)."""
    return fetchone(
        f"UPDATE {table} SET steps_used = steps_used + %s, tokens_used = tokens_used + %s, "
        f"tool_calls_used = tool_calls_used + %s, cost_micros = cost_micros + %s {extra_set} "
        f"WHERE id = %s {extra_where} RETURNING {returning}",
        [steps, tokens, tool_calls, cost, *extra_set_params, row_id, *extra_params],
    )
