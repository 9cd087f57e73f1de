"""Reference evaluations: a suite of three cases runs against two versions of the agents, and the
comparison page shows where they differ. Only people of the suite's project see or run it."""

import pytest

from agents.models import ModelVersion
from evals.compare import comparison
from evals.demo import demo_suite_load
from evals.models import EvalResult
from runs.models import Run
from tenancy.access import default_project, membership_grant
from tenancy.models import AuditEvent, Project
from tests.conftest import wait_for


@pytest.fixture
def suite(demo_tx):
    return demo_suite_load()  # the demo's: three cases on deploy-review, and the strict-verifier version


def test_two_versions_of_the_agents_compared_on_three_reference_tasks(suite, operator, client, worker):
    client.force_login(operator)
    assert client.post(f"/evals/{suite.id}/run", {"version": ""}).status_code == 302
    version = ModelVersion.objects.get(slug="strict-verifier")
    assert client.post(f"/evals/{suite.id}/run", {"version": version.id}).status_code == 302
    wait_for(lambda: all(r.is_terminal for r in Run.objects.all()) and Run.objects.count() == 6, timeout=90,
             message="six runs")  # fmt: skip

    # Judged when each run ended, before anyone looked; looking changes nothing.
    verdicts = list(EvalResult.objects.order_by("id").values_list("passed", "failures"))
    assert None not in [passed for passed, _ in verdicts]
    cases, (current, strict) = comparison(suite)
    assert (current.eval_run.label, strict.eval_run.label) == ("current agents", "strict-verifier")
    assert (current.passed, current.judged, strict.passed, strict.judged) == (3, 3, 2, 3)
    assert strict.steps > current.steps and strict.cost_micros > current.cost_micros
    failed = EvalResult.objects.get(eval_run=strict.eval_run, passed=False)
    assert failed.case.name == "approves a safe deploy" and "does not say 'APPROVE'" in failed.failures[0]
    assert "REJECT" in str(failed.run.artifacts.get(task__key="verify").content)  # the version did run

    page = client.get(f"/evals/{suite.id}/").content.decode()
    assert "3/3 (100%)" in page and "2/3 (67%)" in page
    assert "does not say &#x27;APPROVE&#x27;" in page and f'href="/runs/{failed.run_id}/"' in page
    assert AuditEvent.objects.filter(action="evaluate").count() == 2
    assert list(EvalResult.objects.order_by("id").values_list("passed", "failures")) == verdicts


def test_the_multi_agent_workflow_is_compared_with_its_single_agent_baseline(suite, operator, client, worker):
    client.force_login(operator)
    assert "on the single-agent baseline workflows" in client.get(f"/evals/{suite.id}/").content.decode()
    client.post(f"/evals/{suite.id}/run", {"version": "", "baseline": "on"})
    client.post(f"/evals/{suite.id}/run", {"version": ""})
    wait_for(lambda: all(r.is_terminal for r in Run.objects.all()) and Run.objects.count() == 6, timeout=90,
             message="six runs")  # fmt: skip
    baseline_runs = Run.objects.filter(workflow__slug="deploy-review-solo")
    assert baseline_runs.count() == 3 and {r.status for r in baseline_runs} == {"completed"}

    cases, (base, multi) = comparison(suite)
    assert base.eval_run.label == "single-agent baseline (current agents)" and multi.eval_run.label == "current agents"
    assert (base.passed, multi.passed) == (3, 3)
    against = multi.against(base)
    # Three agents take more steps and cost more than one for the same verdicts: no gain in success.
    assert against["success"] == 0 and against["steps"] > 1 and against["cost"] > 1
    page = client.get(f"/evals/{suite.id}/").content.decode()
    assert "Beside the baseline" in page
    assert f"steps ×{against['steps']:.2f}" in page and "success +0 points" in page


def test_a_baseline_evaluation_of_a_suite_without_baselines_is_refused(suite, operator):
    from core.errors import InvalidInput
    from evals.suites import eval_start

    suite.cases.update(baseline_workflow=None)
    with pytest.raises(InvalidInput, match="names a single-agent baseline"):
        eval_start(suite=suite, baseline=True, user=operator)
    assert not Run.objects.exists() and not suite.eval_runs.exists()


def test_an_outsider_sees_no_suite_and_a_viewer_cannot_run_one(suite, client, django_user_model):
    outsider = django_user_model.objects.create_user(username="otto", password="x")
    membership_grant(user=outsider, project=Project.objects.create(slug="other", name="Other"), role="admin")
    client.force_login(outsider)
    assert "Deploy reviews" not in client.get("/evals/").content.decode()
    assert client.get(f"/evals/{suite.id}/").status_code == 404
    assert client.post(f"/evals/{suite.id}/run", {"version": ""}).status_code == 404
    viewer = django_user_model.objects.create_user(username="vera", password="x")
    membership_grant(user=viewer, project=default_project(), role="viewer")
    client.force_login(viewer)
    assert client.get(f"/evals/{suite.id}/").status_code == 200
    assert client.post(f"/evals/{suite.id}/run", {"version": ""}).status_code == 403
    assert client.get(f"/evals/{suite.id}/run").status_code == 405
    assert not Run.objects.exists()


def test_a_run_naming_an_unknown_model_version_is_refused(demo):
    from core.errors import InvalidInput
    from runs.services import run_start

    with pytest.raises(InvalidInput, match="unknown model version"):
        run_start(workflow="deploy-review", input={"model_version": "nope"})
    assert not Run.objects.exists()
