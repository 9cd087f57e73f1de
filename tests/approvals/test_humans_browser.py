"""The human side in a real browser (Playwright + Debian's Chromium) against real server processes: the
two-login demo a newcomer follows (one starts a propose-mode drill, the other approves it from the inbox,
whose count in the nav rises without a reload), a plan held for approval before any worker starts, and an
agent's question answered from the inbox.
Pages are captured for docs/screenshots/."""

import re
from io import StringIO

import pytest
from django.core.management import call_command

from agents.models import Workflow
from policy.models import ApprovalRequest
from runs.models import Run, Task
from tests.conftest import wait_for
from tests.runs.test_dashboard_browser import SCREENSHOTS, Warden, browser  # noqa: F401  (the fixture)
from tools.models import SandboxCall

pytestmark = [pytest.mark.browser, pytest.mark.processes]


def _demo_logins() -> dict:
    out = StringIO()
    call_command("setup_demo", stdout=out)
    return dict(re.findall(r"^(\w+) login: username \w+, password (\S+)$", out.getvalue(), re.M))


def _count(page) -> int:
    text = page.inner_text("#inbox-count").strip()
    return int(text) if text.isdigit() else 0


def test_a_newcomer_starts_a_drill_as_demo_and_approves_it_as_reviewer_from_the_inbox(
    transactional_db,
    processes,
    browser,  # noqa: F811
):
    logins = _demo_logins()
    warden = Warden(processes)
    reviewer = warden.login(browser, "reviewer", logins["reviewer"])
    reviewer.goto(f"{warden.url}/runs/")
    reviewer.wait_for_function("() => (document.querySelector('#inbox-count')?.textContent || '').trim() !== ''")
    before = _count(reviewer)
    reviewer.evaluate("window.__marker = 1")

    demo = warden.login(browser, "demo", logins["demo"])  # another window: the person who starts runs
    demo.goto(f"{warden.url}/runs/start")
    demo.select_option("select[name=drill]", "fanout-propose")
    demo.screenshot(path=SCREENSHOTS / "start-a-drill.png", full_page=True)
    demo.click("button.primary")
    demo.wait_for_url(re.compile(r"/runs/\d+/$"))
    run = Run.objects.get(id=int(demo.url.rstrip("/").rsplit("/", 1)[1]))

    # The reviewer's nav count rises, live, on the page they had open.
    reviewer.wait_for_function(
        "n => Number(document.querySelector('#inbox-count').textContent.trim() || 0) > n", arg=before, timeout=60_000
    )
    assert reviewer.evaluate("window.__marker") == 1, "the page was reloaded"
    request = ApprovalRequest.objects.get(run=run, parent=None)

    reviewer.goto(f"{warden.url}/inbox/")
    item = reviewer.locator(
        f'.inbox-item.approval >> text="Proposed operations, executed together in run {run.id} (incident-fanout)"'
    )
    item.wait_for()
    reviewer.screenshot(path=SCREENSHOTS / "inbox.png", full_page=True)
    reviewer.keyboard.press("j")
    reviewer.keyboard.press("Enter")
    card = reviewer.locator(f"#request-{request.id}.card.pending")
    card.wait_for()
    assert '"to":' in card.locator("pre.args").first.inner_text()  # JSON, not a Python repr
    # The one who started the run sees why not, instead of the buttons.
    demo.goto(f"{warden.url}/approvals/")
    own = demo.locator(f"#request-{request.id}")
    own.wait_for()
    assert own.locator("button.approve").count() == 0 and "another reviewer decides" in own.inner_text()

    card.locator("button.approve").click()
    reviewer.wait_for_selector(f"#request-{request.id} >> text=Approved by reviewer", timeout=15_000)
    wait_for(lambda: Run.objects.get(id=run.id).status == Run.Status.COMPLETED, timeout=60, message="the run")
    assert SandboxCall.objects.filter(tool="email.send", is_effect=True).count() == 5
    demo.goto(f"{warden.url}/runs/{run.id}/")
    demo.wait_for_selector("#run-header .badge.s-completed", timeout=30_000)


def test_a_reviewer_approves_a_plan_before_any_worker_starts(transactional_db, processes, browser):  # noqa: F811
    logins = _demo_logins()
    Workflow.objects.filter(slug="incident-fanout").update(approve_plans=True)
    warden = Warden(processes)
    demo = warden.login(browser, "demo", logins["demo"])
    demo.goto(f"{warden.url}/runs/start")
    demo.select_option("select[name=drill]", "fanout-plain")
    demo.click("button.primary")
    demo.wait_for_url(re.compile(r"/runs/\d+/$"))
    run = Run.objects.get(id=int(demo.url.rstrip("/").rsplit("/", 1)[1]))
    wait_for(lambda: ApprovalRequest.objects.filter(run=run, kind="plan").exists(), timeout=60, message="the plan")
    assert not Task.objects.filter(run=run, key__startswith="worker-").exists()

    reviewer = warden.login(browser, "reviewer", logins["reviewer"])
    reviewer.goto(f"{warden.url}/approvals/")
    plan = ApprovalRequest.objects.get(run=run, kind="plan")
    card = reviewer.locator(f"#request-{plan.id}.card.pending")
    card.wait_for()
    assert card.locator("table.plan tbody tr").count() == 6  # five workers and the summary
    assert "irreversible calls it may make: email.send" in card.inner_text()
    reviewer.screenshot(path=SCREENSHOTS / "plan-approval.png", full_page=True)
    card.locator("button.approve").click()
    reviewer.wait_for_selector(f"#request-{plan.id} >> text=Approved by reviewer", timeout=15_000)
    wait_for(lambda: Run.objects.get(id=run.id).status == Run.Status.COMPLETED, timeout=90, message="the run")


def test_an_agent_asks_and_the_reviewer_answers_from_the_inbox(transactional_db, processes, browser):  # noqa: F811
    from approvals.models import Question
    from runs.models import Artifact

    logins = _demo_logins()
    warden = Warden(processes)
    demo = warden.login(browser, "demo", logins["demo"])
    demo.goto(f"{warden.url}/runs/start")
    demo.select_option("select[name=workflow]", "ask-a-human")
    demo.click("button.primary")
    demo.wait_for_url(re.compile(r"/runs/\d+/$"))
    run = Run.objects.get(id=int(demo.url.rstrip("/").rsplit("/", 1)[1]))
    question = wait_for(lambda: Question.objects.filter(run=run, status="pending").first(), timeout=60,
                        message="the agent's question")  # fmt: skip
    # The question is committed with its intent; the task parks (gives its worker back) just after.
    wait_for(lambda: not run.tasks.filter(status="running").exists(), timeout=30, message="the task to park")

    reviewer = warden.login(browser, "reviewer", logins["reviewer"])
    reviewer.goto(f"{warden.url}/inbox/?kind=question")
    card = reviewer.locator(f"#question-{question.id}")
    card.wait_for()
    assert "Which release window should the checkout deployment use?" in card.inner_text()
    reviewer.screenshot(path=SCREENSHOTS / "question.png", full_page=True)
    card.locator("button", has_text="tomorrow morning").click()
    reviewer.wait_for_selector(f"#question-{question.id} >> text=Answered by reviewer", timeout=15_000)
    wait_for(lambda: Run.objects.get(id=run.id).status == Run.Status.COMPLETED, timeout=60, message="the run")
    assert Artifact.objects.get(run=run).content == {"summary": "Release window chosen by a person: tomorrow morning"}
