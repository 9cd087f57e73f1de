"""Hand-written SQL helpers, portable between PostgreSQL and SQLite (3.35+, for RETURNING).

The ORM costs about a millisecond of CPU per query on this class of machine, several times the
database's own work: the hot paths of the engine and the broker use these instead. On PostgreSQL each
statement is prepared once on Django's own connection (same transaction).
"""

import json
from datetime import UTC

import psycopg
from django.db import connection
from django.utils.dateparse import parse_datetime


def dumps(value) -> str | None:
    return None if value is None else json.dumps(value, default=str)


def loads(value):
    """JSON columns come back parsed from PostgreSQL and as text from SQLite."""
    return json.loads(value) if isinstance(value, str) else value


def ts(value):
    return connection.ops.adapt_datetimefield_value(value)


def parse_ts(value):
    """Timestamps come back as datetimes from PostgreSQL and as text from SQLite."""

    parsed = parse_datetime(value) if isinstance(value, str) else value
    return parsed.replace(tzinfo=UTC) if parsed is not None and parsed.tzinfo is None else parsed


def jsonb() -> str:
    return "::jsonb" if connection.vendor == "postgresql" else ""


def json_key(column: str, key: str) -> str:
    """A top-level key of a JSON column, as JSON (read it with ``loads``). ``key``: a trusted name."""
    if connection.vendor == "postgresql":
        return f"({column} -> '{key}')"
    return f"json_extract({column}, '$.{key}')"


def json_int(column: str, key: str) -> str:
    """A top-level key of a JSON column, as an integer (NULL when absent or null). ``key``: a trusted name."""
    if connection.vendor == "postgresql":
        return f"(({column} ->> '{key}')::integer)"
    return f"json_extract({column}, '$.{key}')"


def pinned(version: str, key: str, live: str, *, as_int: bool = False) -> str:
    """A workflow setting as the run's pinned version (alias ``version``, LEFT JOINed) says, or the live
    column ``live`` for a run that has no version (rows written around the services)."""
    value = json_int(version, key) if as_int else json_key(version, key)
    return f"CASE WHEN {version} IS NULL THEN {live} ELSE {value} END"


def for_update(of: str = "") -> str:
    if not connection.features.has_select_for_update:
        return ""
    return f" FOR UPDATE OF {of}" if of else " FOR UPDATE"


def _run(sql: str, params, fetch):
    if connection.vendor == "postgresql":
        # A server-side-binding cursor on Django's own connection (same transaction), so PostgreSQL
        # prepares each statement once: planning costs more than executing these small statements.
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
