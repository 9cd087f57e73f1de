"""The hot path's SQL, per dialect: the one place that knows which statements a claim, a journaled step and
a completion take on each database. runs/services/hot.py plays them (``core.sql.play``) and holds the
control flow, once.

- ``postgresql``: each write is one statement (data-modifying CTEs), prepared once per connection.
- ``portable``: the same writes as several plain statements of the caller's transaction (SQLite; and
  PostgreSQL, where tests/runs/test_sql_parity.py runs both dialects on the same fixtures).

Both dialects take the same named parameters and return the same names (``into``), so hot.py does not
know which one ran. JSON casts and id lists follow the database the statements run on (``sql.jsonb``,
``sql.any_of``), hence the tables are built per database, once.
"""

from functools import cache
from typing import NamedTuple

from django.db import connection

from core.sql import Statement, any_of, jsonb, pinned

from ..models import Task
from ..transitions import TASK
from .sql import USAGE_COLUMNS

USAGE = len(USAGE_COLUMNS.split(","))  # the columns of a Usage row

# The moves, named from the table: the module does not load if the table stops allowing them.
CLAIMED = TASK.edge(Task.Status.READY, Task.Status.RUNNING)  # a first claim: its task was ready
RUNNING, COMPLETED = Task.Status.RUNNING, TASK.edge(Task.Status.RUNNING, Task.Status.COMPLETED)
PENDING, READY = Task.Status.PENDING, TASK.edge(Task.Status.PENDING, Task.Status.READY)

_SPAN_COLUMNS = (
    "run_id, task_id, parent_id, kind, name, status, attempt, step, fencing_token, started_at, ended_at, "
    "tokens_in, tokens_out, cost_micros, attributes, body, payload_id"
)
_ROOT_SPAN = "(SELECT id FROM runs_span WHERE run_id = %(run)s AND kind = 'run' ORDER BY id LIMIT 1)"
_READY_COLUMNS = "id, status, key, fencing_token, attempts, continuing, agent_id"


# A task's context as an attempt reads it (runs/services/execution.py parses the row): the task, its agent,
# run, project and pinned agent version, the workflow's task limit, and whether the blackboard has anything a
# prompt may carry (most runs have none, and skip that query). ``started_at`` as the claim sets it, so the
# row reads the same inside the claim's statement (PostgreSQL: its snapshot predates the claim) as after it.
_CONTEXT_COLUMNS = (
    "t.key", "t.objective", "t.depends_on", "t.dependents", "t.output_schema", "t.allowed_tools", "t.plan_version",
    "t.depth", "t.agent_id", "t.steps_used", "t.tokens_used", "t.tool_calls_used", "t.cost_micros", "t.max_steps",
    "t.max_tokens", "t.max_tool_calls", "t.max_cost_micros", "t.max_seconds", "COALESCE(t.started_at, %(now)s)",
    "a.slug", "a.instructions", "a.provider", "a.model", "a.script", "a.is_planner", "a.cache_seconds",
    "a.fallback_provider", "a.fallback_model", "a.routing", "a.base_url", "a.api_key_secret", "a.send_max_tokens",
    "a.project_id", "r.input", "r.status", "r.steps_used", "r.tokens_used", "r.tool_calls_used", "r.cost_micros",
    "r.max_steps", "r.max_tokens", "r.max_tool_calls", "r.max_cost_micros", "r.plan_version", "{max_tasks}",
    "t.journal_epoch", "r.project_id", "p.slug", "v.config",
    "EXISTS (SELECT 1 FROM runs_blackboardentry b WHERE b.run_id = r.id AND b.verification = 'verified')",
    "r.mode", "r.replay_of_id", "r.live_reads",
)  # fmt: skip
CONTEXT_WIDTH = len(_CONTEXT_COLUMNS)


def _context_text() -> str:
    """The context of the task ``%(task)s`` (``%(now)s``: when it was claimed, if the row has not said yet)."""
    max_tasks = pinned("wv.config", "max_tasks", "w.max_tasks", as_int=True)  # as the run's version says
    return (
        f"SELECT {', '.join(_CONTEXT_COLUMNS).format(max_tasks=max_tasks)} "
        "FROM runs_task t JOIN agents_agent a ON a.id = t.agent_id JOIN runs_run r ON r.id = t.run_id "
        "JOIN agents_workflow w ON w.id = r.workflow_id JOIN approvals_project p ON p.id = r.project_id "
        "LEFT JOIN agents_agentversion v ON v.id = t.agent_version_id "
        "LEFT JOIN agents_workflowversion wv ON wv.id = r.workflow_version_id "
        "WHERE t.id = %(task)s"
    )


def context_sql() -> str:
    """The statement that reads one task's context, on this database (named parameters task and now)."""
    return _context_built(connection.vendor)


@cache
def _context_built(vendor: str) -> str:
    return _context_text()


class HotSql(NamedTuple):
    claim_fresh: tuple[Statement, ...]  # into task_span, span (and on PostgreSQL context); fenced
    journal_step: tuple[Statement, ...]  # into run_usage, task_usage; fenced
    finish: tuple[Statement, ...]  # into run_usage, plan_version, held_back, completed, ready, dependents
    count_down: tuple[Statement, ...]  # many: ready


def hot_sql(dialect: str | None = None) -> HotSql:
    """The statements of ``dialect`` (default: the one for this database) on this database."""
    if dialect is None:
        dialect = "postgresql" if connection.vendor == "postgresql" else "portable"
    return _built(dialect, connection.vendor)


@cache
def _built(dialect: str, vendor: str) -> HotSql:
    return _postgresql() if dialect == "postgresql" else _portable()


def _count_down_text() -> str:
    # SET expressions see the row before the update: pending_deps = 1 means this was the last one.
    return (
        "UPDATE runs_task SET pending_deps = pending_deps - 1, "
        f"status = CASE WHEN pending_deps <= 1 THEN '{READY}' ELSE status END, "
        "ready_at = CASE WHEN pending_deps <= 1 THEN %(now)s ELSE ready_at END "
        f"WHERE {any_of('id', 'counted')} AND status = '{PENDING}' RETURNING {_READY_COLUMNS}"
    )


def _usage_set() -> str:
    """A step counted on a run's or a task's row."""
    return (
        "steps_used = steps_used + 1, tokens_used = tokens_used + %(tokens)s, "
        "tool_calls_used = tool_calls_used + %(tool_calls)s, cost_micros = cost_micros + %(cost)s"
    )


_PG_CLAIM = f"""
WITH c AS (
    UPDATE runs_task SET status = '{CLAIMED}', attempts = 1, fencing_token = %(token)s, lease_owner = %(owner)s,
        lease_expires_at = %(expires)s, heartbeat_at = %(now)s, continuing = false,
        started_at = COALESCE(started_at, %(now)s), not_before = NULL
    WHERE id = %(task)s AND fencing_token = %(old)s AND status = %(status)s
    RETURNING id
), ts AS (
    INSERT INTO runs_span ({_SPAN_COLUMNS})
    SELECT %(run)s, c.id, {_ROOT_SPAN}, 'task', %(task_name)s, 'running', NULL, NULL, NULL, %(now)s, NULL, 0, 0, 0,
        %(task_attrs)s::jsonb, NULL, NULL FROM c
    RETURNING id
), a AS (
    INSERT INTO runs_span ({_SPAN_COLUMNS})
    SELECT %(run)s, %(task)s, ts.id, 'attempt', 'attempt 1', 'running', 1, NULL, %(token)s, %(now)s, NULL, 0, 0, 0,
        %(attempt_attrs)s::jsonb, NULL, NULL FROM ts
    RETURNING id
)
SELECT ts.id, a.id, ctx.* FROM ts CROSS JOIN a LEFT JOIN ({{context}}) ctx ON true
"""
# The attempt's inputs, checked when its context was read, are marked verified by its first journal
# statement, not by a commit of their own (an empty list on every later step).
_VERIFY = "UPDATE runs_artifact SET verification = 'verified' WHERE {ids} AND verification = 'unverified'"
_PG_VERIFY = _VERIFY.format(ids="id = ANY(%(verify)s)") + " AND EXISTS (SELECT 1 FROM t)"
_PG_STEP = f"""
WITH t AS (
    UPDATE runs_task SET {_usage_set()}, heartbeat_at = %(now)s, tokens_reserved = 0, cost_reserved_micros = 0
    WHERE id = %(task)s AND fencing_token = %(token)s AND status = '{RUNNING}'
    RETURNING {USAGE_COLUMNS}
), r AS (
    UPDATE runs_run SET {_usage_set()}
    WHERE id = %(run)s AND EXISTS (SELECT 1 FROM t)
    RETURNING {USAGE_COLUMNS}
), s AS (
    INSERT INTO runs_span ({_SPAN_COLUMNS})
    SELECT %(run)s, %(task)s, %(parent)s, %(kind)s, %(name)s, 'ok', %(attempt)s, %(step)s, %(token)s,
        %(started)s, %(now)s, %(tokens_in)s, %(tokens_out)s, %(cost)s, '{{}}'::jsonb, %(body)s::jsonb,
        %(payload)s::bigint
    WHERE EXISTS (SELECT 1 FROM t)
    RETURNING id
), v AS ({_PG_VERIFY})
SELECT r.*, t.* FROM r, t
"""
_PG_FINISH = f"""
WITH r AS (
    UPDATE runs_run SET {_usage_set()}
    WHERE id = %(run)s
    RETURNING {USAGE_COLUMNS}, plan_version, held_back
), t AS (
    UPDATE runs_task SET status = '{COMPLETED}', finished_at = %(now)s, lease_owner = '', lease_expires_at = NULL,
        status_reason = '', {_usage_set()}, tokens_reserved = 0, cost_reserved_micros = 0
    WHERE id = %(task)s AND fencing_token = %(token)s AND status = '{RUNNING}'
        AND EXISTS (SELECT 1 FROM r WHERE r.status <> 'cancelling')
    RETURNING id, dependents
), s AS (
    INSERT INTO runs_span ({_SPAN_COLUMNS})
    SELECT %(run)s, t.id, %(parent)s, 'model_call', %(model)s, 'ok', %(attempt)s, %(step)s, %(token)s,
        %(started)s, %(now)s, %(tokens_in)s, %(tokens_out)s, %(cost)s, '{{}}'::jsonb, %(body)s::jsonb, NULL FROM t
), a AS (
    INSERT INTO runs_artifact (run_id, task_id, key, schema, content, provenance, verification, version, created_at)
    SELECT %(run)s, t.id, %(key)s, %(schema)s::jsonb, %(content)s::jsonb, %(provenance)s::jsonb, 'unverified', 1,
        %(now)s FROM t
), e AS (
    UPDATE runs_span SET ended_at = %(now)s, status = 'ok'
    WHERE id IN (%(span)s, %(task_span)s) AND EXISTS (SELECT 1 FROM t)
), d AS (
    UPDATE runs_task SET pending_deps = pending_deps - 1,
        status = CASE WHEN pending_deps <= 1 THEN '{READY}' ELSE status END,
        ready_at = CASE WHEN pending_deps <= 1 THEN %(now)s ELSE ready_at END
    WHERE id = ANY(%(counted)s) AND status = '{PENDING}' AND EXISTS (SELECT 1 FROM t)
    RETURNING {_READY_COLUMNS}
), v AS ({_PG_VERIFY})
SELECT r.*, (SELECT count(*) FROM t),
    (SELECT coalesce(json_agg(json_build_array({_READY_COLUMNS})), '[]') FROM d),
    (SELECT dependents FROM t)
FROM r
"""


def _postgresql() -> HotSql:
    finished = (("run_usage", USAGE), ("plan_version", 1), ("held_back", 1), ("completed", 1), ("ready", 1),
                ("dependents", 1))  # fmt: skip
    return HotSql(
        claim_fresh=(
            Statement(
                _PG_CLAIM.replace("{context}", context_sql()),
                into=(("task_span", 1), ("span", 1), ("context", CONTEXT_WIDTH)),
                fenced=True,
            ),
        ),
        journal_step=(Statement(_PG_STEP, into=(("run_usage", USAGE), ("task_usage", USAGE)), fenced=True),),
        finish=(Statement(_PG_FINISH, into=finished),),
        count_down=(Statement(_count_down_text(), many="ready"),),
    )


_SPAN_INSERT = f"INSERT INTO runs_span ({_SPAN_COLUMNS}) VALUES "


def _portable() -> HotSql:
    j = jsonb()
    return HotSql(
        claim_fresh=_portable_claim(j),
        journal_step=_portable_step(j),
        finish=_portable_finish(j),
        count_down=(Statement(_count_down_text(), many="ready"),),
    )


def _portable_claim(j: str) -> tuple[Statement, ...]:
    return (
        Statement(
            f"UPDATE runs_task SET status = '{CLAIMED}', attempts = 1, fencing_token = %(token)s, "
            "lease_owner = %(owner)s, lease_expires_at = %(expires)s, heartbeat_at = %(now)s, continuing = false, "
            "started_at = COALESCE(started_at, %(now)s), not_before = NULL "
            "WHERE id = %(task)s AND fencing_token = %(old)s AND status = %(status)s RETURNING id",
            into=(("claimed", 1),),
            fenced=True,
        ),
        Statement(
            _SPAN_INSERT + f"(%(run)s, %(task)s, {_ROOT_SPAN}, 'task', %(task_name)s, 'running', NULL, NULL, NULL, "
            f"%(now)s, NULL, 0, 0, 0, %(task_attrs)s{j}, NULL, NULL) RETURNING id",
            into=(("task_span", 1),),
        ),
        Statement(
            _SPAN_INSERT + "(%(run)s, %(task)s, %(task_span)s, 'attempt', 'attempt 1', 'running', 1, NULL, %(token)s, "
            f"%(now)s, NULL, 0, 0, 0, %(attempt_attrs)s{j}, NULL, NULL) RETURNING id",
            into=(("span", 1),),
        ),
    )


def _portable_step(j: str) -> tuple[Statement, ...]:
    step_span = Statement(
        _SPAN_INSERT + "(%(run)s, %(task)s, %(parent)s, %(kind)s, %(name)s, 'ok', %(attempt)s, %(step)s, %(token)s, "
        f"%(started)s, %(now)s, %(tokens_in)s, %(tokens_out)s, %(cost)s, '{{}}'{j}, %(body)s{j}, %(payload)s)"
    )
    return (
        Statement(
            f"UPDATE runs_task SET {_usage_set()}, heartbeat_at = %(now)s, tokens_reserved = 0, "
            f"cost_reserved_micros = 0 WHERE id = %(task)s AND fencing_token = %(token)s AND status = '{RUNNING}' "
            f"RETURNING {USAGE_COLUMNS}",
            into=(("task_usage", USAGE),),
            fenced=True,
        ),
        Statement(
            f"UPDATE runs_run SET {_usage_set()} WHERE id = %(run)s RETURNING {USAGE_COLUMNS}",
            into=(("run_usage", USAGE),),
        ),
        step_span,
        Statement(_VERIFY.format(ids=any_of("id", "verify")), when="verifying"),
    )


def _portable_finish(j: str) -> tuple[Statement, ...]:
    return (
        # The usage update takes the run's row lock first (lock order: run, then tasks).
        Statement(
            f"UPDATE runs_run SET {_usage_set()} WHERE id = %(run)s RETURNING {USAGE_COLUMNS}, plan_version, held_back",
            into=(("run_usage", USAGE), ("plan_version", 1), ("held_back", 1)),
        ),
        Statement(
            f"UPDATE runs_task SET status = '{COMPLETED}', finished_at = %(now)s, lease_owner = '', "
            f"lease_expires_at = NULL, status_reason = '', {_usage_set()}, tokens_reserved = 0, "
            f"cost_reserved_micros = 0 WHERE id = %(task)s AND fencing_token = %(token)s AND status = '{RUNNING}' "
            "AND EXISTS (SELECT 1 FROM runs_run WHERE id = %(run)s AND status <> 'cancelling') "
            "RETURNING 1, dependents",
            into=(("completed", 1), ("dependents", 1)),
            fenced=True,
        ),
        Statement(
            _SPAN_INSERT + "(%(run)s, %(task)s, %(parent)s, 'model_call', %(model)s, 'ok', %(attempt)s, %(step)s, "
            f"%(token)s, %(started)s, %(now)s, %(tokens_in)s, %(tokens_out)s, %(cost)s, '{{}}'{j}, %(body)s{j}, NULL)"
        ),
        Statement(
            "INSERT INTO runs_artifact (run_id, task_id, key, schema, content, provenance, verification, version, "
            f"created_at) VALUES (%(run)s, %(task)s, %(key)s, %(schema)s{j}, %(content)s{j}, %(provenance)s{j}, "
            "'unverified', 1, %(now)s)"
        ),
        Statement("UPDATE runs_span SET ended_at = %(now)s, status = 'ok' WHERE id IN (%(span)s, %(task_span)s)"),
        Statement(_count_down_text(), many="ready", when="has_dependents"),
        Statement(_VERIFY.format(ids=any_of("id", "verify")), when="verifying"),
    )
