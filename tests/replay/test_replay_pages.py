"""The replay pages (dashboard/views/replays.py): try a change on past runs from a form, watch the replay
settle, and read a pair side by side with its first divergence marked. Finished incident-fanout runs are
the originals, as in tests/replay/test_replay.py."""

import json
import re

import pytest
from django.contrib.auth.models import Permission

from agents.demo import WORKER_TURNS
from agents.models import Agent, AgentVersion, Workflow
from replay.models import Replay
from replay.selectors import pair_side_by_side
from replay.services import replay_start
from runs.models import Run
from runs.services import run_start
from tenancy.access import default_project, membership_grant
from tenancy.models import Project
from tests.replay.test_replay import current_version, finished, follow_up_script, settled

WORKER_THREADS = 8  # the fan-out's five workers at once


@pytest.fixture
def originals(demo_tx, worker):
    runs = [finished(run_start(workflow="incident-fanout")) for _ in range(2)]
    assert all(r.status == Run.Status.COMPLETED for r in runs), [r.status_reason for r in runs]
    return runs


@pytest.fixture
def people(django_user_model):
    """An operator and a viewer of the default project, its admin, and an admin of another project."""
    found = {}
    for role in ("operator", "viewer", "admin"):
        found[role] = django_user_model.objects.create_user(username=f"p-{role}", password="pass-12345678")
        membership_grant(user=found[role], project=default_project(), role=role)
    found["outsider"] = django_user_model.objects.create_user(username="p-outsider", password="pass-12345678")
    other = Project.objects.create(slug="elsewhere", name="Elsewhere")
    membership_grant(user=found["outsider"], project=other, role="admin")
    return found


def _form(**fields) -> dict:
    base = {"workflow": "incident-fanout", "project": "default", "status": "", "limit": "10", "runs": "",
            "agent": "incident-worker", "candidate": "version", "version": "", "edits": "", "note": ""}  # fmt: skip
    return {**base, **fields}


def _text(response) -> str:
    return response.content.decode()


def _started(client, **fields) -> Replay:
    response = client.post("/replays/new", _form(**fields))
    assert response.status_code == 303, _text(response)[:3000]
    replay = Replay.objects.order_by("-id").first()
    assert response["Location"] == f"/replays/{replay.id}/"
    return replay


def test_an_operator_tries_a_version_from_the_form_and_sees_no_difference(originals, people, client):
    client.force_login(people["operator"])
    form = client.get("/replays/new?agent=incident-worker")
    page = _text(form)
    assert form.status_code == 200
    assert '<option value="incident-fanout" selected>' in page and '<option value="incident-worker" selected>' in page
    assert all(f'href="/runs/{r.id}/"' in page for r in originals)  # the latest runs it would replay
    version = current_version("incident-worker")
    replay = _started(client, version=str(version), note="same worker, same runs?")
    assert sorted(replay.pairs.values_list("original_id", flat=True)) == sorted(r.id for r in originals)
    assert replay.candidate == {
        "agent": "incident-worker",
        "version": version,
        "draft": False,
        "edits": None,
        "workflow_version": None,
    }
    assert replay.created_by == people["operator"] and replay.live_reads is False
    assert 'name="live_reads"' in page  # opt-in, off unless ticked
    settled(replay)

    page = _text(client.get(f"/replays/{replay.id}/"))
    assert 'data-settled="true"' in page and 'hx-trigger="every 2s"' not in page
    totals = re.search(r'id="replay-totals">(.*?)</dl>', page, re.S).group(1)
    assert re.search(r"<dt>runs</dt><dd>2</dd>", totals) and 'id="total-differing">0<' in totals
    assert "same worker, same runs?" in page
    pair = _text(client.get(f"/replays/{replay.id}/runs/{originals[0].id}"))
    assert 'id="no-difference"' in pair and "No difference" in pair
    assert 'class="step diverges"' not in pair and "first divergence" not in pair
    # The journals side by side: every worker's steps, each answered from the original's ledger.
    assert pair.count('class="ops steps') == 7  # the planner, five workers and the summarizer
    assert "a-recorded" in pair and "a-not_sent" not in pair
    assert f'href="/replays/{replay.id}/"' in _text(client.get("/replays/"))


def test_a_draft_with_a_follow_up_email_is_marked_where_it_first_diverges(
    originals, people, client, django_assert_num_queries
):
    client.force_login(people["admin"])  # a draft is the agent's configuration: the project's admin's
    original = originals[0]
    edits = json.dumps({"script": follow_up_script()})
    replay = _started(client, runs=str(original.id), candidate="draft", edits=edits, workflow="", live_reads="on")
    assert replay.pairs.count() == 1 and replay.candidate_version.draft and replay.live_reads
    page = _text(client.get(f"/replays/{replay.id}/"))
    assert "replaying" in page or 'data-settled="true"' in page  # polls itself until settled
    if 'data-settled="false"' in page:
        assert f'hx-get="/replays/{replay.id}/" hx-trigger="every 2s"' in page
        fragment = _text(client.get(f"/replays/{replay.id}/", headers={"HX-Request": "true"}))
        assert fragment.lstrip().startswith('<section id="replay-live"') and "<header" not in fragment
    settled(replay)

    page = _text(client.get(f"/replays/{replay.id}/"))
    assert 'id="total-differing">1<' in page and 'id="total-irreversible">5<' in page
    assert '<span class="badge draft">draft</span> changing script' in page
    pair = _text(client.get(f"/replays/{replay.id}/runs/{original.id}"))
    added = re.search(r'id="calls-added">(.*?)</section>', pair, re.S).group(1)
    tools = re.findall(r"<td hx-disable>([a-z.]+)</td>", added)
    assert tools == ["email.send"] * 5 + ["crm.update"] * 5  # irreversible first
    assert added.count("a-not_sent") == 10
    # The first divergence: marked, anchored, linked from the top, in the task and step the diff names.
    assert pair.count('id="first-divergence"') == 1 and pair.count(">first divergence</span>") == 1
    marked = re.search(r'<tr class="step differs diverges" id="first-divergence">\s*<th scope="row">(\d+)', pair)
    assert marked and int(marked.group(1)) >= 9, pair[:2000]
    assert 'href="#first-divergence"' in pair
    table = pair[: pair.index('id="first-divergence"')].rsplit('<table class="ops steps', 1)[1]
    assert re.search(r"<caption><strong>worker-\d</strong>", table)
    # Both journals side by side in four queries, whatever the number of tasks and steps.
    replayed = replay.pairs.get().run_id
    with django_assert_num_queries(4):
        side = pair_side_by_side(original.id, replayed)
    assert side["steps"][1] > side["steps"][0] and len(side["tasks"]) == 7
    # The agent as it is, and what new runs start on, are unchanged.
    assert Agent.objects.get(slug="incident-worker").script == WORKER_TURNS


@pytest.mark.parametrize(
    "who, fields, status, message",
    [
        ("operator", {"status": "cancelled"}, 400, "no settled run of incident-fanout in default matches"),
        ("operator", {"runs": "12 and 13"}, 400, "run ids are numbers"),
        ("operator", {"runs": "99999999999999999999"}, 400, "run ids are numbers"),
        ("operator", {"version": "99999999999999999999"}, 400, "choose a version of the agent"),
        ("operator", {"agent": "nope", "version": "1"}, 400, "unknown agent"),
        ("operator", {"version": "999"}, 400, "has no version 999"),
        ("admin", {"candidate": "draft", "edits": "{not json"}, 400, "the edits are not JSON"),
        ("admin", {"candidate": "draft", "edits": '{"project": 7}'}, 400, "a draft may change only"),
        ("operator", {"candidate": "draft", "edits": '{"instructions": "be brief"}'}, 403, "may not"),
        ("outsider", {"version": "1", "runs": "{run}"}, 404, "does not exist"),
    ],
)
def test_bad_input_shows_a_clear_error_and_makes_nothing(originals, people, client, who, fields, status, message):
    client.force_login(people[who])
    fields = {k: v.replace("{run}", str(originals[0].id)) for k, v in fields.items()}
    fields.setdefault("version", str(current_version("incident-worker")))
    before = Replay.objects.count(), Run.objects.count(), AgentVersion.objects.filter(draft=True).count()
    response = client.post("/replays/new", _form(**fields))
    assert response.status_code == status, _text(response)[:2000]
    page = _text(response)
    error = re.search(r'<p class="error" role="alert" id="replay-error">(.*?)</p>', page, re.S)
    assert error and message in error.group(1), error and error.group(1)
    assert '<form method="post" action="/replays/new"' in page  # the form again, as it was filled in
    assert (Replay.objects.count(), Run.objects.count(), AgentVersion.objects.filter(draft=True).count()) == before


def test_a_viewer_cannot_start_a_replay_and_another_projects_replay_does_not_exist(originals, people, client):
    replay = replay_start(run_ids=[originals[0].id], agent="incident-worker",
                          version=current_version("incident-worker"), via="test")  # fmt: skip
    client.force_login(people["viewer"])
    assert client.get("/replays/new?agent=incident-worker").status_code == 403
    assert client.post("/replays/new", _form(version="1")).status_code == 403
    assert Replay.objects.count() == 1
    assert client.get(f"/replays/{replay.id}/").status_code == 200  # a viewer reads it
    client.force_login(people["outsider"])
    for url in (f"/replays/{replay.id}/", f"/replays/{replay.id}/runs/{originals[0].id}"):
        assert client.get(url).status_code == 404, url
    assert f"/replays/{replay.id}/" not in _text(client.get("/replays/"))
    client.force_login(people["operator"])
    assert client.get(f"/replays/{replay.id}/runs/{originals[1].id}").status_code == 404  # not one of its runs


def test_model_output_is_shown_as_text(originals, people, client):
    """A candidate whose model says and answers markup: the pair view shows it escaped, never as markup."""
    hostile = '<script>alert("x")</script><img src=x onerror=alert(1)>'
    script = [{"say": hostile, "tool": "crm.read", "arguments": {"customer_id": "cust-{task}"}},
              {"final": {"summary": hostile}}]  # fmt: skip
    client.force_login(people["admin"])
    replay = _started(client, runs=str(originals[0].id), candidate="draft", edits=json.dumps({"script": script}),
                      note=hostile)  # fmt: skip
    settled(replay)
    for url in (f"/replays/{replay.id}/", f"/replays/{replay.id}/runs/{originals[0].id}", "/replays/"):
        page = _text(client.get(url))
        assert "<script>alert" not in page and "<img src=x" not in page, url
        assert "&lt;script&gt;alert(" in page, url


def test_the_entries_lead_to_the_form(originals, people, client, django_user_model):
    """The run page of a settled live run, the agent's and the workflow's admin pages, and the nav."""
    client.force_login(people["operator"])
    run_page = _text(client.get(f"/runs/{originals[0].id}/"))
    link = re.search(r'<a class="button" id="replay-this" href="([^"]+)">Replay this run on a change', run_page)
    assert link and link.group(1) == f"/replays/new?runs={originals[0].id}"
    form = _text(client.get(link.group(1)))
    assert '<option value="incident-fanout" selected>' in form and f'value="{originals[0].id}"' in form
    assert 'id="nav-replays"' in run_page
    staff = django_user_model.objects.create_user(username="p-staff", password="pass-12345678", is_staff=True)
    membership_grant(user=staff, project=default_project(), role="admin")
    staff.user_permissions.set(Permission.objects.filter(content_type__app_label="agents", codename__startswith="view"))
    client.force_login(staff)
    agent, workflow = Agent.objects.get(slug="incident-worker"), Workflow.objects.get(slug="incident-fanout")
    for url, target in (
        (f"/admin/agents/agent/{agent.id}/change/", "/replays/new?agent=incident-worker"),
        (f"/admin/agents/workflow/{workflow.id}/change/", "/replays/new?workflow=incident-fanout"),
    ):
        response = client.get(url)
        assert response.status_code == 200, url
        assert f'href="{target}" class="replay-try" id="replay-try">Try a change on past runs</a>' in _text(response)
        assert client.get(target).status_code == 200


@pytest.mark.django_db
def test_the_list_reads_a_fixed_number_of_queries(people, client, django_assert_num_queries):
    project = default_project()
    client.force_login(people["viewer"])
    Replay.objects.create(project=project, candidate={"agent": "incident-worker", "version": 1})
    client.get("/replays/")  # sessions and the like, once
    with django_assert_num_queries(5) as one:
        assert client.get("/replays/").status_code == 200
    for n in range(4):
        Replay.objects.create(project=project, candidate={"agent": "incident-worker", "version": 2, "draft": True},
                              created_by=people["operator"], note=f"n{n}")  # fmt: skip
    with django_assert_num_queries(len(one.captured_queries)):
        page = _text(client.get("/replays/"))
    assert page.count('id="replay-row-') == 5
