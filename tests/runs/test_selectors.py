"""The engine's selectors (runs/selectors/): what each reads, and how many queries it costs. The counts
are in each case's id and hold in both modes; a selector that needs one more query breaks its case here
before it slows a page.

On PostgreSQL the hand-written statements (core.sql) go through a cursor of their own, which Django's
query capture does not see: ``statements`` counts those too, so one count holds in both modes."""

from contextlib import contextmanager
from datetime import timedelta

import pytest
from django.db import connection
from django.db.models import Q
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from core import sql as core_sql
from policy.models import ApprovalRequest
from runs.models import Artifact, BlackboardEntry, Run, Span, Task
from runs.selectors import breakers_parked, run_get, run_workflow_settings, runs_list
from runs.selectors import run_page as sel
from runs.selectors.breakers import breakers_visible
from runs.selectors.trace import orphan_ids, span_rows, task_totals
from runs.selectors.usage import usage_compute
from runs.selectors.workers import workers_visible
from tenancy.access import default_project
from tests.runs.test_run_page import build_run

NOW = timezone.now


@pytest.fixture
def scene(db, operator):
    """A finished run of 12 chained tasks (each with its task, attempt and 4 call spans), two ledger rows
    on the first and the eleventh task, an artifact every fifth task, and one blackboard entry."""
    run = build_run(12, calls=4)
    tasks = list(Task.objects.filter(run=run).order_by("id"))
    BlackboardEntry.objects.create(run=run, key="finding", version=1, kind="number", value=5, author_task=tasks[0])
    leaf = Span.objects.filter(run=run, kind=Span.Kind.TOOL_CALL).order_by("id").first()
    return {"run": Run.objects.select_related("workflow").get(id=run.id), "tasks": tasks, "leaf": leaf}


def _cases():
    """(id with its query count, count, call) of every selector of runs/selectors/run_page.py and trace.py."""
    ids = lambda s: [t.id for t in s["tasks"]]  # noqa: E731
    return [
        ("run_for_page-1", 1, lambda s: sel.run_for_page(s["run"].id)),
        ("run_tasks-1", 1, lambda s: list(sel.run_tasks(s["run"].id, ids=ids(s)[:3]))),
        ("run_task_times-1", 1, lambda s: sel.run_task_times(s["run"].id)),
        ("run_task_ids_page-1", 1, lambda s: sel.run_task_ids_page(s["run"].id, after=0, count=5)),
        ("run_tasks_after-1", 1, lambda s: sel.run_tasks_after(s["run"].id, ids(s)[4])),
        ("run_failed_tasks-1", 1, lambda s: sel.run_failed_tasks(s["run"])),
        ("run_running_task_keys-1", 1, lambda s: sel.run_running_task_keys(s["run"].id)),
        ("run_attribution-1", 1, lambda s: sel.run_attribution(s["run"].id)),
        ("run_summary-1", 1, lambda s: sel.run_summary(s["run"].id, NOW())),
        ("run_operations-1", 1, lambda s: sel.run_operations(s["run"].id)),
        ("run_ledger-2", 2, lambda s: sel.run_ledger(s["run"].id, shown=300)),
        ("run_ledger_of_a_large_run-3", 3, lambda s: sel.run_ledger(s["run"].id, shown=2)),
        ("run_step_flags-1", 1, lambda s: sel.run_step_flags(s["run"].id, ids(s))),
        ("run_step_flags_of_no_task-0", 0, lambda s: sel.run_step_flags(s["run"].id, [])),
        ("run_operation_statuses-1", 1, lambda s: sel.run_operation_statuses(s["run"].id)),
        ("run_page_spans_whole-1", 1, lambda s: sel.run_page_spans(s["run"], first=None, whole=True)),
        ("run_page_spans_containers-1", 1, lambda s: sel.run_page_spans(s["run"], first=ids(s)[:5], whole=False)),
        ("run_container_spans-1", 1, lambda s: sel.run_container_spans(s["run"].id, ids(s)[:5])),
        ("span_row-1", 1, lambda s: sel.span_row(s["run"].id, s["leaf"].id)),
        ("span_with_payload-1", 1, lambda s: sel.span_with_payload(s["run"].id, s["leaf"].id)),
        ("artifact_of_run-1", 1, lambda s: sel.artifact_of_run(s["run"].id, 0)),
        ("run_artifacts-2", 2, lambda s: sel.run_artifacts(s["run"].id, shown=100)),
        ("run_artifacts_after-1", 1, lambda s: sel.run_artifacts_after(s["run"].id, 0)),
        ("run_blackboard-1", 1, lambda s: sel.run_blackboard(s["run"].id, shown=100)),
        ("run_blackboard_of_a_large_run-2", 2, lambda s: sel.run_blackboard(s["run"].id, shown=1)),
        ("run_for_push-1", 1, lambda s: sel.run_for_push(s["run"].id)),
        ("run_spans_moving-1", 1, lambda s: sel.run_spans_moving(s["run"].id)),
        ("run_spans_changed-1", 1, lambda s: sel.run_spans_changed(s["run"].id, last=10**9, since=0, was_open=[])),
        # a tool call, its attempt, its task and the run: one query per level
        ("spans_with_ancestors-4", 4, lambda s: sel.spans_with_ancestors(s["run"].id, [s["leaf"].id])),
        ("span_sums-1", 1, lambda s: sel.span_sums(s["run"].id, column="task_id", task_ids=ids(s), ids=ids(s))),
        ("span_subtree_sums-1", 1, lambda s: sel.span_subtree_sums(s["run"].id, [s["leaf"].parent_id])),
        ("run_task_rows-1", 1, lambda s: list(sel.run_task_rows(s["run"].id))),
        ("run_artifact_rows-1", 1, lambda s: list(sel.run_artifact_rows(s["run"].id))),
        ("span_rows-1", 1, lambda s: span_rows(s["run"].id)),
        ("orphan_ids_of_a_run_of_warden_s_own_workers-0", 0, lambda s: orphan_ids(s["run"])),
        ("task_totals-1", 1, lambda s: task_totals(s["run"].id, ids(s)[:5])),
        ("run_get-2", 2, lambda s: run_get(run_id=s["run"].id)),
        ("run_workflow_settings_of_a_run_older_than_versions-2", 2, lambda s: run_workflow_settings(s["run"].id)),
        ("breakers_parked-1", 1, lambda s: breakers_parked(project_ids=[s["run"].project_id])),
        # the runs list: the page with each row's figures in one statement; the form's two choices. A
        # search (these filters hold one) first reads the workflows it names: the planner can then estimate
        # the runs' statement (runs/selectors/runs_list.py: _of_workflows_named)
        (
            "runs_for_list-2",
            2,
            lambda s: list(runs_list.runs_for_list(visible=None, filters=_filters(), pending_approvals=_pending())),
        ),
        (
            "runs_filtered-2",
            2,
            lambda s: list(runs_list.runs_filtered(visible=[s["run"].project_id], filters=_filters())),
        ),
        ("run_row-1", 1, lambda s: runs_list.run_row(s["run"].id, pending_approvals=_pending())),
        ("filter_choices-2", 2, lambda s: runs_list.filter_choices(visible=[s["run"].project_id])),
    ]


def _filters():
    return runs_list.RunFilters(q="Scale", statuses=[Run.Status.COMPLETED])


def _pending():
    return ApprovalRequest.objects.filter(status=ApprovalRequest.Status.PENDING, parent=None)


CASES = _cases()


@contextmanager
def statements(expected: int, monkeypatch):
    """Assert the block runs ``expected`` statements: the ORM's and core.sql's alike."""
    raw = []
    if connection.vendor == "postgresql":
        run = core_sql._run
        monkeypatch.setattr(core_sql, "_run", lambda sql, params, fetch: raw.append(sql) or run(sql, params, fetch))
    with CaptureQueriesContext(connection) as orm:
        yield
    done = [q["sql"] for q in orm.captured_queries] + raw
    assert len(done) == expected, f"expected {expected} statements, {len(done)} ran: {done}"


@pytest.mark.parametrize(("count", "call"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_each_run_selector_takes_its_fixed_number_of_queries(scene, count, call, monkeypatch):
    with statements(count, monkeypatch):
        call(scene)


def test_the_run_page_reads_return_what_the_run_holds(scene):
    run, tasks = scene["run"], scene["tasks"]
    summary = sel.run_summary(run.id, NOW())
    assert (summary["tasks"], summary["done"], summary["pending"]) == (12, 12, 0)
    assert summary["spans"] == Span.objects.filter(run=run).count()
    ops, total = sel.run_ledger(run.id, shown=3)
    assert total == 4 and [op.id for op in ops] == sorted(op.id for op in ops) and len(ops) == 3
    artifacts, count = sel.run_artifacts(run.id, shown=2)
    assert count == Artifact.objects.filter(run=run).count() == 3
    assert [a.id for a in artifacts] == sorted(a.id for a in artifacts)[-2:]  # the newest two, oldest first
    assert sel.run_task_ids_page(run.id, after=tasks[9].id, count=5) == [tasks[10].id, tasks[11].id]
    assert sum(t[1] for t in sel.run_attribution(run.id)) == 12
    assert set(sel.spans_with_ancestors(run.id, [scene["leaf"].id])) == {
        scene["leaf"].id,
        scene["leaf"].parent_id,
        Span.objects.get(id=scene["leaf"].parent_id).parent_id,
        Span.objects.get(run=run, kind=Span.Kind.RUN).id,
    }


def test_the_workers_read_takes_four_queries_for_an_operator(db, operator, django_assert_num_queries):
    """Whether they operate anywhere, the projects they view, then the processes and their running tasks."""
    with django_assert_num_queries(4):
        workers_visible(operator)


def test_the_breakers_read_takes_two_queries_when_nothing_is_open(db, operator, django_assert_num_queries):
    """The person's projects and the parked tasks (no project's slug needed: nothing to show)."""
    with django_assert_num_queries(2):
        assert breakers_visible(operator) == []


def test_the_usage_read_takes_one_query(scene, django_assert_num_queries):
    since, project = NOW() - timedelta(days=2), default_project().id
    with django_assert_num_queries(1):
        usage = usage_compute(runs_q=Q(run__project_id=project), since=since, today=timezone.localdate())
    assert usage.periods
