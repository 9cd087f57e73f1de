"""The reviewer queue in a real browser (Debian's Chromium driven by Playwright): a request appears
without a reload, the countdown runs, keyboard shortcuts decide, markup from the model stays text."""

import os
from pathlib import Path

import pytest
from playwright.sync_api import expect

from policy.models import ApprovalPolicy, ApprovalRequest
from runs.models import Run
from runs.services import run_start
from tenancy.access import default_project, membership_grant
from tests.conftest import CHROMIUM, wait_for
from tests.conftest import CHROMIUM_ARGS as ARGS
from tests.runs.test_engine import scripted_workflow
from tools.models import SandboxCall

pytestmark = pytest.mark.browser


@pytest.fixture
def browser_page():
    if not Path(CHROMIUM).exists():
        pytest.skip("Debian's chromium is not installed (apt-get install -y chromium)")
    # Playwright's sync API runs an event loop in this thread; the test's own ORM calls are still sync.
    os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = "true"
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        page = browser.new_page()
        dialogs = []
        page.on("dialog", lambda d: (dialogs.append(d.message), d.dismiss()))
        page.dialogs = dialogs
        yield page
        # Queries made while Playwright's loop runs use a connection of their own context: close it here.
        from django.db import connections

        connections.close_all()
        browser.close()
    os.environ.pop("DJANGO_ALLOW_ASYNC_UNSAFE", None)


def test_the_queue_shows_new_requests_live_and_decides_from_the_keyboard(
    demo_tx, worker, live_url, django_user_model, browser_page
):
    ApprovalPolicy.objects.create(name="mail", tool="email.send", expires_after_seconds=600)
    script = [
        {
            "say": "Mailing <img src=x onerror=alert(1)>",
            "tool": "email.send",
            "arguments": {"to": "a@x.example", "subject": "Hello", "body": "b"},
        },
        {"final": {"outcome": "{last}"}},
    ]
    wf = scripted_workflow("mailer", script, tools=["email.send"])
    rita = django_user_model.objects.create_user(username="rita", password="rita-pass-123")
    membership_grant(user=rita, project=default_project(), role="reviewer")
    first = run_start(workflow=wf.slug)
    wait_for(lambda: ApprovalRequest.objects.filter(run=first).exists(), message="the first request")

    page = browser_page
    page.goto(f"{live_url}/login/?next=/approvals/")
    page.fill("#id_username", "rita")
    page.fill("#id_password", "rita-pass-123")
    page.click("input[type=submit]")
    page.wait_for_selector(".card.pending")
    assert page.locator(".card.pending").count() == 1
    # Locator assertions, not wait_for_function: the page's CSP forbids eval, which that one needs.
    expect(page.locator(".countdown").first).to_contain_text("expires in 9m")
    assert "<img" in page.locator(".reason").inner_text()  # shown as text, never run

    second = run_start(workflow=wf.slug)  # appears without a reload
    expect(page.locator(".card.pending")).to_have_count(2, timeout=15_000)

    page.keyboard.press("j")  # the oldest
    page.keyboard.press("a")
    page.wait_for_selector(f"#request-{ApprovalRequest.objects.get(run=first).id} >> text=Approved by rita")
    page.keyboard.press("j")
    page.keyboard.press("r")  # no comment yet: the comment field takes the focus
    page.keyboard.type("not twice in a row")
    page.locator(f"#request-{ApprovalRequest.objects.get(run=second).id} button.reject").click()
    page.wait_for_selector(f"#request-{ApprovalRequest.objects.get(run=second).id} >> text=Rejected")

    wait_for(lambda: Run.objects.get(id=first.id).status == Run.Status.COMPLETED, message="the approved run")
    wait_for(lambda: Run.objects.get(id=second.id).status == Run.Status.COMPLETED, message="the rejected run")
    assert SandboxCall.objects.filter(tool="email.send", is_effect=True).count() == 1
    assert page.dialogs == []  # the markup in the agent's words never ran
