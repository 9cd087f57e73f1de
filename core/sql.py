"""Hand-written SQL helpers, portable between PostgreSQL and SQLite (3.35+, for RETURNING).

The ORM costs about a millisecond of CPU per query on this class of machine, several times the
database's own work: the hot paths of the engine and the broker use these instead. On PostgreSQL each
statement is prepared once on Django's own connection (same transaction).
"""

import json
from collections.abc import Sequence
from datetime import UTC
from typing import NamedTuple

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
        with connection.wrap_database_errors:
            cursor = _kept_cursor()
            cursor.execute(sql, params, prepare=True)
            return fetch(cursor)
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        return fetch(cursor)


def _kept_cursor() -> psycopg.Cursor:
    """One cursor per connection (so per thread), kept across statements: the hot path runs one or two
    statements per step, and a cursor made and closed for each was a fifth of a statement's time here."""
    raw = connection.connection
    kept = getattr(connection, "warden_cursor", None)
    if kept is None or kept.closed or kept.connection is not raw:  # first use, or the connection was replaced
        kept = connection.warden_cursor = psycopg.Cursor(raw)
    return kept


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


def any_of(column: str, name: str) -> str:
    """``column`` is one of the ids in the named parameter ``name``, bound with ``any_of_ids``: one fixed statement
    text on both databases (an array on PostgreSQL, a JSON list on SQLite), so it stays prepared."""
    if connection.vendor == "postgresql":
        return f"{column} = ANY(%({name})s)"
    return f"{column} IN (SELECT value FROM json_each(%({name})s))"


def any_of_ids(values) -> list[int] | str:
    """A list of ids as ``any_of`` binds it."""
    values = [int(v) for v in values]
    return values if connection.vendor == "postgresql" else json.dumps(values)


class Statement(NamedTuple):
    """One statement of a sequence that ``play`` runs, with named parameters (``%(name)s``).

    ``into`` names the columns of the row it returns (a name and how many columns it takes), which later
    statements of the sequence may use as parameters; without ``into`` no row is read. ``fenced``: a
    compare-and-set, whose missing row means the write was refused and nothing after it runs. ``many``:
    all the rows it returns, under that name. ``when``: it runs only if that parameter is non-empty.
    """

    text: str
    into: tuple[tuple[str, int], ...] = ()
    fenced: bool = False
    many: str = ""
    when: str = ""


def play(statements: Sequence[Statement], params: dict) -> bool:
    """Run ``statements`` in order, adding what each returns to ``params``. False when a fenced one
    matched no row (the statements before it ran: the caller's transaction rolls them back)."""
    for statement in statements:
        if statement.when and not params[statement.when]:
            continue
        if statement.many:
            params[statement.many] = fetchall(statement.text, params)
        elif not statement.into:
            execute(statement.text, params)
        else:
            row = fetchone(statement.text, params)
            if row is None:
                if statement.fenced:
                    return False
                raise LookupError(f"no row returned by {statement.text[:60]!r}")
            at = 0
            for name, width in statement.into:
                params[name] = row[at] if width == 1 else tuple(row[at : at + width])
                at += width
    return True
