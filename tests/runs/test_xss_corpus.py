"""Markup from models, tools and run input stays text on every dashboard page, in a real browser.

An XSS corpus goes in through a scripted model's words and final output, a sandbox CRM record and a
tool that echoes its argument, a run's goal and input, a failure message and the names of an agent and
a workflow. Chromium then opens every page that shows them, opens the trace tree, fetches the payload
previews and the lazily loaded subtrees through htmx, and we check that nothing ran: no dialog, no
request the page's own code did not make, no handler or htmx attribute carrying a payload, no script
but ours, no CSP violation — and the payloads are on the page, as text.
"""

import contextlib
import os
import re
from pathlib import Path
from urllib.parse import urlsplit

import pytest
from django.test import Client

from agents.models import Agent, Workflow
from policy.models import ApprovalRequest
from runs.models import Run, Span, Task
from runs.services import run_start
from tenancy.access import default_project, membership_grant
from tests.conftest import CHROMIUM, wait_for
from tests.conftest import CHROMIUM_ARGS as ARGS
from tools.models import SandboxRecord

pytestmark = pytest.mark.browser

CORPUS = [
    "<script>alert(1)</script>",
    "<img src=x onerror=alert(1)>",
    '<a href="javascript:alert(1)">x</a>',
    "<svg onload=alert(1)>",
    "<svg><script>alert(1)</script></svg>",
    '<button hx-post="/runs/bulk" hx-trigger="load">x</button>',
    '<div hx-on:click="alert(1)" hx-get="/api/v1/runs">',
    '<div hx-on::load="alert(1)">',
    '"><iframe src=javascript:alert(1)>',
    "{{7*7}}",
    "<details open ontoggle=alert(1)>",
    # and a few more contexts: attribute break-outs, raw-text elements, htmx's data- prefix, mutation XSS
    "' onmouseover='alert(1)",
    '" onfocus="alert(1)" autofocus x="',
    "</textarea><script>alert(1)</script>",
    "</pre><img src=x onerror=alert(1)>",
    '<div data-hx-get="/api/v1/runs" data-hx-trigger="load">',
    "<math><mtext><table><mglyph><style><img src=x onerror=alert(1)>",
    '<base href="//evil.example/">',
    "<style>body{display:none}</style>",
    "<input autofocus onfocus=alert(1)>",
    "{% debug %}",
]
# Strings that only a payload puts into an attribute (our own hx-get/hx-post point elsewhere).
MARKERS = ("alert(", "/runs/bulk", "/api/v1/runs", "7*7", "javascript:", "evil.example", "debug %")
JOINED = " ".join(CORPUS)
SHORT = " ".join(CORPUS[:2])  # fits where a field is short (a ticket title, a CRM name)


def lit(text: str) -> str:
    """A scripted turn is a str.format template: braces in a payload are written doubled."""
    return text.replace("{", "{{").replace("}", "}}")


# --- the data -----------------------------------------------------------------------------------------
def xss_workflows() -> tuple[Workflow, Workflow]:
    """``xss``: a task whose model and tools carry the corpus, then a task that fails with it in its
    message. ``xss-propose``: the first task alone, for a run in propose mode (an approval card)."""
    SandboxRecord.objects.create(
        customer_id="xss-1",
        name=" ".join(CORPUS[:3])[:200],
        fields={f"note-{i}": p for i, p in enumerate(CORPUS)},
    )
    writer = Agent.objects.create(
        slug="xss-writer",
        name="Writer <img src=x onerror=alert(1)>",
        allowed_tools=["crm.read", "search.query", "tickets.create"],
        output_schema={"type": "object"},
        max_attempts=1,
        script=[
            {"say": lit(JOINED), "tool": "crm.read", "arguments": {"customer_id": "xss-1"}},
            {"say": "The record says {last[name]}", "tool": "search.query", "arguments": {"query": lit(JOINED)[:500]}},
            {
                "say": "Filing {input[title]}",
                "tool": "tickets.create",
                "arguments": {"customer_id": "xss-1", "title": "{input[title]}"},
            },
            {"final": {"summary": lit(JOINED), "items": [lit(p) for p in CORPUS], "quoted": "{input[title]}"}},
        ],
    )
    breaker = Agent.objects.create(
        slug="xss-breaker",
        name='Breaker "><svg onload=alert(1)>',
        output_schema={"type": "object"},
        max_attempts=1,
        script=[{"fail": "permanent", "message": JOINED}],
    )
    xss = Workflow.objects.create(
        slug="xss",
        name="XSS <script>alert(1)</script>",
        tasks=[
            {"key": "write", "agent": writer.slug, "objective": "Write it"},
            {"key": "break", "agent": breaker.slug, "objective": "Break it", "depends_on": ["write"]},
        ],
    )
    propose = Workflow.objects.create(
        slug="xss-propose",
        name="XSS propose <img src=x onerror=alert(1)>",
        tasks=[{"key": "write", "agent": writer.slug, "objective": "Write it"}],
    )
    return xss, propose


def run_input(**extra) -> dict:
    return {"title": SHORT, "notes": CORPUS, "nested": {"<b>key</b>": JOINED}, **extra}


def settled(run: Run, *statuses) -> Run:
    wait_for(lambda: Run.objects.get(id=run.id).status in statuses, timeout=60, message=f"run {run.id} to settle")
    run.refresh_from_db()
    return run


# --- the browser --------------------------------------------------------------------------------------
# Recorded in the page before its own scripts run: every CSP violation, with what was blocked.
RECORD_VIOLATIONS = """
window.__csp = [];
document.addEventListener("securitypolicyviolation", (e) => window.__csp.push(
  {directive: e.violatedDirective, blocked: e.blockedURI, source: e.sourceFile, sample: e.sample}));
"""

# Every element's attributes that run code or make htmx requests, and every script element.
WALK_DOM = """
(markers) => {
  const bad = [];
  const scripts = [];
  for (const el of document.querySelectorAll("*")) {
    for (const attr of el.attributes) {
      const name = attr.name.toLowerCase();
      const value = attr.value;
      const risky = name.startsWith("on") || name.startsWith("hx-") || name.startsWith("data-hx-");
      if (risky && markers.some((m) => value.includes(m))) bad.push(el.tagName + " " + name + "=" + value);
      if (["href", "src", "action", "formaction", "data", "xlink:href"].includes(name)
          && value.trim().toLowerCase().startsWith("javascript:")) bad.push(el.tagName + " " + name + "=" + value);
    }
    if (el.localName === "script") scripts.push(el.getAttribute("src") || "(inline) " + el.textContent.slice(0, 80));
    if (["iframe", "object", "embed", "base"].includes(el.localName)) bad.push("element " + el.localName);
    if (el.localName === "style") bad.push("style element " + el.textContent.slice(0, 80));
  }
  return {bad, scripts, text: document.body ? document.body.innerText : ""};
}
"""


class Browser:
    """One page, and everything it did: dialogs, requests, websockets, CSP reports on the console."""

    def __init__(self, page, base: str):
        self.page, self.base = page, base
        self.origin = urlsplit(base).netloc
        self.dialogs: list[str] = []
        self.requests: list[tuple[str, str, int]] = []
        # Which document a request came from: the previous page's poll can still leave while the next
        # page loads, and is that page's, not this one's.
        self.document = 0
        self.sockets: list[str] = []
        self.console_csp: list[str] = []
        self.errors: list[str] = []
        page.on("dialog", lambda d: (self.dialogs.append(d.message), d.dismiss()))
        page.on("request", lambda r: self.requests.append((r.method, r.url, self.document)))
        page.on("framenavigated", lambda frame: self._navigated(frame))
        self.answered: list[str] = []
        page.on("requestfinished", lambda r: self.answered.append(r.url))
        page.on("websocket", lambda ws: self.sockets.append(ws.url))
        page.on("pageerror", lambda e: self.errors.append(str(e)))
        page.on(
            "console",
            lambda m: self.console_csp.append(m.text) if "Content Security Policy" in m.text else None,
        )
        page.add_init_script(RECORD_VIOLATIONS)

    def _navigated(self, frame) -> None:
        if frame == self.page.main_frame:
            self.document += 1

    def goto(self, path: str):
        self.answered.clear()
        response = self.page.goto(self.base + path)
        assert response is not None and response.status == 200, (path, response and response.status)
        self.page.wait_for_load_state("load")
        return response

    def wait(self, predicate, what: str):
        for _ in range(1200):  # 60 s: a loaded CI machine is slow to answer (30 s was not always enough)
            if predicate():
                return
            self.page.wait_for_timeout(50)
        raise AssertionError(f"{self.page.url}: timed out waiting for {what}")

    def settle(self):
        """Let htmx finish its swaps (no request in flight, nothing settling)."""
        # Polled from here: wait_for_function evaluates a string in the page, which our CSP forbids.
        busy = "() => Boolean(document.querySelector('.htmx-request, .htmx-settling, .htmx-swapping'))"
        self.wait(lambda: not self.page.evaluate(busy), "htmx to settle")

    def open_everything(self) -> dict:
        """Open every tree node, let lazily loaded subtrees arrive and press every "show"; returns counts."""
        from playwright.sync_api import Error as PlaywrightError

        page = self.page
        done = {"opened": 0, "lazy": 0, "shown": 0}
        for _ in range(500):
            closed = page.locator("details:not([open]) > summary")
            if closed.count():
                closed.first.click()
                self.settle()
                done["opened"] += 1
                continue
            lazy = page.locator("li.lazy > a[hx-get]")
            if lazy.count():
                # "intersect once": htmx fetches the children when the link shows (now, or once scrolled to)
                link = lazy.first
                try:
                    url = link.get_attribute("hx-get", timeout=2000)
                except PlaywrightError:  # swapped out between the count and the read: look again
                    continue
                try:
                    link.scroll_into_view_if_needed(timeout=2000)
                except PlaywrightError:  # already swapped out: its children arrived
                    pass
                # Its children arrive, or a re-render replaced the link before it fetched (then look again).
                pending = page.locator(f'li.lazy > a[hx-get="{url}"]')

                def arrived(url=url, pending=pending, tries=[0]):  # noqa: B006  (a counter per link)
                    tries[0] += 1
                    if tries[0] % 200 == 0 and pending.count():
                        # No answer within 10 s on a loaded machine: the observer may not have seen the link
                        # come into view. Scroll it out and back, as a reader would, so that it does.
                        page.mouse.wheel(0, -100_000)
                        with contextlib.suppress(PlaywrightError):
                            pending.first.scroll_into_view_if_needed(timeout=2000)
                    if tries[0] % 400 == 0 and pending.count():
                        # Still nothing after 20 s: a starved headless Chromium can leave its
                        # IntersectionObserver silent. Fire the event htmx waits for (what the page then
                        # shows is what this test checks, not the observer).
                        with contextlib.suppress(PlaywrightError):
                            pending.first.evaluate("link => htmx.trigger(link, 'intersect')", timeout=2000)
                    return any(u.endswith(url) for u in self.answered) or not pending.count()

                self.wait(arrived, f"the children at {url}")
                self.settle()
                continue
            show = page.locator(".payload-slot > a[hx-get]")
            if show.count():
                with page.expect_response(lambda r: "preview=1" in r.url):
                    show.first.click()
                self.settle()
                done["shown"] += 1
                continue
            done["lazy"] = sum("/children" in u for u in self.answered)
            return done
        raise AssertionError(f"the tree never stopped opening: {done}")

    def check(self, allowed: list[str], *, texts: list[str]) -> str:
        """The page's DOM, requests and console are clean, and each of ``texts`` is shown as text."""
        page = self.page
        found = page.evaluate(WALK_DOM, list(MARKERS))
        assert found["bad"] == [], f"{page.url}: payload markup became live: {found['bad']}"
        ours = [s for s in found["scripts"] if s.startswith("/static/")]
        assert ours == found["scripts"], f"{page.url}: scripts other than ours: {found['scripts']}"
        violations = page.evaluate("window.__csp || []")
        assert violations == [], f"{page.url}: CSP violations {violations}"
        assert self.console_csp == [], f"{page.url}: CSP errors on the console {self.console_csp}"
        assert self.dialogs == [], f"{page.url}: a dialog opened: {self.dialogs}"
        assert self.errors == [], f"{page.url}: page errors {self.errors}"
        # Every page of a logged-in person fetches the nav's "needs you" count (and opens its socket).
        patterns = [re.compile(p) for p in allowed + [r"/static/.+", r"/favicon\.ico", r"/inbox/counts"]]
        for method, url, document in self.requests:
            if document != self.document:
                continue  # sent by the page before this one
            parts = urlsplit(url)
            assert parts.netloc == self.origin, f"a request left for {url}"
            assert method == "GET", f"{page.url}: unexpected {method} {url}"
            path = parts.path + (f"?{parts.query}" if parts.query else "")
            assert any(p.fullmatch(path) for p in patterns), f"{page.url}: unexpected request {method} {path}"
        for url in self.sockets:
            assert re.fullmatch(rf"ws://{re.escape(self.origin)}/ws/(runs/(\d+/)?|inbox/)", url), (
                f"unexpected socket {url}"
            )
        for text in texts:
            assert text in found["text"], f"{page.url}: {text!r} is not shown as text"
        self.requests.clear()
        return found["text"]


@pytest.fixture
def browser(live_url):
    if not Path(CHROMIUM).exists():
        pytest.skip("Debian's chromium is not installed (apt-get install -y chromium)")
    # Playwright's sync API runs an event loop in this thread; the test's own ORM calls are still sync.
    os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = "true"
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        chromium = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        context = chromium.new_context()
        yield context, live_url
        from django.db import connections

        connections.close_all()
        chromium.close()
    os.environ.pop("DJANGO_ALLOW_ASYNC_UNSAFE", None)


def login(context, base: str, user) -> None:
    """A session made on the server side, handed to the browser (no login POST in what is recorded)."""
    client = Client()
    client.force_login(user)
    cookie = client.cookies["sessionid"]
    context.add_cookies([{"name": "sessionid", "value": cookie.value, "url": base}])


def json_text(payload: str) -> str:
    """How a payload reads inside a preview (the body as indented JSON)."""
    return payload.replace("\\", "\\\\").replace('"', '\\"')


def python_text(payload: str) -> str:
    """How a payload reads inside an artifact's content (a Python repr of the JSON)."""
    return repr(payload)[1:-1]


# --- the test -------------------------------------------------------------------------------------------
def test_the_xss_corpus_stays_text_on_every_dashboard_page(
    transactional_db, worker, browser, monkeypatch, django_user_model
):
    xss, propose = xss_workflows()
    ada = django_user_model.objects.create_user(username="ada", password="ada-pass-12345")
    membership_grant(user=ada, project=default_project(), role="admin")
    stopped = settled(
        run_start(workflow=xss.slug, goal=JOINED, input=run_input()),
        Run.Status.NEEDS_ATTENTION,
    )
    proposed = settled(
        run_start(workflow=propose.slug, goal=JOINED, input=run_input(propose_tools=["tickets.create"])),
        Run.Status.WAITING_FOR_APPROVAL,
    )
    assert JOINED in stopped.status_reason
    assert Task.objects.get(run=stopped, key="write").status == Task.Status.COMPLETED
    assert ApprovalRequest.objects.filter(run=proposed, status="pending").exists()

    context, base = browser
    login(context, base, ada)
    page = Browser(context.new_page(), base)

    for run in (stopped, proposed):
        rid = run.id
        on_run_page = [
            rf"/runs/{rid}/",
            rf"/runs/{rid}/live(\?.*)?",
            rf"/runs/{rid}/timeline",
            rf"/runs/{rid}/spans/\d+/children",
            rf"/runs/{rid}/spans/\d+/payload\?preview=1",
            rf"/ws/runs/{rid}/",
        ]
        # The whole tree, drawn open: open the calls and fetch every preview.
        page.goto(f"/runs/{rid}/")
        page.check(on_run_page, texts=[JOINED])
        done = page.open_everything()
        text = page.check(on_run_page, texts=[JOINED, json_text(CORPUS[2]), json_text(JOINED)])
        assert done["shown"] == Span.objects.filter(run=run, kind__in=["model_call", "tool_call"]).count()
        for payload in CORPUS:
            assert python_text(payload) in text  # the artifact's content
        # The same run as a large one is drawn: tasks first, their subtrees fetched when opened.
        with monkeypatch.context() as m:
            m.setattr("dashboard.trace.FULL_TREE_MAX", 2)
            m.setattr("dashboard.trace.EAGER_SUBTREE_MAX", 1)
            page.page.evaluate("localStorage.clear()")
            page.goto(f"/runs/{rid}/")
            done = page.open_everything()
            assert done["lazy"] >= 2 and done["shown"] >= 4, done
            page.check(on_run_page, texts=[JOINED, json_text(JOINED)])
        # Fragments and the page without htmx, opened on their own.
        task_span = Span.objects.filter(run=run, kind="task").first()
        call = Span.objects.filter(run=run, kind="model_call").first()
        for path in (
            f"/runs/{rid}/live",
            f"/runs/{rid}/timeline",
            f"/runs/{rid}/spans/{task_span.id}/children",
            f"/runs/{rid}/spans/{call.id}/payload?preview=1",
        ):
            page.goto(path)
            page.open_everything()
            page.check(on_run_page, texts=[] if "timeline" in path else [CORPUS[0]])

    page.goto("/runs/")
    page.open_everything()
    page.check([r"/runs/", r"/ws/runs/"], texts=[CORPUS[0], CORPUS[1][:20]])
    assert page.page.locator(f"#run-row-{stopped.id} .goal").get_attribute("title").startswith(CORPUS[0])

    page.goto("/approvals/")
    page.page.wait_for_selector(".card.pending")
    page.page.wait_for_timeout(3500)  # one poll for new cards
    page.open_everything()
    page.check([r"/approvals/", r"/approvals/new(\?.*)?"], texts=[f"Filing {SHORT}", SHORT])

    page.goto("/inbox/")
    page.open_everything()
    page.check([r"/inbox/(\?.*)?"], texts=["model call failed: <script>alert(1)</script>"])

    page.goto("/insight/")
    page.open_everything()
    page.check([r"/insight/(\?.*)?"], texts=[xss.name, 'Breaker "><svg onload=alert(1)>'])
