"""The run page and its fragments from the server's side: a fixed number of queries whatever the run's
size, what the page shows for a known run, tree search and filters, large payloads kept off the page
and out of pushes, security headers on every dashboard page, and who may see what."""

import html
import json
import re
import time
from datetime import timedelta
from html.parser import HTMLParser

import pytest
from django.core.cache import cache
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone

from agents.demo import load_demo_workflows
from agents.models import Agent, Workflow
from dashboard.views.run_page import PREVIEW_CHARS, run_push
from policy.models import ApprovalRequest
from runs.models import Artifact, Payload, Run, Span, Task
from tenancy.access import default_project, membership_grant
from tenancy.models import Project
from tools.installation import run_key_prefix
from tools.models import ToolOperation

K = Span.Kind
OS = ToolOperation.Status
NODE = re.compile(r'<li id="node-(\d+)"')


# --- building runs fast ---------------------------------------------------------------------------------
def _agents() -> list[Agent]:
    load_demo_workflows()
    return list(Agent.objects.order_by("id")[:3])


def build_run(tasks: int, *, calls: int = 8, project=None, goal: str = "Scale test", **fields) -> Run:
    """A finished run of ``tasks`` chained tasks, each with a task span, an attempt span under it and
    ``calls`` model/tool call spans under that; every tenth task has two ledger rows, every fifth an
    artifact. Rows are bulk-created: the engine's services would take minutes for 10,000 spans."""
    agents = _agents()
    t0 = timezone.now() - timedelta(hours=2)
    per_call = {"tokens_in": 100, "tokens_out": 20, "cost_micros": 180}
    run = Run.objects.create(
        workflow=Workflow.objects.get(slug="incident-fanout"),
        project=project or default_project(),
        goal=goal,
        status=Run.Status.COMPLETED,
        code_version="test",
        started_at=t0,
        finished_at=t0 + timedelta(seconds=tasks + 1),
        steps_used=tasks * calls,
        tokens_used=tasks * calls // 2 * 120,
        cost_micros=tasks * calls // 2 * 180,
        **fields,
    )
    task_rows = Task.objects.bulk_create(
        Task(
            run=run,
            key=f"t-{i}",
            agent=agents[i % len(agents)],
            objective="Do one thing",
            depends_on=[f"t-{i - 1}"] if i else [],
            status=Task.Status.COMPLETED,
            attempts=1,
            steps_used=calls,
            tokens_used=calls // 2 * 120,
            cost_micros=calls // 2 * 180,
            started_at=t0 + timedelta(seconds=i),
            finished_at=t0 + timedelta(seconds=i + 1),
        )
        for i in range(tasks)
    )
    root = Span.objects.create(run=run, kind=K.RUN, name="run incident-fanout", started_at=t0, ended_at=run.finished_at)

    def span(task, parent, kind, name, **extra):
        start = task.started_at if task else t0
        return Span(
            run=run,
            task=task,
            parent_id=parent,
            kind=kind,
            name=name,
            started_at=start,
            ended_at=start + timedelta(seconds=1),
            **extra,
        )

    task_spans = Span.objects.bulk_create(span(t, root.id, K.TASK, f"task {t.key}") for t in task_rows)
    attempts = Span.objects.bulk_create(
        span(t, s.id, K.ATTEMPT, "attempt 1", attempt=1) for t, s in zip(task_rows, task_spans, strict=True)
    )
    call_rows = []
    for t, a in zip(task_rows, attempts, strict=True):
        for step in range(1, calls + 1):
            if step % 2:
                call_rows.append(
                    span(t, a.id, K.MODEL_CALL, "scripted-1", attempt=1, step=step, body={"text": "ok"}, **per_call)
                )
            else:
                call_rows.append(span(t, a.id, K.TOOL_CALL, "crm.read", attempt=1, step=step, body={"name": "x"}))
    Span.objects.bulk_create(call_rows, batch_size=2000)
    ops, artifacts = [], []
    for i, t in enumerate(task_rows):
        if i % 10 == 0:
            ops.append(
                _op(run, t, 2, "crm.update", "idempotent_write", "reversible", compensation={"tool": "crm.restore"})
            )
            ops.append(_op(run, t, 4, "email.send", "non_idempotent_write", "irreversible"))
        if i % 5 == 0:
            artifacts.append(
                Artifact(
                    run=run, task=t, key=t.key, content={"summary": "done"}, provenance={"task": t.key, "attempt": 1}
                )
            )
    ToolOperation.objects.bulk_create(ops)
    Artifact.objects.bulk_create(artifacts)
    return run


def _op(run, task, step, tool, tool_class, reversibility, *, status=OS.COMMITTED, **extra) -> ToolOperation:
    return ToolOperation(
        gate="allow",
        run=run,
        task=task,
        step=step,
        tool=tool,
        idempotency_key=f"{run_key_prefix(run.id)}{task.key if task else 'run'}:{step}:{tool}:{extra.pop('n', 0)}",
        arguments_hash="0" * 64,
        arguments={"customer_id": "c-1"},
        tool_class=tool_class,
        reversibility=reversibility,
        status=status,
        **extra,
    )


def queries(client, url: str, **headers) -> int:
    with CaptureQueriesContext(connection) as captured:
        response = client.get(url, **headers)
    assert response.status_code == 200, (url, response.status_code)
    return len(captured)


# --- people ---------------------------------------------------------------------------------------------
@pytest.fixture
def people(django_user_model, operator):
    """olivia (admin of the default project), vera (viewer there), otto (admin of another project)."""
    vera = django_user_model.objects.create_user(username="vera", password="viewer-pass-123")
    membership_grant(user=vera, project=default_project(), role="viewer")
    otto = django_user_model.objects.create_user(username="otto", password="outsider-pass-123")
    membership_grant(user=otto, project=Project.objects.create(slug="elsewhere", name="Elsewhere"), role="admin")
    return operator, vera, otto


# --- a fixed number of queries ------------------------------------------------------------------------------
def test_run_page_and_fragments_take_the_same_queries_for_1000_tasks_as_for_10(
    db, operator, client, django_assert_num_queries
):
    small = build_run(10)
    started = time.perf_counter()
    big = build_run(1000)
    built = time.perf_counter() - started
    assert Span.objects.filter(run=big).count() == 10_001 and Span.objects.filter(run=small).count() == 101
    client.force_login(operator)

    def urls(run):
        task_span = Span.objects.filter(run=run, kind=K.TASK).order_by("id")[5]
        return {
            "page": reverse("runs:detail", args=[run.id]),
            "live": reverse("runs:live", args=[run.id]),
            "timeline": reverse("runs:timeline", args=[run.id]),
            "children": reverse("runs:span-children", args=[run.id, task_span.id]),
        }

    small_urls, big_urls = urls(small), urls(big)
    client.get(small_urls["page"])  # the first request of a session warms what later ones reuse
    for name, url in small_urls.items():
        expected = queries(client, url)
        with django_assert_num_queries(expected):
            assert client.get(big_urls[name]).status_code == 200
        if name == "children":
            expected = queries(client, url, HTTP_HX_REQUEST="true")
            with django_assert_num_queries(expected):
                client.get(big_urls[name], HTTP_HX_REQUEST="true")

    started = time.perf_counter()
    response = client.get(big_urls["page"])
    elapsed = time.perf_counter() - started
    assert response.status_code == 200
    print(
        f"\nrun page, 1,000 tasks / 10,001 spans: {elapsed * 1000:.0f} ms, {len(response.content) // 1024} kB "
        f"(built in {built:.1f} s)"
    )


def test_runs_list_takes_the_same_queries_for_60_runs_as_for_5(db, operator, client, django_assert_num_queries):
    for _ in range(5):
        build_run(2, calls=2)
    client.force_login(operator)
    client.get(reverse("runs:list"))
    expected = queries(client, reverse("runs:list"))
    for _ in range(55):
        build_run(2, calls=2)
    with django_assert_num_queries(expected):
        response = client.get(reverse("runs:list"))
    assert response.content.decode().count('<tr id="run-row-') == 50  # one page


# --- what the page shows for a known run -------------------------------------------------------------------
@pytest.fixture
def known(db):
    """deploy-review by hand, with exact figures: inventory and risk side by side (risk's first attempt
    fails), then verify; a read, a reversible write, two irreversible e-mails (one awaiting approval)
    and the compensation of the write in the ledger; an artifact per finished task."""
    load_demo_workflows()
    agents = {a.slug: a for a in Agent.objects.all()}
    t0 = timezone.now() - timedelta(minutes=10)
    at = lambda s: t0 + timedelta(seconds=s)  # noqa: E731
    run = Run.objects.create(
        workflow=Workflow.objects.get(slug="deploy-review"),
        project=default_project(),
        goal="Assess the checkout deployment",
        status=Run.Status.WAITING_FOR_APPROVAL,
        code_version="test",
        started_at=at(0),
        max_steps=50,
        max_tokens=20_000,
        max_cost_micros=1_000_000,
        steps_used=9,
        tool_calls_used=4,
        tokens_used=880,
        cost_micros=13_200,
    )

    def task(key, agent, start, end, tokens, cost, **extra):
        return Task.objects.create(
            run=run, key=key, agent=agents[agent], objective=key, status=Task.Status.COMPLETED,
            started_at=at(start), finished_at=at(end), tokens_used=tokens, cost_micros=cost, **{"attempts": 1, **extra},
        )  # fmt: skip

    inventory = task("inventory", "inventory-agent", 0, 2, 300, 4_500)
    risk = task("risk", "risk-agent", 0, 5, 120, 1_800, attempts=2)
    verify = task("verify", "verifier-agent", 5, 7, 460, 6_900, depends_on=["inventory", "risk"])
    verify.status, verify.finished_at = Task.Status.WAITING_FOR_APPROVAL, None
    verify.save(update_fields=["status", "finished_at"])

    def span(kind, name, parent, start, end, task=None, **extra):
        return Span.objects.create(
            run=run, task=task, parent=parent, kind=kind, name=name, started_at=at(start),
            ended_at=None if end is None else at(end), **extra,
        )  # fmt: skip

    def model(parent, start, end, task, step=None, usage=(0, 0, 0), **extra):
        tokens_in, tokens_out, cost = usage
        return span(
            K.MODEL_CALL, "scripted-1", parent, start, end, task, step=step,
            tokens_in=tokens_in, tokens_out=tokens_out, cost_micros=cost, **extra,
        )  # fmt: skip

    s = {"run": span(K.RUN, "run deploy-review", None, 0, None, status=Span.Status.RUNNING)}
    s["inventory"] = span(K.TASK, "task inventory", s["run"], 0, 2, inventory)
    s["inventory/1"] = span(K.ATTEMPT, "attempt 1", s["inventory"], 0, 2, inventory, attempt=1)
    s["inv-m1"] = model(s["inventory/1"], 0, 1, inventory, 1, (100, 20, 1_800))
    s["inv-read"] = span(K.TOOL_CALL, "deployments.read", s["inventory/1"], 1, 1, inventory, step=2)
    s["inv-m2"] = model(s["inventory/1"], 1, 2, inventory, 3, (150, 30, 2_700))
    s["risk"] = span(K.TASK, "task risk", s["run"], 0, 5, risk)
    s["risk/1"] = span(K.ATTEMPT, "attempt 1", s["risk"], 0, 1, risk, attempt=1, status=Span.Status.ERROR)
    s["risk-timeout"] = model(s["risk/1"], 0, 1, risk, status=Span.Status.ERROR)
    s["risk/2"] = span(K.ATTEMPT, "attempt 2", s["risk"], 1, 5, risk, attempt=2)
    s["risk-m1"] = model(s["risk/2"], 1, 2, risk, 1, (80, 40, 1_800))
    s["risk-write"] = span(K.TOOL_CALL, "crm.update", s["risk/2"], 2, 5, risk, step=2)
    s["verify"] = span(K.TASK, "task verify", s["run"], 5, None, verify)
    s["verify/1"] = span(K.ATTEMPT, "attempt 1", s["verify"], 5, None, verify, attempt=1)
    s["verify-m1"] = model(s["verify/1"], 5, 6, verify, 1, (200, 60, 3_900))
    s["verify-mail"] = span(K.TOOL_CALL, "email.send", s["verify/1"], 6, 6, verify, step=2)
    s["verify-m2"] = model(s["verify/1"], 6, 7, verify, 3, (150, 50, 3_000))
    s["verify-mail-2"] = span(K.TOOL_CALL, "email.send", s["verify/1"], 7, 7, verify, step=4)
    s["verify-wait"] = span(K.APPROVAL_WAIT, "waiting for a reviewer", s["verify/1"], 7, None, verify)

    ops = {
        "read": _op(run, inventory, 2, "deployments.read", "read_only", ""),
        "write": _op(
            run, risk, 2, "crm.update", "idempotent_write", "reversible",
            compensation={"kind": "compensation", "by": "restore_record", "tool": "crm.restore"},
        ),
        "mail": _op(
            run, verify, 2, "email.send", "non_idempotent_write", "irreversible",
            compensation={"kind": "correction", "by": "correction_email", "tool": "email.send"},
        ),
        "mail-2": _op(
            run, verify, 4, "email.send", "non_idempotent_write", "irreversible", status=OS.AWAITING_APPROVAL,
        ),
    }  # fmt: skip
    ops["mail-2"].approval = ApprovalRequest.objects.create(
        run=run, task=verify, kind="operation", arguments_hash="0" * 64, summary="send the second e-mail"
    )
    for op in ops.values():
        op.save()
    ops["undo"] = _op(
        run, None, None, "crm.restore", "idempotent_write", "reversible", kind="compensation",
        compensates=ops["write"], status=OS.COMPENSATED, n=1,
    )  # fmt: skip
    ops["undo"].save()
    for t, content in ((inventory, {"summary": "Deployment checkout@v43"}), (risk, {"summary": "Low risk"})):
        Artifact.objects.create(
            run=run, task=t, key=t.key, content=content,
            provenance={"task": t.key, "attempt": t.attempts, "fencing_token": 7, "model": "scripted-1", "inputs": []},
        )  # fmt: skip
    return run, s, ops


def row(page: str, span: Span) -> str:
    """A node's summary line, as text."""
    match = re.search(rf'<summary id="row-{span.id}".*?</summary>', page, re.S)
    assert match, f"no row for span {span.id} ({span.name})"
    return html.unescape(re.sub(r"<[^>]+>", "", match.group(0)))


def text(page: str) -> str:
    return re.sub(r"\s+", " ", html.unescape(re.sub(r"<[^>]+>", " ", page)))


def test_the_page_shows_tree_ledger_budgets_attribution_artifacts_and_timeline(known, operator, client):
    run, s, ops = known
    client.force_login(operator)
    page = client.get(reverse("runs:detail", args=[run.id])).content.decode()

    # The tree: run → task → attempt → calls, with each call's tokens and cost and Σ of every subtree.
    assert NODE.findall(page) == [str(span.id) for span in s.values()]  # in order, each once
    assert 'data-parent="kids-{}"'.format(s["inventory/1"].id) in page
    assert "120 tok $0.0018" in row(page, s["inv-m1"])
    assert "0 tok $0.0000" in row(page, s["inv-read"])
    assert "step 2" in row(page, s["inv-read"])
    assert "180 tok $0.0027" in row(page, s["inv-m2"])
    assert "Σ 300 tok · $0.0045 · 4 spans" in row(page, s["inventory/1"])
    assert "Σ 300 tok · $0.0045 · 5 spans" in row(page, s["inventory"])
    assert "Σ 120 tok · $0.0018 · 6 spans · 2 failed" in row(page, s["risk"])
    assert "Σ 460 tok · $0.0069 · 7 spans" in row(page, s["verify"])
    assert "Σ 880 tok · $0.0132 · 19 spans · 2 failed" in row(page, s["run"])
    assert "irreversible" in row(page, s["verify-mail"]) and "approval" in row(page, s["verify-mail-2"])
    assert "running" in row(page, s["verify-wait"])

    shown = text(page)
    # The ledger, and what a compensation would do with each row.
    for op, undo in (
        (ops["read"], "nothing (a read)"),
        (ops["write"], "undo with crm.restore"),
        (ops["mail"], "correction with email.send (a reviewer approves first)"),
        (ops["mail-2"], "cannot be undone"),
        (ops["undo"], f"(compensation of operation {ops['write'].id})"),
    ):
        match = re.search(rf'<tr id="op-{op.id}".*?</tr>', page, re.S)
        assert match and undo in text(match.group(0)), (op.tool, undo)
    assert "inventory · 2" in text(re.search(rf'<tr id="op-{ops["read"].id}".*?</tr>', page, re.S).group(0))

    # Budgets, cost and approvals.
    for label in ("steps 9 of 50", "tokens 880 of 20000", "tool calls 4 (no limit)", "cost $0.0132 of $1.0000"):
        assert label in shown, label
    assert '<meter min="0" max="50" value="9" high="40">' in page
    assert "approvals pending 1" in shown

    # Tokens and cost by agent, biggest first, with the share of the run's cost.
    attribution = text(re.search(r'<table id="attribution".*?</table>', page, re.S).group(0))
    assert attribution.index("Verifier 1 460 $0.0069 52%") < attribution.index("Inventory 1 300 $0.0045 34%")
    assert "Risk review 1 120 $0.0018 14%" in attribution

    # Artifacts with who made them and their provenance, and a download link.
    inventory = Artifact.objects.get(run=run, key="inventory")
    item = text(re.search(rf'<li id="artifact-{inventory.id}".*?</li>', page, re.S).group(0))
    assert "inventory v1 · by task inventory" in item
    assert "'fencing_token': 7" in item and "'model': 'scripted-1'" in item
    assert "Deployment checkout@v43" in item
    assert reverse("runs:artifact", args=[run.id, inventory.id]) in page

    # The timeline: a bar per task and attempt, the critical path (what verify waited for) outlined.
    assert "the critical path (risk → verify)" in shown
    assert re.search(r'<text class="label crit"[^>]*>risk</text>', page)
    assert re.search(r'<text class="label crit"[^>]*>verify</text>', page)
    assert re.search(r'<text class="label"[^>]*>inventory</text>', page)
    assert page.count('<rect class="attempt') == 4
    fragment = client.get(reverse("runs:timeline", args=[run.id])).content.decode()
    assert "(risk → verify)" in text(fragment) and fragment.lstrip().startswith('<section id="timeline"')


@pytest.mark.parametrize(
    "params, kept",
    [
        ({"q": "deployments"}, ["run", "inventory", "inventory/1", "inv-read"]),
        ({"q": "EMAIL.SEND"}, ["run", "verify", "verify/1", "verify-mail", "verify-mail-2"]),
        ({"only": "failed"}, ["run", "risk", "risk/1", "risk-timeout"]),
        ({"only": "approval"}, ["run", "verify", "verify/1", "verify-mail-2", "verify-wait"]),
        ({"only": "irreversible"}, ["run", "verify", "verify/1", "verify-mail", "verify-mail-2"]),
        ({"q": "mail", "only": "approval"}, ["run", "verify", "verify/1", "verify-mail-2"]),
        ({"q": "nothing matches this"}, []),
    ],
)
def test_search_and_filters_keep_the_matches_and_their_ancestors_only(known, operator, client, params, kept):
    run, s, _ = known
    client.force_login(operator)
    for name in ("detail", "live"):
        page = client.get(reverse(f"runs:{name}", args=[run.id]), params).content.decode()
        assert NODE.findall(page) == [str(s[key].id) for key in kept], name
        assert f"{len(kept)} spans shown" in text(page)


def test_an_unknown_filter_shows_the_whole_tree(known, operator, client):
    run, s, _ = known
    client.force_login(operator)
    page = client.get(reverse("runs:detail", args=[run.id]), {"only": "bogus"}).content.decode()
    assert len(NODE.findall(page)) == len(s) and "spans shown" not in page


# --- large payloads ----------------------------------------------------------------------------------------
def test_a_large_body_is_a_download_and_a_truncated_preview_and_is_never_pushed(known, operator, client):
    run, s, _ = known
    marker, tail, small_marker = "LARGE-BODY-MARKER-7f3a", "END-OF-THE-BODY-91c2", "SMALL-BODY-MARKER-55d0"
    cache.delete(f"mark:run:{run.id}")
    assert run_push(run.id) == {"refetch": True}  # no watermark yet: the browsers re-read
    body = {"text": marker + " " + "x" * 40_000 + " " + tail}
    payload = Payload.objects.create(body=body, size=len(json.dumps(body)))
    big = Span.objects.create(
        run=run, task=s["verify"].task, parent=s["verify/1"], kind=K.MODEL_CALL, name="scripted-1",
        step=5, started_at=timezone.now(), ended_at=timezone.now(), payload=payload, tokens_in=10_000,
    )  # fmt: skip
    small = Span.objects.create(
        run=run, task=s["verify"].task, parent=s["verify/1"], kind=K.TOOL_CALL, name="search.query",
        step=6, started_at=timezone.now(), ended_at=timezone.now(), body={"query": small_marker},
    )  # fmt: skip

    push = run_push(run.id)
    assert f'id="node-{big.id}"' in push["html"] and f'id="node-{small.id}"' in push["html"]
    for secret in (marker, tail, small_marker, "xxxxxxxxxx"):
        assert secret not in push["html"] and secret not in json.dumps(push)

    client.force_login(operator)
    url = reverse("runs:span-payload", args=[run.id, big.id])
    page = client.get(reverse("runs:detail", args=[run.id])).content.decode()
    assert marker not in page and "xxxxxxxxxx" not in page
    assert f'<a href="{url}" download>download</a>' in page
    assert f'hx-get="{url}?preview=1"' in page

    preview = client.get(url, {"preview": "1"}, HTTP_HX_REQUEST="true")
    shown = preview.content.decode()
    assert preview.status_code == 200 and marker in shown and tail not in shown
    assert f"Showing {PREVIEW_CHARS} of" in text(shown)
    assert len(re.search(r"<pre>(.*?)</pre>", shown, re.S).group(1)) <= PREVIEW_CHARS + 100  # escaping aside
    assert f'href="{url}" download' in shown

    download = client.get(url)
    assert download.status_code == 200 and download["Content-Type"] == "application/json"
    assert download["Content-Disposition"] == f'attachment; filename="run-{run.id}-span-{big.id}.json"'
    assert json.loads(download.content) == body


# --- security headers -------------------------------------------------------------------------------------
class _Scan(HTMLParser):
    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.scripts: list[dict] = []
        self.problems: list[str] = []

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if tag == "script":
            self.scripts.append(attrs)
        if tag == "style":
            self.problems.append("a <style> element")
        for name in attrs:
            if name == "style":
                self.problems.append(f"<{tag} style=…>")
            if name.startswith("on"):
                self.problems.append(f"<{tag} {name}=…>")


def assert_secure(response, *, page: bool, ours: bool = True) -> None:
    """``page``: a whole page, whose scripts carry the nonce; ``ours``: rendered from our templates only."""
    url = response.request["PATH_INFO"]
    assert response["X-Frame-Options"] == "DENY", url
    policy = response["Content-Security-Policy"]
    directives = dict((d.strip().split(" ", 1) + [""])[:2] for d in policy.split(";") if d.strip())
    assert "'unsafe-inline'" not in policy and "'unsafe-eval'" not in policy, (url, policy)
    assert directives["script-src"].startswith("'self'") and directives["style-src"] == "'self'", (url, policy)
    nonce = re.search(r"'nonce-([^']+)'", directives["script-src"])
    scan = _Scan()
    scan.feed(response.content.decode())
    assert scan.problems == [], (url, scan.problems)
    if page:  # a whole page: its scripts are ours, each with this response's nonce
        assert nonce, (url, policy)
        assert scan.scripts, url
    for script in scan.scripts:
        if ours:
            assert nonce and script.get("nonce") == nonce.group(1), (url, script)
        assert script.get("src", "").startswith("/static/"), (url, script)


def test_every_dashboard_page_sends_a_strict_policy_and_has_no_inline_code(known, operator, client):
    run, s, ops = known
    Run.objects.filter(id=run.id).update(goal="<script>alert(1)</script> <b style=x onclick=y>goal</b>")
    client.force_login(operator)
    anonymous = client.__class__()
    # The login page is the admin's (its theme script comes from /static/, allowed by 'self', no nonce).
    assert_secure(anonymous.get(reverse("login")), page=False, ours=False)
    detail = reverse("runs:detail", args=[run.id])
    pages = [
        detail,
        detail + "?q=mail&only=irreversible",
        reverse("runs:span-children", args=[run.id, s["verify"].id]),
        reverse("runs:list"),
        reverse("runs:insight"),
        reverse("approvals-queue"),
        reverse("runs:cancel", args=[run.id]),
        reverse("runs:compensate", args=[run.id]),
        reverse("runs:resume", args=[run.id]),
        reverse("runs:task-retry", args=[run.id, s["risk"].task_id]),
        reverse("runs:operation-resolve", args=[run.id, ops["mail"].id]),
    ]
    for url in pages:
        response = client.get(url)
        assert response.status_code in (200, 409), (url, response.status_code)  # 409: the action is refused
        assert_secure(response, page=True)
    fragments = [
        reverse("runs:live", args=[run.id]),
        reverse("runs:timeline", args=[run.id]),
        reverse("runs:span-payload", args=[run.id, s["inv-m1"].id]) + "?preview=1",
        reverse("approvals-new"),
    ]
    for url in fragments:
        response = client.get(url, HTTP_HX_REQUEST="true")
        assert response.status_code == 200, url
        assert_secure(response, page=False)
    response = client.get(reverse("runs:span-children", args=[run.id, s["verify"].id]), HTTP_HX_REQUEST="true")
    assert_secure(response, page=False)


# --- access --------------------------------------------------------------------------------------------------
def run_urls(run, s) -> list[str]:
    artifact = Artifact.objects.filter(run=run).first()
    return [
        reverse("runs:detail", args=[run.id]),
        reverse("runs:live", args=[run.id]),
        reverse("runs:timeline", args=[run.id]),
        reverse("runs:span-children", args=[run.id, s["verify"].id]),
        reverse("runs:span-payload", args=[run.id, s["inv-m1"].id]),
        reverse("runs:span-payload", args=[run.id, s["inv-m1"].id]) + "?preview=1",
        reverse("runs:artifact", args=[run.id, artifact.id]),
    ]


def test_anonymous_visitors_are_sent_to_the_login_page(known, client):
    run, s, _ = known
    for url in run_urls(run, s):
        response = client.get(url)
        assert response.status_code == 302 and response["Location"].startswith("/login/?next="), url


def test_a_member_of_another_project_gets_404_on_every_run_url(known, people, client):
    run, s, ops = known
    _, _, otto = people
    client.force_login(otto)
    actions = [
        reverse("runs:cancel", args=[run.id]),
        reverse("runs:resume", args=[run.id]),
        reverse("runs:compensate", args=[run.id]),
        reverse("runs:task-retry", args=[run.id, s["risk"].task_id]),
        reverse("runs:operation-resolve", args=[run.id, ops["mail"].id]),
    ]
    for url in run_urls(run, s) + actions:
        assert client.get(url).status_code == 404, url
        assert client.get(url, HTTP_HX_REQUEST="true").status_code == 404, url
    for url in actions:
        assert client.post(url, {"reason": "not mine"}).status_code == 404, url
    # a run that does not exist answers the same way
    assert client.get(reverse("runs:detail", args=[run.id + 1000])).status_code == 404


def test_a_viewer_sees_the_page_but_every_action_link_refuses(known, people, client):
    run, s, ops = known
    _, vera, _ = people
    Run.objects.filter(id=run.id).update(status=Run.Status.NEEDS_ATTENTION, status_reason="task risk failed")
    Task.objects.filter(id=s["risk"].task_id).update(status=Task.Status.FAILED)
    ToolOperation.objects.filter(id=ops["mail"].id).update(status=OS.AMBIGUOUS)
    client.force_login(vera)
    for url in run_urls(run, s):
        assert client.get(url).status_code == 200, url
    page = client.get(reverse("runs:detail", args=[run.id])).content.decode()
    links = re.findall(r'<a class="button" href="([^"]+)">', page) + re.findall(r'<a href="([^"]+)">Resolve…</a>', page)
    expected = {
        reverse("runs:cancel", args=[run.id]),
        reverse("runs:resume", args=[run.id]),
        reverse("runs:task-retry", args=[run.id, s["risk"].task_id]),
        reverse("runs:fork", args=[run.id]) + "?task=risk",
        reverse("runs:operation-resolve", args=[run.id, ops["mail"].id]),
    }
    assert set(links) == expected
    # Not offered while an operation's outcome is unknown (as the service would refuse), and it says why.
    assert f"operations [{ops['mail'].id}] may or may not have happened" in page
    before = (Run.objects.get(id=run.id).status, Task.objects.get(id=s["risk"].task_id).status)
    for url in links:
        assert client.get(url).status_code == 403, url
        assert client.post(url, {"reason": "a viewer tries"}).status_code == 403, url
    assert (Run.objects.get(id=run.id).status, Task.objects.get(id=s["risk"].task_id).status) == before


def test_a_push_carries_the_same_subtree_totals_as_a_fresh_page(db, operator, client):
    """A push loads only the new span and its ancestors; their Σ totals must still be the whole subtree's."""
    run = build_run(3, calls=4)
    client.force_login(operator)
    cache.delete(f"mark:run:{run.id}")
    assert run_push(run.id) == {"refetch": True}  # sets the watermark
    attempt = Span.objects.filter(run=run, kind="attempt").order_by("id").last()
    now = timezone.now()
    Span.objects.create(
        run=run, task_id=attempt.task_id, parent=attempt, kind="model_call", name="late answer", status="error",
        started_at=now, ended_at=now, tokens_in=70, tokens_out=7, cost_micros=1234, step=99,
    )  # fmt: skip
    pushed = run_push(run.id)["html"]
    page = client.get(f"/runs/{run.id}/").content.decode()
    task_span = Span.objects.get(task_id=attempt.task_id, kind="task")
    root = Span.objects.get(run=run, kind="run")

    def totals(source, span):
        return re.search(r"Σ[^<]*", row(source, span)).group(0)

    for span in (attempt, task_span, root):
        assert totals(pushed, span) == totals(page, span), span.kind
    assert "1 failed" in totals(pushed, attempt)


def test_a_run_of_many_tasks_draws_the_first_ones_and_loads_the_next_on_demand(
    db, operator, client, monkeypatch
):  # fmt: skip
    import dashboard.trace
    import dashboard.views.run_page as run_page

    for module in (dashboard.trace, run_page):
        monkeypatch.setattr(module, "TASKS_DRAWN", 5)  # as a run of 10,000 against the real 300
        monkeypatch.setattr(module, "FULL_TREE_MAX", 20)
    monkeypatch.setattr(run_page, "OPS_SHOWN", 2)
    run = build_run(12)
    Task.objects.filter(run=run).update(depends_on=[])  # side by side: the critical path is the last task
    tasks = list(Task.objects.filter(run=run).order_by("id"))
    node = {s.task_id: f'id="node-{s.id}"' for s in Span.objects.filter(run=run, kind=K.TASK)}  # tree nodes

    def drawn_in(html: str) -> list[str]:
        return [t.key for t in tasks if node[t.id] in html]

    client.force_login(operator)
    page = client.get(reverse("runs:detail", args=[run.id])).content.decode()

    assert drawn_in(page) == [t.key for t in tasks[:5]]
    assert "load the next 5 of 7 more tasks" in page
    assert "Drawn: 6 of 12 tasks" in text(page)  # the first five and the critical path's one
    assert "The newest 2 of 4 operations" in text(page)

    more = reverse("runs:span-children", args=[run.id, Span.objects.get(run=run, kind=K.RUN).id])
    second = client.get(f"{more}?after={tasks[4].id}", HTTP_HX_REQUEST="true").content.decode()
    assert drawn_in(second) == [t.key for t in tasks[5:10]]
    assert "load the next 2 of 2 more tasks" in second
    last = client.get(f"{more}?after={tasks[9].id}", HTTP_HX_REQUEST="true").content.decode()
    assert drawn_in(last) == [t.key for t in tasks[10:]]
    assert "more tasks" not in last
    assert client.get(f"{more}?after=x", HTTP_HX_REQUEST="true").status_code == 400
