"""The live dashboard in a real browser (Debian's Chromium driven by Playwright) against real server
processes, since live updates need an ASGI server with websockets: an operator watches a run grow
without reloading, a reviewer approves its bundle of e-mails with a double click, the operator's page
follows through a server killed mid-run, and the pages are captured for docs/screenshots/."""

import json
import os
import signal
import urllib.request

import pytest

from evals.demo import demo_suite_load
from evals.models import EvalSuite
from policy.models import ApprovalRequest, Decision
from runs.models import Run, Span
from tenancy.access import default_project, membership_grant
from tenancy.tokens import api_token_create
from tests.conftest import CHROMIUM, ROOT, SCALED, free_port, wait_for
from tests.conftest import CHROMIUM_ARGS as ARGS
from tools.installation import run_key_prefix
from tools.models import SandboxCall, SandboxEmail

# A test run leaves the checkout clean: pages are captured under var/ unless WARDEN_SCREENSHOTS names
# another folder (WARDEN_SCREENSHOTS=docs/screenshots refreshes the ones the docs show).
SCREENSHOTS = ROOT / os.environ.get("WARDEN_SCREENSHOTS", "var/screenshots")
# Each worker's first three calls take half a second (the sandbox's `slow` fault), so the run is still
# going when the page opens and when the server is killed.
SLOW_WORKERS = [{"task": f"worker-{n}", "call": c, "mode": "slow"} for n in range(1, 6) for c in (1, 2, 3)]
# Each worker also stops 3 s after its first intent, so the run cannot get far before the page opens on
# a loaded machine (CI runs both halves of the suite at once on two cores).
HELD_WORKERS = SLOW_WORKERS + [{"task": f"worker-{n}", "call": 1, "mode": "freeze"} for n in range(1, 6)]
# A server killed mid-task leaves a lease behind: keep it short so the next server takes the task over.
SHORT_LEASE = {"WARDEN_LEASE_SECONDS": 2, "WARDEN_HEARTBEAT_SECONDS": 0.5}
LIVE = '#live-status[data-state="live"]'
pytestmark = [pytest.mark.browser, pytest.mark.processes]


@pytest.fixture
def reviewer(django_user_model):
    user = django_user_model.objects.create_user(username="rita", password="reviewer-pass-123")
    membership_grant(user=user, project=default_project(), role="reviewer")
    return user


@pytest.fixture
def browser():
    # Playwright's sync API runs an event loop in this thread; the test's own ORM calls are still sync.
    os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = "true"
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        chromium = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        yield chromium
        # Queries made while Playwright's loop runs use a connection of their own context: close it here.
        from django.db import connections

        connections.close_all()
        chromium.close()
    os.environ.pop("DJANGO_ALLOW_ASYNC_UNSAFE", None)


class Warden:
    """Warden served by real processes on one port: a server (which in embedded mode also runs the
    workers) and, in scaled mode, a worker process."""

    def __init__(self, processes, **env):
        self.processes, self.env, self.port = processes, env, free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.server = None
        if SCALED:
            processes.worker(threads=2, **env)
        self.start()

    def start(self):
        self.server = self.processes.server(port=self.port, **self.env)

        def answers():
            try:
                with urllib.request.urlopen(f"{self.url}/login/", timeout=2) as response:
                    return response.status == 200
            except OSError:
                return False

        wait_for(answers, timeout=30, interval=0.1, message="the server to answer")

    def run_start(self, user, workflow: str, input: dict | None = None) -> Run:
        """Start a run through the API, as ``user``: the server's workers pick it up at once."""
        _, token = api_token_create(user=user)
        request = urllib.request.Request(
            f"{self.url}/api/v1/runs",
            method="POST",
            data=json.dumps({"workflow": workflow, "input": input or {}}).encode(),
            headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=10) as response:
            return Run.objects.get(id=json.loads(response.read())["id"])

    def kill(self):
        os.killpg(self.server.pid, signal.SIGKILL)
        self.server.wait(timeout=10)

    def login(self, browser, username: str, password: str):
        context = browser.new_context(viewport={"width": 1280, "height": 900})
        page = context.new_page()
        page.goto(f"{self.url}/login/")
        page.fill("#id_username", username)
        page.fill("#id_password", password)
        page.click("input[type=submit]")
        page.wait_for_load_state()
        assert "/login/" not in page.url, f"{username} could not log in"
        return page


def watch(page, url: str) -> list:
    """Open a run page, wait for its socket, and mark the document: a reload or navigation loses the mark."""
    navigations = []
    page.goto(url)
    page.wait_for_selector(LIVE, timeout=15_000)
    page.evaluate("window.__marker = 1")
    page.on("framenavigated", lambda frame: frame == page.main_frame and navigations.append(frame.url))
    return navigations


def assert_not_reloaded(page, navigations: list):
    assert page.evaluate("window.__marker") == 1, "the page was reloaded"
    assert navigations == [], navigations


def node_ids(page) -> set[str]:
    return set(page.eval_on_selector_all("#kids-root li.node", "els => els.map(e => e.id)"))


def assert_shows_what_a_fresh_load_shows(page, run: Run):
    """The live page ends with the same trace nodes and status as the page loaded afresh."""
    fresh = page.context.new_page()
    fresh.goto(page.url)
    expected = node_ids(fresh)
    assert status_badge(fresh) == run.status
    assert tool_call_count(fresh) == Span.objects.filter(run=run, kind=Span.Kind.TOOL_CALL).count()
    try:
        wait_for(lambda: node_ids(page) == expected, timeout=10, message="the live page to match a fresh load")
    except AssertionError:
        shown = node_ids(page)
        raise AssertionError(f"live page lacks {expected - shown}, has extra {shown - expected}") from None
    assert status_badge(page) == run.status
    fresh.close()


def tool_call_count(page) -> int:
    return page.locator("li.node.k-tool_call").count()


def status_badge(page) -> str:
    classes = page.get_attribute("#run-header h1 .badge", "class").split()
    return next(c for c in classes if c.startswith("s-"))[2:]


def test_an_operator_sees_the_run_grow_and_a_double_clicked_approval_decides_once(
    demo_tx, operator, reviewer, processes, browser
):
    warden = Warden(processes)
    page = warden.login(browser, "olivia", "operator-pass-123")
    run = warden.run_start(operator, "incident-fanout", {"propose_tools": ["email.send"], "faults": HELD_WORKERS})
    navigations = watch(page, f"{warden.url}/runs/{run.id}/")

    # Tasks and tool calls appear without a reload.
    at_first_sight = tool_call_count(page)
    assert status_badge(page) in ("pending", "running")
    assert at_first_sight < 10, "the run had got too far before the page opened"
    page.wait_for_function(
        "n => document.querySelectorAll('li.node.k-tool_call').length > n", arg=at_first_sight, timeout=20_000
    )
    page.wait_for_selector("li.node.k-task", timeout=10_000)
    assert_not_reloaded(page, navigations)

    # A reviewer who did not start the run approves the bundle of five e-mails with a double click.
    wait_for(
        lambda: ApprovalRequest.objects.filter(run=run, parent=None, status="pending").first(),
        timeout=60,
        message="the bundle of proposed e-mails",
    )
    bundle = ApprovalRequest.objects.get(run=run, parent=None)
    assert bundle.kind == ApprovalRequest.Kind.BUNDLE
    assert not SandboxEmail.objects.filter(idempotency_key__startswith=run_key_prefix(run.id)).exists()
    queue = warden.login(browser, "rita", "reviewer-pass-123")
    queue.goto(f"{warden.url}/approvals/")
    card = queue.locator(f"#request-{bundle.id}.card.pending")
    card.wait_for()
    assert card.locator("table.ops tbody tr").count() == 5
    assert card.locator("table.ops tbody").inner_text().count("email.send") == 5
    posts = []
    queue.on("request", lambda r: r.method == "POST" and posts.append(r.url))
    card.locator("button.approve").dblclick()
    queue.wait_for_selector(f"#request-{bundle.id} >> text=Approved by rita", timeout=10_000)
    assert posts and set(posts) == {f"{warden.url}/approvals/{bundle.id}/decide"}, posts

    # The operator's page, never reloaded, shows the run completed.
    page.wait_for_selector("#run-header .badge.s-completed", timeout=30_000)
    assert_not_reloaded(page, navigations)
    # One decision: the bundle's, recorded on each of its five items (one Decision row per item).
    decided = Decision.objects.filter(request__run=run)
    assert (
        sorted(decided.values_list("request__parent_id", "reviewer__username", "verdict"))
        == [(bundle.id, "rita", "approve")] * 5
    )
    assert decided.values("request").distinct().count() == 5
    emails = SandboxEmail.objects.filter(idempotency_key__startswith=run_key_prefix(run.id))
    assert sorted(emails.values_list("to", flat=True)) == [f"worker-{n}@customers.example" for n in range(1, 6)]
    assert emails.values("idempotency_key").distinct().count() == 5
    assert SandboxCall.objects.filter(tool="email.send", is_effect=True).count() == 5
    run.refresh_from_db()
    assert_shows_what_a_fresh_load_shows(page, run)
    assert_not_reloaded(page, navigations)


def test_the_page_reconnects_after_the_server_is_killed_and_catches_up(demo_tx, operator, processes, browser):
    warden = Warden(processes, **SHORT_LEASE)
    page = warden.login(browser, "olivia", "operator-pass-123")
    run = warden.run_start(operator, "incident-fanout", {"faults": SLOW_WORKERS})
    navigations = watch(page, f"{warden.url}/runs/{run.id}/")
    page.wait_for_function("() => document.querySelectorAll('li.node.k-tool_call').length >= 2", timeout=20_000)
    assert not Run.objects.get(id=run.id).is_terminal

    warden.kill()  # the socket drops with the process
    page.wait_for_selector('#live-status[data-state="reconnecting"]', timeout=10_000)
    warden.start()  # same port; in embedded mode this process resumes the run
    page.wait_for_selector(LIVE, timeout=20_000)
    wait_for(lambda: Run.objects.get(id=run.id).is_terminal, timeout=60, message="the run to finish")
    run.refresh_from_db()
    assert run.status == Run.Status.COMPLETED, run.status_reason
    page.wait_for_selector("#run-header .badge.s-completed", timeout=15_000)
    if not SCALED:  # the new server took over what the killed one held
        assert Span.objects.filter(run=run, kind=Span.Kind.RECOVERY).exists()

    assert_shows_what_a_fresh_load_shows(page, run)
    assert_not_reloaded(page, navigations)


# axe-core's WCAG 2.0/2.1 level A and AA rules: what the dashboard holds itself to on every page.
WCAG = {
    "runOnly": {"type": "tag", "values": ["wcag2a", "wcag2aa", "wcag21a", "wcag21aa"]},
    "resultTypes": ["violations"],
}


def accessibility_violations(page) -> list[str]:
    """axe-core's violations on the page as shown, one line per rule and element."""
    from axe_playwright_python.sync_playwright import Axe

    found = Axe().run(page, options=WCAG).response["violations"]
    return [f"{v['id']} ({v['impact']}): {n['target']} {n['failureSummary'][:160]}" for v in found for n in v["nodes"]]


# The pages' markup is the same whichever database and broker serve them: checked once, in the embedded half.
@pytest.mark.anymode
def test_every_page_is_accessible_and_captured(demo_tx, operator, reviewer, processes, browser):
    """Each page a person opens has no WCAG 2 A/AA violation axe-core finds, with real content on it
    (runs in every state, a waiting approval); the pages the README and docs/dashboard.md show are captured
    (docs/screenshots/, refreshed with WARDEN_SCREENSHOTS)."""
    demo_suite_load()
    warden = Warden(processes)
    done = warden.run_start(operator, "incident-fanout")
    waiting = warden.run_start(operator, "incident-fanout", {"propose_tools": ["email.send"]})
    warden.run_start(operator, "deploy-review")
    stopped = warden.run_start(
        operator, "incident-fanout", {"faults": [{"task": "worker-3", "call": 4, "mode": "error"}]}
    )
    wait_for(
        lambda: Run.objects.filter(status__in=[*Run.TERMINAL, "needs_attention", "waiting_for_approval"]).count() == 4,
        timeout=60,
        message="the four runs to settle",
    )
    assert Run.objects.get(id=stopped.id).status == Run.Status.NEEDS_ATTENTION
    assert Run.objects.get(id=waiting.id).status == Run.Status.WAITING_FOR_APPROVAL

    reviewer_page = warden.login(browser, "rita", "reviewer-pass-123")
    reviewer_page.goto(f"{warden.url}/approvals/")
    reviewer_page.wait_for_selector(".card.pending")
    reviewer_page.screenshot(path=SCREENSHOTS / "approvals-queue.png", full_page=True)

    page = warden.login(browser, "olivia", "operator-pass-123")
    page.goto(f"{warden.url}/runs/{done.id}/")
    page.wait_for_selector(LIVE)
    page.wait_for_selector("#timeline svg.gantt")
    assert page.locator("li.node.k-tool_call").count() == 20
    page.screenshot(path=SCREENSHOTS / "run-page.png", full_page=True)

    for path, name in (("/runs/", "runs-list.png"), ("/insight/", "insight.png")):
        response = page.goto(warden.url + path)
        assert response.status == 200, f"{path} answered {response.status}"
        page.wait_for_load_state("networkidle")
        page.screenshot(path=SCREENSHOTS / name, full_page=True)
    for name in ("runs-list.png", "run-page.png", "approvals-queue.png", "insight.png"):
        assert (SCREENSHOTS / name).stat().st_size > 10_000, name

    suite = EvalSuite.objects.get()
    pages = {"operator": [f"/runs/{r.id}/" for r in (done, waiting, stopped)], "reviewer": ["/approvals/", "/inbox/"]}
    pages["operator"] += ["/runs/", "/runs/start", "/insight/", "/evals/", "/evals/new", f"/evals/{suite.id}/"]
    pages["operator"] += ["/workers/", "/inbox/", "/approvals/", "/runs/?status=needs_attention"]
    violations = {}
    for who, paths in pages.items():
        viewer = page if who == "operator" else reviewer_page
        for path in paths:
            response = viewer.goto(warden.url + path)
            assert response.status == 200, f"{path} answered {response.status}"
            viewer.wait_for_load_state("networkidle")
            violations.update({f"{who} {path}": found for found in [accessibility_violations(viewer)] if found})
    anonymous = browser.new_context().new_page()
    anonymous.goto(f"{warden.url}/login/")
    if found := accessibility_violations(anonymous):
        violations["anonymous /login/"] = found
    assert violations == {}, json.dumps(violations, indent=1)
