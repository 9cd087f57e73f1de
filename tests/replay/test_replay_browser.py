"""Trying a change on past runs in a real browser (Playwright + Debian's Chromium) against real server
processes: from the agent's admin page to the replay's page, which settles without a reload, to a pair
side by side with its first divergence marked. The pages pass axe-core's WCAG 2 A/AA checks and are
captured for docs/replay.md (docs/screenshots/, refreshed with WARDEN_SCREENSHOTS)."""

import json
import os

import pytest
from django.contrib.auth.models import Permission

from agents.models import Agent
from replay.models import Replay
from runs.models import Run
from tenancy.access import default_project, membership_grant
from tests.conftest import wait_for
from tests.replay.test_replay import follow_up_script
from tests.runs.test_dashboard_browser import (  # noqa: F401  (browser: the fixture)
    SCREENSHOTS,
    Warden,
    accessibility_violations,
    browser,
)

pytestmark = [pytest.mark.browser, pytest.mark.processes]
CAPTURE = bool(os.environ.get("WARDEN_SCREENSHOTS"))  # a plain run writes no file


def capture(page, name: str, *, whole: bool = True) -> None:
    if CAPTURE:
        page.screenshot(path=SCREENSHOTS / name, full_page=whole)
        assert (SCREENSHOTS / name).stat().st_size > 10_000, name


@pytest.fixture
def agent_admin(django_user_model):
    """The project's admin, with the staff access to the admin site its agents' pages need."""
    user = django_user_model.objects.create_user(username="ada", password="admin-pass-1234", is_staff=True)
    membership_grant(user=user, project=default_project(), role="admin")
    user.user_permissions.set(Permission.objects.filter(content_type__app_label="agents", codename__startswith="view"))
    return user


def test_an_admin_tries_a_draft_from_the_agents_page_and_sees_where_it_diverges(
    demo_tx,
    agent_admin,
    processes,
    browser,  # noqa: F811
):
    warden = Warden(processes)
    runs = [warden.run_start(agent_admin, "incident-fanout") for _ in range(2)]
    wait_for(lambda: Run.objects.filter(id__in=[r.id for r in runs], status__in=Run.TERMINAL).count() == 2,
             timeout=60, message="the originals to finish")  # fmt: skip
    page = warden.login(browser, "ada", "admin-pass-1234")
    agent = Agent.objects.get(slug="incident-worker")
    page.goto(f"{warden.url}/admin/agents/agent/{agent.id}/change/")
    page.click("text=Try a change on past runs")
    page.wait_for_selector("#replay-form")
    assert "/replays/new?agent=incident-worker" in page.url
    assert page.input_value("#replay-agent") == "incident-worker"
    assert page.locator("#replay-preview a").count() == 2  # the latest settled runs it would replay
    violations = {"/replays/new": accessibility_violations(page)}

    page.check("#candidate-draft")
    page.fill("#replay-edits", json.dumps({"script": follow_up_script()}, indent=1))
    page.fill("#replay-note", "a follow-up e-mail?")
    page.click("text=Start the replay")
    page.wait_for_selector("#replay-live")
    replay = Replay.objects.get()
    assert page.url == f"{warden.url}/replays/{replay.id}/"
    navigations = []
    page.evaluate("window.__marker = 1")
    page.on("framenavigated", lambda frame: frame == page.main_frame and navigations.append(frame.url))
    # The page polls its live part until every replay run has settled: no reload.
    page.wait_for_selector('#replay-live[data-settled="true"]', timeout=60_000)
    assert page.evaluate("window.__marker") == 1 and navigations == []
    assert page.inner_text("#total-differing") == "2" and page.inner_text("#total-irreversible") == "10"
    violations[f"/replays/{replay.id}/"] = accessibility_violations(page)
    capture(page, "replay-page.png")

    page.click(f"#pair-{replay.pairs.order_by('id').first().run_id} a.pair-link")
    page.wait_for_selector("#side-by-side")
    marked = page.locator("tr.diverges#first-divergence")
    assert marked.count() == 1 and "first divergence" in marked.inner_text()
    assert page.locator("#calls-added tr.irreversible-row").count() == 5
    violations["pair"] = accessibility_violations(page)
    capture(page, "replay-pair.png", whole=False)  # the verdict and the calls added; the steps below
    page.click("text=First divergence")
    assert page.url.endswith("#first-divergence")
    capture(page, "replay-divergence.png", whole=False)

    page.goto(f"{warden.url}/replays/")
    violations["/replays/"] = accessibility_violations(page)
    assert {k: v for k, v in violations.items() if v} == {}, json.dumps(violations, indent=1)
