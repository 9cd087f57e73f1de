"""The dashboard's runs list and its bulk actions, from the server's side: filters, keyset pages, a
constant number of queries, who sees what, and bulk actions that act on exactly what was previewed."""

import re
from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone

from dashboard.listing import run_row_html
from policy.models import ApprovalRequest
from runs.models import Run, Task
from runs.selectors.runs_list import PAGE_SIZE
from runs.services import run_start
from tenancy.access import default_project, membership_grant
from tenancy.models import AuditEvent, Project
from tools.models import ToolOperation

ROW = re.compile(r'<tr id="run-row-(\d+)"')
EVIL = "<script>alert('owned')</script>"
OS = ToolOperation.Status


def listed(client, **params) -> list[int]:
    response = client.get(reverse("runs:list"), params)
    assert response.status_code == 200
    return [int(i) for i in ROW.findall(response.content.decode())]


def start(n=1, workflow="deploy-review", **kwargs) -> list[Run]:
    return [run_start(workflow=workflow, **kwargs) for _ in range(n)]


def set_status(runs, status):
    Run.objects.filter(id__in=[r.id for r in runs]).update(status=status)


def bulk(client, **data):
    return client.post(reverse("runs:bulk"), data)


def previewed_ids(response) -> str:
    return re.search(r'name="run_ids" value="([\d,]*)"', response.content.decode()).group(1)


@pytest.fixture
def people(django_user_model, operator):
    """olivia (admin of the default project, via ``operator``), vera (viewer there), otto (admin of
    another project only)."""
    vera = django_user_model.objects.create_user(username="vera", password="viewer-pass-123")
    membership_grant(user=vera, project=default_project(), role="viewer")
    otto = django_user_model.objects.create_user(username="otto", password="outsider-pass-123")
    membership_grant(user=otto, project=Project.objects.create(slug="elsewhere", name="Elsewhere"), role="admin")
    return operator, vera, otto


# --- the list -------------------------------------------------------------------------------------------


def test_anonymous_users_are_sent_to_the_login_page(db, client):
    response = client.get(reverse("runs:list"))
    assert response.status_code == 302 and response["Location"].startswith("/login/")


def test_each_filter_narrows_the_list(demo, people, client, django_user_model):
    olivia, vera, otto = people
    bob = django_user_model.objects.create_user(username="bob", password="bob-pass-123")
    ops = Project.objects.create(slug="ops", name="Ops")
    membership_grant(user=olivia, project=ops, role="operator")
    (old,) = start(goal="Review the Tuesday deploy", started_by=olivia)
    (failed,) = start(workflow="incident-fanout", goal="Incident 42 follow-up", started_by=bob)
    (elsewhere,) = start(goal="Review the ops deploy", started_by=olivia, project=ops)
    set_status([failed], Run.Status.FAILED)
    long_ago = timezone.now() - timedelta(days=400)
    Run.objects.filter(id=old.id).update(created_at=long_ago)
    client.force_login(olivia)
    everything = [elsewhere.id, failed.id, old.id]
    assert listed(client) == everything  # newest first
    assert listed(client, status="failed") == [failed.id]
    assert listed(client, status=["failed", "running"]) == everything
    assert listed(client, workflow="incident-fanout") == [failed.id]
    assert listed(client, project="ops") == [elsewhere.id]
    assert listed(client, starter="bob") == [failed.id]
    day = long_ago.date()
    assert listed(client, since=day.isoformat(), until=day.isoformat()) == [old.id]
    assert listed(client, until=(day + timedelta(days=1)).isoformat()) == [old.id]
    assert listed(client, since=timezone.now().date().isoformat()) == [elsewhere.id, failed.id]
    assert listed(client, q="tuesday") == [old.id]  # the goal, case-insensitive
    assert listed(client, q=str(elsewhere.id)) == [elsewhere.id]  # a run id (and any goal holding it)
    assert listed(client, q=f"#{failed.id}") == [failed.id]
    assert listed(client, q="incident-fan") == [failed.id]  # the workflow's slug
    assert listed(client, status="running", project="default", starter="olivia") == [old.id]


def test_a_row_shows_the_runs_figures_escaped_with_native_bars_and_no_inline_style(demo, people, client):
    olivia, _, _ = people
    (run,) = start(goal=f"Check {EVIL}", started_by=olivia, budget={"max_steps": 10, "max_tokens": 5000})
    Task.objects.filter(run=run, key="inventory").update(status=Task.Status.COMPLETED)
    Run.objects.filter(id=run.id).update(steps_used=4, cost_micros=12_500, max_tokens=None)
    ApprovalRequest.objects.create(run=run, kind="operation", summary="send it")
    client.force_login(olivia)
    page = client.get(reverse("runs:list")).content.decode()
    row = re.search(rf'<tr id="run-row-{run.id}".*?</tr>', page, re.S).group(0)
    assert EVIL not in page and "&lt;script&gt;" in row
    assert f'href="{reverse("runs:detail", args=[run.id])}"' in row
    assert 'class="badge s-running"' in row and ">deploy-review<" in row and ">default<" in row
    assert '<progress max="3" value="1">' in row and "1/3" in row
    assert 'max="10"' in row and 'value="4"' in row and row.count("<meter") == 2  # tokens: no limit
    assert "$0.0125/$1.0000" in row and "no limit" in row and "1 pending" in row and "olivia" in row
    assert ' style="' not in page and not re.search(r"<script(?![^>]*\bsrc=)", page)  # CSP: no inline
    assert 'id="runs-live"' in page and 'id="run-rows"' in page


def test_keyset_pages_return_each_run_exactly_once(demo, people, client):
    olivia, _, _ = people
    runs = start(PAGE_SIZE * 2 + 7, started_by=olivia)
    client.force_login(olivia)
    seen, url = [], reverse("runs:list")
    while url:
        page = client.get(url).content.decode()
        seen += [int(i) for i in ROW.findall(page)]
        if len(seen) == PAGE_SIZE:
            start(1)  # a run started meanwhile belongs to the first page, not to the next ones
        link = re.search(r'<a href="([^"]+)" hx-get="([^"]+)" hx-target="#run-rows" hx-swap="beforeend">Next', page)
        assert link is None or link.group(1) == link.group(2)
        url = link.group(1).replace("&amp;", "&") if link else None
    assert seen == sorted((r.id for r in runs), reverse=True)


def test_next_page_by_htmx_answers_rows_and_the_pager_out_of_band(demo, people, client):
    olivia, _, _ = people
    runs = start(PAGE_SIZE + 2, started_by=olivia)
    client.force_login(olivia)
    newest = max(r.id for r in runs)
    response = client.get(reverse("runs:list"), {"after": newest}, headers={"HX-Request": "true"})
    body = response.content.decode()
    assert "<html" not in body and "<tbody" not in body
    assert body.index("<tr") < body.index('<nav id="run-pager" class="pager" aria-label="Pages" hx-swap-oob="true">')
    assert len(ROW.findall(body)) == PAGE_SIZE and "Next page" in body
    last = client.get(reverse("runs:list"), {"after": min(r.id for r in runs) + 2}, headers={"HX-Request": "true"})
    assert len(ROW.findall(last.content.decode())) == 2 and "Next page" not in last.content.decode()


def test_invalid_filter_input_is_a_clear_message_and_is_ignored(demo, people, client):
    olivia, _, _ = people
    runs = start(2, started_by=olivia)
    client.force_login(olivia)
    params = {
        "status": ["bogus", "running"],
        "since": "yesterday",
        "until": "2026-13-45",
        "after": "-3",
        "workflow": "no-such-flow",
        "project": "../etc",
        "q": "x" * 500,
        "starter": "y" * 200,
    }
    response = client.get(reverse("runs:list"), params)
    page = response.content.decode()
    assert response.status_code == 200
    for text in (
        "“bogus” is not a run status",
        "“yesterday” is not a date",
        "“2026-13-45” is not a date",
        "not a page position",
        "There is no workflow “no-such-flow”",
        "There is no project",
        "search text was cut",
        "at most 150 characters",
    ):
        assert text in page
    assert listed(client, status="bogus", since="2026-02-30", after="x") == sorted((r.id for r in runs), reverse=True)
    reversed_range = client.get(reverse("runs:list"), {"since": "2026-03-01", "until": "2026-02-01"})
    assert "is after “created until”" in reversed_range.content.decode()


def test_the_number_of_queries_does_not_grow_with_the_number_of_runs(demo, people, client, django_assert_num_queries):
    olivia, _, _ = people
    client.force_login(olivia)

    def make(n):
        for run in start(n, started_by=olivia):
            ApprovalRequest.objects.create(run=run, kind="operation", summary="x")

    make(5)
    with CaptureQueriesContext(connection) as five:
        assert len(listed(client)) == 5
    make(55)
    with django_assert_num_queries(len(five)):
        assert len(listed(client)) == PAGE_SIZE
    with django_assert_num_queries(len(five)):  # filtered, too
        assert len(listed(client, status="running", workflow="deploy-review", starter="olivia")) == PAGE_SIZE
    # A search reads the workflows it names first (one query), so that the planner can estimate the runs'
    # query (runs/selectors/runs_list.py: _of_workflows_named).
    with django_assert_num_queries(len(five) + 1):
        assert len(listed(client, status="running", workflow="deploy-review", starter="olivia", q="a")) == PAGE_SIZE


def test_an_outsider_sees_none_of_a_projects_runs(demo, people, client):
    olivia, _, otto = people
    start(3, started_by=olivia)
    client.force_login(otto)
    assert listed(client) == []
    page = client.get(reverse("runs:list"), {"project": "default"}).content.decode()
    assert "There is no project “default”" in page and "run-row-" not in page


def test_run_row_html_renders_one_annotated_row_without_a_request(demo, people, django_assert_num_queries):
    olivia, _, _ = people
    (run,) = start(goal=f"Row {EVIL}", started_by=olivia)
    with django_assert_num_queries(1):
        project_id, html = run_row_html(run.id)
    assert project_id == run.project_id
    assert html.startswith(f'<tr id="run-row-{run.id}"') and "&lt;script&gt;" in html and EVIL not in html
    assert f'name="ids" value="{run.id}" form="bulk-form"' in html and '<progress max="3" value="0">' in html


# --- bulk actions ------------------------------------------------------------------------------------------


def test_get_on_bulk_is_405(db, people, client):
    client.force_login(people[0])
    assert client.get(reverse("runs:bulk")).status_code == 405


def test_bulk_posts_need_the_csrf_token(demo, people):
    from django.test import Client

    client = Client(enforce_csrf_checks=True)
    client.force_login(people[0])
    (run,) = start()
    response = client.post(reverse("runs:bulk"), {"action": "cancel", "confirm": "1", "run_ids": run.id, "reason": "x"})
    assert response.status_code == 403 and Run.objects.get(id=run.id).status == Run.Status.RUNNING


def test_an_operators_bulk_cancel_acts_on_exactly_the_previewed_runs(demo, people, client):
    olivia, _, _ = people
    targets = start(3, started_by=olivia)
    (other_workflow,) = start(workflow="incident-fanout")
    (completed,) = start()
    set_status([completed], Run.Status.COMPLETED)
    ApprovalRequest.objects.create(run=targets[0], kind="operation", summary="waiting")
    client.force_login(olivia)

    preview = bulk(client, action="cancel", scope="filter", workflow="deploy-review", status=["running", "completed"])
    page = preview.content.decode()
    assert preview.status_code == 200
    assert "<strong>3</strong> running runs will be cancelled" in page and "1 completed run skipped" in page
    assert "<strong>1</strong> pending approval requests withdrawn" in page
    assert "<strong>9</strong> tasks stopped" in page  # three tasks each, none finished
    ids = previewed_ids(preview)
    assert sorted(map(int, ids.split(","))) == sorted(r.id for r in targets)
    assert Run.objects.filter(status=Run.Status.RUNNING).count() == 4  # a preview changes nothing

    (newcomer,) = start()  # matches the filter, but was not previewed
    assert bulk(client, action="cancel", confirm="1", run_ids=ids, reason=" ").status_code == 400  # no reason
    assert not Run.objects.filter(status=Run.Status.CANCELLED).exists()

    result = bulk(client, action="cancel", confirm="1", run_ids=ids, reason="wrong deploy window")
    assert result.status_code == 200 and "3 done, 0 skipped, 0 failed" in result.content.decode()
    assert set(Run.objects.filter(status=Run.Status.CANCELLED).values_list("id", flat=True)) == {r.id for r in targets}
    for untouched in (newcomer, other_workflow):
        assert Run.objects.get(id=untouched.id).status == Run.Status.RUNNING
    assert Run.objects.get(id=completed.id).status == Run.Status.COMPLETED
    assert ApprovalRequest.objects.get(run=targets[0]).status == ApprovalRequest.Status.WITHDRAWN
    events = AuditEvent.objects.filter(action="run_cancel", outcome="done")
    assert sorted(events.values_list("run_id", flat=True)) == sorted(r.id for r in targets)
    assert all(e.detail == {"reason": "wrong deploy window", "bulk": True} for e in events)
    assert {e.actor_label for e in events} == {"olivia"} and {e.via for e in events} == {"page"}


def test_a_viewers_bulk_cancel_is_refused_changes_nothing_and_is_audited(demo, people, client):
    _, vera, _ = people
    runs = start(2)
    client.force_login(vera)
    preview = bulk(client, action="cancel", scope="ticked", ids=[r.id for r in runs])
    assert "may not operate runs: they will be refused" in preview.content.decode()
    result = bulk(client, action="cancel", confirm="1", run_ids=previewed_ids(preview), reason="tidy up")
    page = result.content.decode()
    assert "0 done, 2 skipped, 0 failed" in page and "(viewer) may not operate" in page
    assert set(Run.objects.values_list("status", flat=True)) == {Run.Status.RUNNING}
    denied = AuditEvent.objects.filter(action="denied:operate", outcome="denied", actor_label="vera")
    assert sorted(denied.values_list("target", flat=True)) == sorted(f"run {r.id}" for r in runs)
    assert not AuditEvent.objects.filter(action="run_cancel").exists()


def test_an_outsider_cannot_preview_or_act_on_another_projects_runs(demo, people, client):
    _, _, otto = people
    runs = start(2)
    client.force_login(otto)
    preview = bulk(client, action="cancel", scope="ticked", ids=[r.id for r in runs])
    assert preview.status_code == 400 and "no run is selected" in preview.content.decode()
    forged = bulk(client, action="cancel", confirm="1", run_ids=",".join(str(r.id) for r in runs), reason="x")
    assert "does not exist" in forged.content.decode() and "0 done, 2 skipped" in forged.content.decode()
    assert set(Run.objects.values_list("status", flat=True)) == {Run.Status.RUNNING}


def test_bulk_retry_retries_each_failed_task_and_resumes_the_run(demo, people, client):
    olivia, _, _ = people
    stuck, healthy = start(2)
    set_status([stuck], Run.Status.NEEDS_ATTENTION)
    Task.objects.filter(run=stuck, key="risk").update(status=Task.Status.FAILED, attempts=3, failure_class="transient")
    client.force_login(olivia)
    preview = bulk(client, action="retry", scope="ticked", ids=[stuck.id, healthy.id])
    page = preview.content.decode()
    assert "<strong>1</strong> needs attention run will be retried" in page
    assert "1 running run skipped: no failed task" in page
    assert "<strong>1</strong> failed tasks retried" in page
    result = bulk(client, action="retry", confirm="1", run_ids=previewed_ids(preview), reason="flaky model")
    assert "1 done" in result.content.decode() and "1 failed task retried" in result.content.decode()
    assert Task.objects.get(run=stuck, key="risk").status == Task.Status.READY
    assert Run.objects.get(id=stuck.id).status == Run.Status.RUNNING
    assert AuditEvent.objects.filter(action="task_retry", run_id=stuck.id, detail__bulk=True).count() == 1


def _committed(run, n, tool, reversibility, status=OS.COMMITTED, undo=None, tool_class="idempotent_write"):
    for i in range(n):
        ToolOperation.objects.create(
            gate="allow",
            run=run,
            tool=tool,
            idempotency_key=f"test:{run.id}:{tool}:{status}:{i}",
            arguments_hash="0" * 64,
            arguments={"customer_id": f"c{i}"},
            tool_class=tool_class,
            reversibility=reversibility,
            status=status,
            compensation=undo,
            committed_at=timezone.now() - timedelta(minutes=i),
            result={"ok": True},
        )


def test_the_compensate_preview_counts_the_effects_to_undo_and_to_correct(demo, people, client):
    olivia, _, _ = people
    failed, needs_attention, running = start(3)
    set_status([failed], Run.Status.FAILED)
    set_status([needs_attention], Run.Status.NEEDS_ATTENTION)
    Task.objects.filter(run__in=[failed, needs_attention]).update(status=Task.Status.CANCELLED)
    close = {"tool": "tickets.close", "arguments": {"ticket_id": "t1", "reason": "rolled back"}}
    correct = {"tool": "email.send", "arguments": {"to": "a@x.example", "subject": "Correction", "body": "b"}}
    _committed(failed, 2, "tickets.create", "reversible", undo=close)
    _committed(failed, 1, "email.send", "irreversible", undo=correct, tool_class="non_idempotent_write")
    _committed(failed, 1, "tickets.create", "reversible", status=OS.COMPENSATED, undo=close)  # already undone
    _committed(failed, 1, "crm.read", "", tool_class="read_only")  # a read changes nothing
    _committed(needs_attention, 1, "tickets.create", "reversible", undo=close)
    _committed(needs_attention, 2, "email.send", "irreversible", undo=correct, tool_class="non_idempotent_write")
    _committed(running, 1, "tickets.create", "reversible", undo=close)
    client.force_login(olivia)

    preview = bulk(client, action="compensate", scope="filter")
    page = preview.content.decode()
    assert "<strong>1</strong> failed run will be compensated" in page
    assert "<strong>1</strong> needs attention run will be compensated" in page
    assert "1 running run skipped: only a run that needs attention, failed or was cancelled" in page
    assert "<strong>3</strong> committed effects undone" in page
    assert "<strong>3</strong> irreversible effects to correct (each correction waits for a reviewer)" in page
    result = bulk(client, action="compensate", confirm="1", run_ids=previewed_ids(preview), reason="bad incident")
    assert "2 done" in result.content.decode()
    assert set(Run.objects.filter(id__in=[failed.id, needs_attention.id]).values_list("status", flat=True)) == {
        Run.Status.COMPENSATING
    }
    assert Run.objects.get(id=running.id).status == Run.Status.RUNNING
    assert AuditEvent.objects.filter(action="run_compensate", detail__reason="bad incident").count() == 2


def test_a_bulk_action_over_500_runs_asks_to_narrow_the_filter(demo, people, client):
    olivia, _, _ = people
    (run,) = start()
    fields = {f.attname: getattr(run, f.attname) for f in Run._meta.concrete_fields if f.attname != "id"}
    Run.objects.bulk_create([Run(**fields) for _ in range(500)])
    client.force_login(olivia)
    response = bulk(client, action="cancel", scope="filter", status="running")
    page = response.content.decode()
    assert response.status_code == 400 and "more than 500 runs match this filter; narrow it" in page
    assert "run_ids" not in page
    assert bulk(client, action="cancel", scope="filter", status="bogus").status_code == 400  # never widened


@pytest.mark.services
def test_a_search_of_goals_can_walk_a_trigram_index_on_postgresql(demo):
    """At a million runs a rare phrase was 1.3 s of reading every goal (docs/benchmarks.md, P8): on
    PostgreSQL with pg_trgm the list's case-insensitive match of goals is served by a trigram index."""
    from django.db import transaction

    from runs.selectors.runs_list import RunFilters, runs_filtered

    with connection.cursor() as cursor:
        cursor.execute("SELECT 1 FROM pg_available_extensions WHERE name = 'pg_trgm'")
        if cursor.fetchone() is None:
            pytest.skip("this PostgreSQL has no pg_trgm (postgresql-contrib): the search stays unindexed")
        cursor.execute("SELECT indexdef FROM pg_indexes WHERE indexname = 'runs_run_goal_trgm'")
        assert "gin_trgm_ops" in cursor.fetchone()[0]
    runs = start(3)
    Run.objects.filter(id=runs[1].id).update(goal="Audit the Quarterly Kraken ledger")
    found = runs_filtered(visible=None, filters=RunFilters(q="quarterly kraken"))

    with transaction.atomic(), connection.cursor() as cursor:
        # A test's table is too small for the planner to prefer any index: forbid the other ways so that the
        # plan shows whether this one can serve the match at all.
        cursor.execute("SET LOCAL enable_seqscan = off")
        cursor.execute("SET LOCAL enable_indexscan = off")
        plan = found.explain()
    assert "runs_run_goal_trgm" in plan, plan
    assert list(found.values_list("id", flat=True)) == [runs[1].id]
