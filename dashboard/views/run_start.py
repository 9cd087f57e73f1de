"""Start a run of a workflow from the dashboard, with the drill input (faults, propose mode)."""

import json

from django.contrib.auth.decorators import login_required
from django.shortcuts import redirect, render

from agents.models import Workflow
from core.errors import WardenError
from runs.services import run_start as service_run_start
from tenancy.access import authorize, default_project, project_ids

EXAMPLE_INPUT = '{"faults": [], "propose_tools": []}'


def _workflows(user):
    starting = project_ids(user, "start")
    workflows = Workflow.objects.select_related("project").order_by("slug")
    default = default_project()
    if starting is None:
        return list(workflows)
    return [w for w in workflows if (w.project_id or default.id) in starting]


@login_required
def run_start(request):
    workflows = _workflows(request.user)
    form = {"workflow": request.POST.get("workflow", ""), "goal": request.POST.get("goal", "")}
    form["input"] = request.POST.get("input", EXAMPLE_INPUT)
    error = ""
    if request.method == "POST":
        try:
            workflow = next((w for w in workflows if w.slug == form["workflow"]), None)
            if workflow is None:
                raise WardenError("choose a workflow you may start runs of")
            try:
                data = json.loads(form["input"] or "{}")
            except json.JSONDecodeError as exc:
                raise WardenError(f"the input is not JSON: {exc}") from exc
            if not isinstance(data, dict):
                raise WardenError("the input must be a JSON object")
            project = workflow.project or default_project()
            authorize(request.user, project.id, "start", what=f"project {project.slug}", request=request)
            run = service_run_start(
                workflow=workflow.slug,
                input=data,
                goal=form["goal"].strip(),
                started_by=request.user,
                project=project,
                via="page",
                request=request,
            )
            return redirect("runs:detail", run_id=run.id)
        except WardenError as exc:
            error = str(exc)
            for detail in getattr(exc, "errors", []) or []:
                error += f" — {detail['field']}: {detail['message']}"
    status = 400 if error else 200
    context = {"workflows": workflows, "form": form, "error": error}
    return render(request, "runs/start.html", context, status=status)
