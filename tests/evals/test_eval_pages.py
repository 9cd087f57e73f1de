"""Evaluations on the pages: a reviewer scores a run's verdict from the run page, an operator adds the run
to a suite as a case in two clicks, and the suite's comparison shows the judges' scores, their
(escaped) reasoning and a chart of each figure across the passes, with the single-agent baseline kept
as a column."""

import re

import pytest

from agents.models import Agent
from evals.demo import demo_suite_load
from evals.judge import eval_grade
from evals.models import Annotation, EvalCase, EvalRun
from evals.suites import eval_start
from runs.services import run_start
from tenancy.access import default_project, membership_grant
from tests.evals.test_eval_checks import confident  # noqa: F401  (the fixture)
from tests.runs.test_run_actions import drive


@pytest.fixture
def suite(confident):  # noqa: F811
    return demo_suite_load()


def _settle(eval_run: EvalRun) -> None:
    for result in eval_run.results.select_related("run"):
        drive(result.run)
        eval_grade(result.id)  # judges, as the actor would after commit


def test_a_reviewed_run_becomes_a_case_in_two_clicks(suite, operator, client, django_user_model):
    run = drive(run_start(workflow="deploy-review", input={"model_version": "confident"}))
    verdict = run.artifacts.get(task__key="verify")
    reviewer = django_user_model.objects.create_user(username="rita", password="x")
    membership_grant(user=reviewer, project=default_project(), role="reviewer")
    client.force_login(reviewer)
    page = client.get(f"/runs/{run.id}/").content.decode()
    assert 'id="annotate-form"' in page and 'id="eval-case-form"' in page  # a reviewer may keep it as a case
    posted = client.post(
        f"/runs/{run.id}/annotate", {"target": f"artifact:{verdict.id}", "score": "1", "comment": "<b>right</b>"}
    )
    assert posted.status_code == 302
    assert client.post(f"/runs/{run.id}/annotate", {"target": "run", "score": "3"}).status_code == 400
    assert "&lt;b&gt;right&lt;/b&gt;" in client.get(f"/runs/{run.id}/").content.decode()
    assert Annotation.objects.count() == 1

    client.force_login(operator)
    page = client.get(f"/runs/{run.id}/").content.decode()
    assert 'id="annotate-form"' in page  # an admin of the project may review too
    # Click one: the suite (the only one, already chosen); click two: add.
    added = client.post(f"/runs/{run.id}/eval-case", {"suite": suite.id, "name": f"as run {run.id} ended"})
    assert added.status_code == 302 and added["Location"] == f"/evals/{suite.id}/"
    case = EvalCase.objects.get(from_run=run)
    assert case.checks == [{"status": "completed"}, {"artifact": "verify", "equals": verdict.content, "path": ""}]
    assert f"as run {run.id} ended" in client.get(f"/evals/{suite.id}/").content.decode()


def test_the_comparison_shows_judge_scores_charts_and_keeps_the_baseline(suite, confident, operator, client):  # noqa: F811
    Agent.objects.create(
        slug="judge", name="judge", script=[{"final": {"score": 0.75, "reasoning": "<script>x</script>"}}]
    )
    judge = {"agent": "judge", "artifact": "verify", "rubric": "Is the verdict justified?", "min_score": 0.5}
    EvalCase.objects.filter(suite=suite, name="stays cheap").update(checks=[{"max_cost_usd": 0.05}, {"judge": judge}])
    _settle(eval_start(suite=suite, baseline=True))
    for _ in range(4):  # four later passes: the baseline would scroll out of the last four
        _settle(eval_start(suite=suite, version=confident))
    client.force_login(operator)
    page = client.get(f"/evals/{suite.id}/").content.decode()
    headers = re.findall(r'<th scope="col">([^<]+)<br>', page)
    assert headers[0] == "single-agent baseline (current agents)" and len(headers) == 5
    assert page.count('<td class="eval-score">0.75</td>') == 5  # the baseline's verdict is judged too
    assert "&lt;script&gt;x&lt;/script&gt;" in page and "<script>x" not in page
    for figure in ("success", "cost-usd", "steps", "seconds", "judge-score"):
        assert f'id="chart-eval-{figure}"' in page
    assert "mean judge score by evaluation run: #" in page and ": 0.75" in page
    # The wide comparison scrolls sideways: it takes keyboard focus and is named (WCAG 2.1.1).
    assert '<div class="table-scroll" tabindex="0" role="region" aria-label="The latest evaluation runs">' in page


def test_the_suite_page_names_its_known_failures_and_its_accepted_passes(suite, operator, client):
    known = EvalCase.objects.get(suite=suite, name="stays cheap")
    EvalCase.objects.filter(id=known.id).update(name="<i>stays cheap</i>")
    suite.quarantine.add(known)
    accepted = eval_start(suite=suite)
    EvalRun.objects.filter(id=accepted.id).update(accepted=True)
    eval_start(suite=suite)
    client.force_login(operator)
    page = client.get(f"/evals/{suite.id}/").content.decode()
    listed = re.search(r'<section id="eval-quarantine">(.*?)</section>', page, re.S).group(1)
    assert re.findall(r'<li class="eval-quarantined">([^<]*)</li>', listed) == ["&lt;i&gt;stays cheap&lt;/i&gt;"]
    assert page.count('title="A known failure: run_evals forgives it">quarantined</span>') == 1
    assert page.count(">accepted</span>") == 1


def test_a_suite_quarantines_only_its_own_cases_in_the_admin(suite, django_user_model):
    from evals.admin import EvalSuiteForm
    from evals.models import EvalSuite

    other = EvalSuite.objects.create(slug="other", name="Other", project=default_project())
    stranger = EvalCase.objects.create(suite=other, name="elsewhere", workflow=suite.cases.first().workflow)
    data = {"slug": suite.slug, "name": suite.name, "project": suite.project_id, "rerun_on": "[]"}
    form = EvalSuiteForm(instance=suite, data={**data, "quarantine": [stranger.id]})
    assert not form.is_valid() and "quarantine" in form.errors
    own = suite.cases.first()
    form = EvalSuiteForm(instance=suite, data={**data, "quarantine": [own.id]})
    assert form.is_valid(), form.errors
    form.save()
    assert list(suite.quarantine.all()) == [own]
