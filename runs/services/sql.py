"""Hand-written SQL for the engine's hot path (a claim, a step, a completion).

The ORM costs about a millisecond of CPU per query on this class of machine, several times the
database's own work; these statements keep a journaled step near the database's commit rate. All of
them are portable between PostgreSQL and SQLite (3.35+, for RETURNING) except the PostgreSQL
single-statement step in execution.py, which has a portable fallback.
"""

import json
from datetime import UTC

from django.db import connection

from core import bus

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


def dumps(value) -> str | None:
    return None if value is None else json.dumps(value, default=str)


def loads(value):
    """JSON columns come back parsed from PostgreSQL and as text from SQLite."""
    return json.loads(value) if isinstance(value, str) else value


def ts(value):
    return connection.ops.adapt_datetimefield_value(value)


def parse_ts(value):
    """Timestamps come back as datetimes from PostgreSQL and as text from SQLite."""

    from django.utils.dateparse import parse_datetime

    parsed = parse_datetime(value) if isinstance(value, str) else value
    return parsed.replace(tzinfo=UTC) if parsed is not None and parsed.tzinfo is None else parsed


def jsonb() -> str:
    return "::jsonb" if connection.vendor == "postgresql" else ""


def for_update(of: str = "") -> str:
    if not connection.features.has_select_for_update:
        return ""
    return f" FOR UPDATE OF {of}" if of else " FOR UPDATE"


def _run(sql: str, params, fetch):
    if connection.vendor == "postgresql":
        # A server-side-binding cursor on Django's own connection (same transaction), so PostgreSQL
        # prepares each statement once: planning costs more than executing these small statements.
        import psycopg

        # As Django's own cursor() does: a connection that failed its health check is replaced, and a
        # driver error is raised as Django's and marks the connection for closing.
        connection.close_if_health_check_failed()
        connection.ensure_connection()
        with connection.wrap_database_errors, psycopg.Cursor(connection.connection) as cursor:
            cursor.execute(sql, params, prepare=True)
            return fetch(cursor)
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        return fetch(cursor)


def fetchone(sql: str, params):
    return _run(sql, params, lambda c: c.fetchone())


def fetchall(sql: str, params):
    return _run(sql, params, lambda c: c.fetchall())


def execute(sql: str, params) -> int:
    return _run(sql, params, lambda c: c.rowcount)


def in_list(column: str, values) -> tuple[str, list]:
    """``column IN (…)`` as one fixed statement text on PostgreSQL (= ANY(array)), so it stays prepared."""
    values = list(values)
    if connection.vendor == "postgresql":
        return f"{column} = ANY(%s)", [values]
    return f"{column} IN ({', '.join(['%s'] * len(values))})", values


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
