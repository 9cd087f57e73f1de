"""Start a run of a workflow from the dashboard, with the drill input (faults, propose mode)."""

import json

from django.contrib.auth.decorators import login_required
from django.shortcuts import redirect, render

from agents.models import Workflow
from core.errors import WardenError
from runs.services import run_start as service_run_start
from tenancy.access import authorize, default_project, project_ids

EXAMPLE_INPUT = '{"faults": [], "propose_tools": []}'
_W3 = {"task": "worker-3", "call": 4}
# Each drill of docs/scenarios.md as a choice: (key, workflow, label, input).
DRILLS = [
    ("deploy-plain", "deploy-review", "deploy-review: a plain run", {}),
    ("deploy-crash", "deploy-review", "deploy-review: the worker dies before verify (resume, never restart)",
     {"faults": [{"task": "verify", "at": "start", "mode": "crash"}]}),
    ("fanout-plain", "incident-fanout", "incident-fanout: a plain run", {}),
    ("fanout-propose", "incident-fanout", "incident-fanout: the e-mails wait for one approval (propose mode)",
     {"propose_tools": ["email.send"]}),
    ("fanout-transient", "incident-fanout", "incident-fanout: worker-3's e-mail fails once (resume from the journal)",
     {"faults": [{**_W3, "mode": "transient"}]}),
    ("fanout-timeout", "incident-fanout", "incident-fanout: worker-3's e-mail times out after it was sent (reconciled)",
     {"faults": [{**_W3, "mode": "timeout_after_commit"}]}),
    ("fanout-error", "incident-fanout", "incident-fanout: worker-3's e-mail fails for good (then compensate)",
     {"faults": [{**_W3, "mode": "error"}]}),
    ("fanout-lookup", "incident-fanout", "incident-fanout: a record change nobody can confirm (a person resolves it)",
     {"faults": [{"task": "worker-3", "call": 3, "mode": "timeout_no_lookup"}]}),
]  # fmt: skip


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
    form["drill"] = request.POST.get("drill", request.GET.get("drill", ""))
    drills = [d for d in DRILLS if any(w.slug == d[1] for w in workflows)]
    error = ""
    if request.method == "POST":
        try:
            drill = next((d for d in drills if d[0] == form["drill"]), None)
            if form["drill"] and drill is None:
                raise WardenError("choose one of the drills listed")
            if drill is not None:  # a drill names its workflow and input; the fields below are for the rest
                form["workflow"], form["input"] = drill[1], json.dumps(drill[3])
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
    context = {"workflows": workflows, "form": form, "error": error, "drills": [(d[0], d[2]) for d in drills]}
    return render(request, "runs/start.html", context, status=status)
