"""The admin is for data fixes: every model is there, searchable; state changes go through services."""

import pytest
from django.apps import apps
from django.contrib import admin
from django.urls import reverse

from runs.models import Run, Task
from runs.services import run_start


@pytest.fixture
def admin_client(client, django_user_model):
    user = django_user_model.objects.create_superuser(username="root", password="root-pass-123", email="r@x.y")
    client.force_login(user)
    return client


def test_every_model_is_registered_and_its_list_searches(demo, admin_client):
    run_start(workflow="deploy-review")
    for app in ("runs", "agents", "tools", "approvals"):
        for model in apps.get_app_config(app).get_models():
            assert admin.site.is_registered(model), model
            url = reverse(f"admin:{app}_{model._meta.model_name}_changelist")
            response = admin_client.get(url, {"q": "deploy"})
            assert response.status_code == 200, url


def test_status_cannot_be_edited_in_the_form(demo, admin_client):
    run = run_start(workflow="deploy-review")
    url = reverse("admin:runs_run_change", args=[run.id])
    page = admin_client.get(url)
    assert page.status_code == 200
    admin_client.post(url, {"goal": "x", "status": "completed", "tasks-TOTAL_FORMS": "0", "tasks-INITIAL_FORMS": "0"})
    run.refresh_from_db()
    assert run.status == Run.Status.RUNNING


def test_cancel_action_goes_through_the_engine(demo, admin_client):
    running, finished = run_start(workflow="deploy-review"), run_start(workflow="deploy-review")
    Run.objects.filter(id=finished.id).update(status=Run.Status.COMPLETED)
    response = admin_client.post(
        reverse("admin:runs_run_changelist"),
        {"action": "cancel_runs", "_selected_action": [running.id, finished.id]},
        follow=True,
    )
    text = response.content.decode()
    assert f"run {finished.id} is completed; it cannot be cancelled (already finished)" in text
    running.refresh_from_db()
    assert running.status == Run.Status.CANCELLED
    assert set(running.tasks.values_list("status", flat=True)) == {Task.Status.CANCELLED}
    assert Run.objects.get(id=finished.id).status == Run.Status.COMPLETED


def test_start_action_on_a_workflow_starts_a_run(demo, admin_client):
    from agents.models import Workflow

    wf = Workflow.objects.get(slug="deploy-review")
    admin_client.post(
        reverse("admin:agents_workflow_changelist"), {"action": "start_runs", "_selected_action": [wf.id]}
    )
    run = Run.objects.get()
    assert run.workflow == wf and run.started_by.username == "root"


def test_people_without_staff_status_are_sent_to_log_in(demo, client, operator):
    client.force_login(operator)
    response = client.get(reverse("admin:runs_run_changelist"))
    assert response.status_code == 302 and "/admin/login/" in response["Location"]


def test_a_budget_raised_in_the_admin_lets_a_resumed_run_finish(demo_tx, admin_client, worker):
    from tests.conftest import wait_for

    run = run_start(workflow="deploy-review", budget={"max_steps": 2})
    wait_for(lambda: Run.objects.get(id=run.id).status == Run.Status.NEEDS_ATTENTION, message="the budget stop")
    # inventory and risk run in parallel: one or both stop on the budget; wait until neither is running
    wait_for(lambda: not run.tasks.filter(status="running").exists(), message="a quiet run")
    failed = list(Task.objects.filter(run=run, status=Task.Status.FAILED).values_list("id", flat=True))
    assert failed
    form = admin_client.get(reverse("admin:runs_run_change", args=[run.id])).context["adminform"].form
    data = {k: ("" if v is None else v) for k, v in form.initial.items() if k in form.fields}
    data.update({"max_steps": 50, "tasks-TOTAL_FORMS": "0", "tasks-INITIAL_FORMS": "0"})
    data["input"] = "{}"
    admin_client.post(reverse("admin:runs_run_change", args=[run.id]), data)
    assert Run.objects.get(id=run.id).max_steps == 50
    admin_client.post(reverse("admin:runs_task_changelist"), {"action": "retry_tasks", "_selected_action": failed})
    wait_for(lambda: Run.objects.get(id=run.id).status == Run.Status.COMPLETED, message="the resumed run")
