"""The run page's reads: its header's figures, tasks, ledger rows, spans, artifacts and blackboard, and what
a live push reads of what changed. Plain rows and model instances; the page draws them
(dashboard/views/run_page.py, dashboard/trace.py).

A fixed handful of queries whatever the run's size (spans as light rows, payloads on demand); the push's
reads are hand-written statements, as a push runs for every change of a watched run and the ORM's
compilation cost more than the queries themselves. Each function says how many queries it costs
(tests/runs/test_selectors_run_page.py pins them). Who may read the run is the caller's question
(tenancy.access), asked before.
"""

from dataclasses import dataclass
from types import SimpleNamespace

from django.db import connection
from django.db.models import Q, QuerySet

from runs.models import Artifact, BlackboardEntry, Run, Span, Task
from runs.retention import stored_bytes_sql
from runs.services import sql
from tools.models import ToolOperation

from .trace import CONTAINERS, SPAN_FIELDS, span_rows

TASK_FIELDS = ("id", "run_id", "key", "status", "depends_on", "agent__name", "tokens_used", "cost_micros")
OP_FIELDS = (
    "id",
    "run_id",
    "gate",
    "verdict",
    "task_id",
    "task__key",
    "step",
    "kind",
    "compensates_id",
    "tool",
    "idempotency_key",
    "status",
    "status_reason",
    "tool_class",
    "reversibility",
    "compensation",
    "approval_id",
    "approval__status",
)


def run_for_page(run_id: int) -> Run | None:
    """The run with its workflow, project and starter (the header's names). One query."""
    return Run.objects.select_related("workflow", "project", "started_by").filter(id=run_id).first()


# --- tasks -------------------------------------------------------------------------------------------------
def run_tasks(run_id: int, ids=None) -> QuerySet[Task]:
    """What the header, timeline and attribution read of each task (of ``ids``, or all), and nothing more
    (a run may have a thousand). One query when evaluated."""
    rows = Task.objects.filter(run_id=run_id).select_related("agent").order_by("id")
    if ids is not None:
        rows = rows.filter(id__in=ids)
    return rows.only(*TASK_FIELDS, "started_at", "finished_at")


_EPOCH = {
    "postgresql": "EXTRACT(EPOCH FROM {})::float8",
    "sqlite": "(julianday({}) - 2440587.5) * 86400.0",
}


def run_task_times(run_id: int) -> list[SimpleNamespace]:
    """Light rows of every task in plan order (id, key, depends_on, started_at and finished_at as epoch
    seconds), for the critical path of a run of any size. One query."""
    # Times as epoch seconds: 10,000 rows parse in a tenth of the time datetimes take.
    epoch = _EPOCH[connection.vendor]
    return [
        SimpleNamespace(id=i, key=key, depends_on=sql.loads(deps) if isinstance(deps, str) else deps,
                        started_at=started, finished_at=finished)
        for i, key, deps, started, finished in sql.fetchall(
            f"SELECT id, key, depends_on, {epoch.format('started_at')}, {epoch.format('finished_at')} "
            "FROM runs_task WHERE run_id = %s ORDER BY id",
            [run_id],
        )
    ]  # fmt: skip


def run_task_ids_page(run_id: int, *, after: int, count: int) -> list[int]:
    """A large run's next ``count`` tasks after task ``after``, in the order they were planned. One query."""
    rows = Task.objects.filter(run_id=run_id, id__gt=after).order_by("id").values_list("id", flat=True)
    return list(rows[:count])


def run_tasks_after(run_id: int, after: int) -> int:
    """How many tasks were planned after task ``after``. One query."""
    return Task.objects.filter(run_id=run_id, id__gt=after).count()


def run_failed_tasks(run: Run) -> list[dict]:
    """The tasks of the run's current plan that failed, as {id, key}. One query."""
    return [
        {"id": i, "key": key}
        for i, key in sql.fetchall(
            "SELECT id, key FROM runs_task WHERE run_id = %s AND status = 'failed' AND plan_version = %s ORDER BY id",
            [run.id, run.plan_version],
        )
    ]


def run_running_task_keys(run_id: int) -> list[str]:
    """The keys of the run's tasks still running. One query."""
    return list(Task.objects.filter(run_id=run_id, status=Task.Status.RUNNING).values_list("key", flat=True))


def run_attribution(run_id: int) -> list[tuple[str, int, int, int]]:
    """(agent name, tasks, tokens, cost in micros) of each agent that worked on the run, costliest first.
    One query."""
    return [
        (agent, tasks, tokens or 0, cost or 0)
        for agent, tasks, tokens, cost in sql.fetchall(
            "SELECT a.name, COUNT(t.id), SUM(t.tokens_used), SUM(t.cost_micros) FROM runs_task t "
            "JOIN agents_agent a ON a.id = t.agent_id WHERE t.run_id = %s GROUP BY a.name ORDER BY 4 DESC, 1",
            [run_id],
        )
    ]


# --- the header's figures ----------------------------------------------------------------------------------
# Requests as the reviewer queue counts them (a bundle of five e-mails is one request). The one read of the
# approval requests' table: it moves with that table's owner.
PENDING_APPROVALS_SQL = """(SELECT COUNT(*) AS pending FROM approvals_approvalrequest
     WHERE run_id = %(run)s AND status = 'pending' AND parent_id IS NULL) a"""

# One pass over each table: a run of 10,000 spans is read once per page or push, not once per figure.
_SUMMARY = """
SELECT t.tasks, t.done, t.busy, o.ambiguous, a.pending, s.out_tokens, s.biggest_in, s.cost, s.in_tokens,
       s.spans, s.last_span, ar.last_artifact, s.errors,
       COALESCE(s.body_bytes, 0) + COALESCE(s.payload_bytes, 0) + COALESCE(ar.artifact_bytes, 0) AS stored
FROM
  (SELECT SUM(CASE WHEN status = 'superseded' OR (status = 'failed' AND plan_version < (
                SELECT plan_version FROM runs_run WHERE id = %(run)s)) THEN 0 ELSE 1 END) AS tasks,
          SUM(CASE WHEN status = 'completed' THEN 1 ELSE 0 END) AS done,
          SUM(CASE WHEN started_at IS NOT NULL THEN {busy} END) AS busy
     FROM runs_task WHERE run_id = %(run)s) t,
  (SELECT COUNT(*) AS ambiguous FROM tools_tooloperation WHERE run_id = %(run)s AND status = 'ambiguous') o,
  {pending},
  (SELECT COUNT(*) AS spans, MAX(id) AS last_span, SUM(CASE WHEN status = 'error' THEN 1 ELSE 0 END) AS errors,
          SUM(CASE WHEN kind = 'model_call' THEN tokens_out ELSE 0 END) AS out_tokens,
          MAX(CASE WHEN kind = 'model_call' THEN tokens_in END) AS biggest_in,
          SUM(CASE WHEN kind = 'model_call' THEN cost_micros ELSE 0 END) AS cost,
          SUM(CASE WHEN kind = 'model_call' THEN tokens_in ELSE 0 END) AS in_tokens,
          SUM({body_size}) AS body_bytes,
          SUM(CASE WHEN payload_id IS NOT NULL THEN (
                SELECT {payload_size} FROM runs_payload p WHERE p.id = runs_span.payload_id) END) AS payload_bytes
     FROM runs_span WHERE run_id = %(run)s) s,
  (SELECT MAX(id) AS last_artifact, SUM({artifact_size}) AS artifact_bytes
     FROM runs_artifact WHERE run_id = %(run)s) ar
"""
_BUSY = {  # seconds a task has been at work, in each database's own date arithmetic
    "postgresql": "EXTRACT(EPOCH FROM (COALESCE(finished_at, %(now)s) - started_at))",
    "sqlite": "(julianday(COALESCE(finished_at, %(now)s)) - julianday(started_at)) * 86400.0",
}
SUMMARY_KEYS = ("tasks", "done", "busy", "ambiguous", "pending", "out", "biggest_in", "cost", "tokens_in", "spans")
SUMMARY_KEYS += ("last_span", "last_artifact", "errors", "stored")  # in the order of _SUMMARY's columns


def run_summary(run_id: int, now) -> dict:
    """The header's figures (tasks, done, busy seconds, ambiguous operations, pending approvals, model usage,
    spans, the last span and artifact, failed spans, stored bytes) in one statement: pages and pushes call
    it, and a push must stay cheap. One query."""
    statement = _SUMMARY.format(
        busy=_BUSY[connection.vendor],
        pending=PENDING_APPROVALS_SQL,
        body_size=stored_bytes_sql("body"),
        payload_size=stored_bytes_sql("p.body"),
        artifact_size=stored_bytes_sql("content"),
    )
    row = sql.fetchone(statement, {"run": run_id, "now": now if connection.vendor == "postgresql" else sql.ts(now)})
    return dict(zip(SUMMARY_KEYS, row, strict=True))


# --- the ledger --------------------------------------------------------------------------------------------
def run_operations(run_id: int, ids=None) -> list[ToolOperation]:
    """Ledger rows (of ``ids``, or all) with what the page shows of them: never arguments or results
    (payloads). One query."""
    rows = ToolOperation.objects.filter(run_id=run_id).select_related("approval", "task").only(*OP_FIELDS)
    if ids is not None:
        rows = rows.filter(id__in=ids)
    return list(rows.order_by("id"))


def run_ledger(run_id: int, *, shown: int) -> tuple[list[ToolOperation], int]:
    """The ledger rows the page lists (all, or the newest ``shown`` of a large run) and how many there are.
    Two queries (three for a large run)."""
    total = ToolOperation.objects.filter(run_id=run_id).count()
    if total <= shown:
        return run_operations(run_id), total
    newest = ToolOperation.objects.filter(run_id=run_id).order_by("-id").values_list("id", flat=True)[:shown]
    return run_operations(run_id, ids=list(newest)), total


def run_step_flags(run_id: int, task_ids: list[int]) -> dict[tuple[int, int], set]:
    """(task, step) → {"irreversible", "approval", "refused"}: what the tree marks on a step's row. One
    query (none without tasks)."""
    flags: dict[tuple[int, int], set] = {}
    if task_ids:
        in_tasks, task_params = sql.in_list("task_id", task_ids)
        for task_id, step, reversibility, status in sql.fetchall(
            f"SELECT task_id, step, reversibility, status FROM tools_tooloperation WHERE run_id = %s AND {in_tasks}",
            [run_id, *task_params],
        ):
            mine = flags.setdefault((task_id, step), set())
            if reversibility == "irreversible":
                mine.add("irreversible")
            if status in ("awaiting_approval", "proposed"):
                mine.add("approval")
            if status == "refused":  # the system said no; the model was told
                mine.add("refused")
    return flags


def run_operation_statuses(run_id: int) -> dict[int, str]:
    """Every ledger row's status, by id (a push's watermark). One query."""
    return dict(sql.fetchall("SELECT id, status FROM tools_tooloperation WHERE run_id = %s", [run_id]))


# --- spans -------------------------------------------------------------------------------------------------
def run_page_spans(run: Run, *, first: list[int] | None, whole: bool) -> list[dict]:
    """The spans the page draws: all of them (``whole``: a small or filtered run); of a large one its run,
    task and attempt spans (of the ``first`` tasks only, when it has many). One query."""
    if whole:
        return span_rows(run.id)
    containers = Q(kind__in=CONTAINERS) if first is None else Q(kind__in=CONTAINERS, task_id__in=first)
    spans = Span.objects.filter(run=run).filter(containers | Q(task_id__isnull=True))
    return list(spans.order_by("id").values(*SPAN_FIELDS))


def run_container_spans(run_id: int, task_ids: list[int]) -> list[dict]:
    """The task and attempt spans of ``task_ids`` (a large run's next tasks). One query."""
    rows = Span.objects.filter(run_id=run_id, kind__in=CONTAINERS, task_id__in=task_ids).order_by("id")
    return list(rows.values(*SPAN_FIELDS))


def span_row(run_id: int, span_id: int) -> dict | None:
    """One span of the run as a light row, or None. One query."""
    return Span.objects.filter(run_id=run_id, id=span_id).values(*SPAN_FIELDS).first()


def span_with_payload(run_id: int, span_id: int) -> Span | None:
    """One span of the run with its journaled payload, or None. One query."""
    return Span.objects.filter(run_id=run_id, id=span_id).select_related("payload").first()


def artifact_of_run(run_id: int, artifact_id: int) -> Artifact | None:
    """One artifact of the run, or None. One query."""
    return Artifact.objects.filter(run_id=run_id, id=artifact_id).first()


def run_artifacts(run_id: int, *, shown: int) -> tuple[list[Artifact], int]:
    """The run's newest ``shown`` artifacts, oldest first, and how many it has. Two queries."""
    total = Artifact.objects.filter(run_id=run_id).count()
    newest = list(Artifact.objects.filter(run_id=run_id).select_related("task").order_by("-id")[:shown])
    return newest[::-1], total


def run_artifacts_after(run_id: int, after: int) -> list[Artifact]:
    """The run's artifacts newer than ``after`` (a push). One query."""
    return list(Artifact.objects.filter(run_id=run_id, id__gt=after).select_related("task"))


def run_blackboard(run_id: int, *, shown: int) -> tuple[list[BlackboardEntry], int]:
    """The run's newest ``shown`` blackboard entries, oldest first, and how many it has. One query (two when
    there are ``shown`` or more)."""
    entries = BlackboardEntry.objects.filter(run_id=run_id)
    newest = list(entries.select_related("author_task").order_by("-id")[:shown])
    return newest[::-1], (len(newest) if len(newest) < shown else entries.count())


# --- live pushes -------------------------------------------------------------------------------------------
def run_for_push(run_id: int) -> Run | None:
    """The run and the names its header shows (``run.names``), in one raw statement (no ORM compilation per
    push). One query."""
    found = list(
        Run.objects.raw(
            "SELECT r.*, w.name AS workflow_name, p.slug AS project_slug, u.username AS starter_name "
            "FROM runs_run r JOIN agents_workflow w ON w.id = r.workflow_id "
            "JOIN approvals_project p ON p.id = r.project_id "
            "LEFT JOIN auth_user u ON u.id = r.started_by_id WHERE r.id = %s",
            [run_id],
        )
    )
    if not found:
        return None
    run = found[0]
    run.names = (run.workflow_name, run.project_slug, run.starter_name or "")
    return run


@dataclass(frozen=True)
class SpansMoving:
    open: list[int]  # spans not yet ended
    moved: int  # spans attached to a parent that arrived after them (OTLP ingest)


def run_spans_moving(run_id: int) -> SpansMoving:
    """The run's open spans, and how many hang under a parent newer than themselves. One query."""
    moving = sql.fetchall(
        "SELECT id, ended_at IS NULL FROM runs_span WHERE run_id = %s AND (ended_at IS NULL OR parent_id > id)",
        [run_id],
    )
    open_now = [r[0] for r in moving if r[1]]
    return SpansMoving(open=open_now, moved=len(moving) - len(open_now))


def run_spans_changed(run_id: int, *, last: int, since: int, was_open: list[int]) -> list[dict]:
    """Spans up to ``last`` that are new since ``since`` or were open then, as {id, task_id, kind}. One
    query."""
    in_open, params = sql.in_list("id", was_open or [0])
    return [
        {"id": r[0], "task_id": r[1], "kind": r[2]}
        for r in sql.fetchall(
            f"SELECT id, task_id, kind FROM runs_span WHERE run_id = %s AND id <= %s AND (id > %s OR {in_open})",
            [run_id, last, since, *params],
        )
    ]


def _span_row(values) -> dict:
    row = dict(zip(SPAN_FIELDS, values, strict=True))
    row["started_at"], row["ended_at"] = sql.parse_ts(row["started_at"]), sql.parse_ts(row["ended_at"])
    return row


def spans_with_ancestors(run_id: int, ids: list[int]) -> dict[int, dict]:
    """The spans ``ids`` and their ancestors only, by id (the database sums their subtrees apart): a push
    costs the same for a task of ten steps or of a thousand. One query per level of the tree."""
    rows: dict[int, dict] = {}
    wanted = set(ids)
    while wanted - rows.keys():
        in_ids, id_params = sql.in_list("id", sorted(wanted - rows.keys()))
        fetched = sql.fetchall(
            f"SELECT {', '.join(SPAN_FIELDS)} FROM runs_span WHERE run_id = %s AND {in_ids}", [run_id, *id_params]
        )
        if not fetched:
            break
        for values in fetched:
            row = _span_row(values)
            rows[row["id"]] = row
            if row["parent_id"]:
                wanted.add(row["parent_id"])
    return rows


Sums = tuple[int, int, int, int]  # tokens, cost in micros, spans, failed spans


def span_sums(run_id: int, *, column: str, task_ids: list[int], ids: list[int]) -> dict[int, Sums]:
    """Sums of the run's spans of ``task_ids`` grouped by ``column`` ("task_id", or "parent_id": an
    attempt's children), for the groups ``ids``. One query."""
    assert column in ("task_id", "parent_id")
    in_tasks, params = sql.in_list("task_id", task_ids)
    in_ids, id_params = sql.in_list(column, ids)
    found = sql.fetchall(
        f"SELECT {column}, SUM(tokens_in) + SUM(tokens_out), SUM(cost_micros), COUNT(*), "
        f"SUM(CASE WHEN status = 'error' THEN 1 ELSE 0 END) FROM runs_span "
        f"WHERE run_id = %s AND {in_tasks} AND {in_ids} GROUP BY {column}",
        [run_id, *params, *id_params],
    )
    return {key: (tokens or 0, cost or 0, count, errors or 0) for key, tokens, cost, count, errors in found}


def span_subtree_sums(run_id: int, ids: list[int]) -> dict[int, Sums]:
    """Sums over the whole subtree of each span of ``ids`` (itself included), by the database: an ingested
    OTLP tree is deeper than run, task, attempt, call. One query."""
    in_ids, params = sql.in_list("id", ids)
    found = sql.fetchall(
        "WITH RECURSIVE below(root, id) AS ("
        f"SELECT id, id FROM runs_span WHERE run_id = %s AND {in_ids} "
        "UNION ALL SELECT below.root, s.id FROM runs_span s JOIN below ON s.parent_id = below.id WHERE s.run_id = %s) "
        "SELECT below.root, SUM(s.tokens_in) + SUM(s.tokens_out), SUM(s.cost_micros), COUNT(*), "
        "SUM(CASE WHEN s.status = 'error' THEN 1 ELSE 0 END) FROM below JOIN runs_span s ON s.id = below.id "
        "GROUP BY below.root",
        [run_id, *params, run_id],
    )
    return {root: (tokens or 0, cost or 0, count, errors or 0) for root, tokens, cost, count, errors in found}


# --- the API's sub-resources of a run ----------------------------------------------------------------------
def run_task_rows(run_id: int) -> QuerySet[Task]:
    """Every task of the run, whole, with its agent, in plan order (GET /api/v1/runs/{id}/tasks)."""
    return Task.objects.filter(run_id=run_id).select_related("agent").order_by("id")


def run_artifact_rows(run_id: int) -> QuerySet[Artifact]:
    """Every artifact of the run with its task, oldest first (GET /api/v1/runs/{id}/artifacts)."""
    return Artifact.objects.filter(run_id=run_id).select_related("task").order_by("id")
