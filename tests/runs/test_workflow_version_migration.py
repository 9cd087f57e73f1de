"""runs.0024 pins every run that existed before it to a workflow version: the one it recorded at its
start, else the workflow's version as it is at the upgrade (docs/agents.md, "Versions")."""

import pytest

from tests.migrating import as_it_was, migrated_back

BEFORE = ("runs", "0023_worker_process")


@pytest.mark.django_db(transaction=True)
def test_runs_made_before_the_upgrade_get_the_version_they_started_with_or_the_current_one():
    with migrated_back(as_it_was(BEFORE)) as old:
        project = old.get_model("tenancy", "Project").objects.create(slug="ops", name="Ops")
        Workflow = old.get_model("agents", "Workflow")
        wf = Workflow.objects.create(slug="w", name="W", max_replans=1)
        v1 = old.get_model("agents", "WorkflowVersion").objects.create(
            workflow=wf, number=1, config={"max_replans": 1}, digest="x" * 64
        )
        Run = old.get_model("runs", "Run")
        recorded = Run.objects.create(
            workflow=wf, project=project, goal="g", code_version="c", versions={"workflow": {"id": v1.id, "version": 1}}
        )
        Workflow.objects.filter(id=wf.id).update(max_replans=2)  # edited since, around save()
        unrecorded = Run.objects.create(workflow=wf, project=project, goal="g", code_version="c", versions={})

    from runs.models import Run as NowRun
    from runs.selectors import run_workflow_settings

    recorded, unrecorded = NowRun.objects.get(id=recorded.id), NowRun.objects.get(id=unrecorded.id)
    assert recorded.workflow_version_id == v1.id and run_workflow_settings(recorded).max_replans == 1
    assert unrecorded.workflow_version.number == 2 and run_workflow_settings(unrecorded).max_replans == 2
    assert unrecorded.versions["workflow"] == {"id": unrecorded.workflow_version_id, "version": 2}
