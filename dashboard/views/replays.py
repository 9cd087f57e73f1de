"""What-if replays from the dashboard (docs/replay.md): try a change of an agent on past runs, watch the
replay settle, and read what the candidate did differently, run by run and step by step.

Starting a replay is an operator's action on the runs' project; a draft's edits are the agent's
configuration, so they need the project's admin (as the API asks, api/replays.py). A replay of a project
the person is not a member of does not exist for them (404). GET reads; POST starts, through
replay.services.replay_start, and sends the browser to the replay's page (303). A refusal re-renders
the form with the reason, and nothing has been made.
"""

import json

from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.http import Http404
from django.shortcuts import render
from django.urls import reverse
from django.views.decorators.http import require_GET, require_http_methods

from core.errors import InvalidInput, NotFound, WardenError
from dashboard.trace import KIND_LABELS
from replay import selectors
from replay.services import EDITABLE, MAX_RUNS, SETTLED, replay_diff, replay_settled, replay_start
from tenancy.access import authorize, default_project, project_ids
from tenancy.audit import audit
from tenancy.models import Project

from .common import authorized
from .run_actions import _describe, _see_other, _status

DEFAULT_LIMIT = 10
ID_MAX = 2**63 - 1  # a number no database column can hold is no run and no version
SUMMARY_CHARS = 160
USAGE = (("status", "status"), ("steps", "steps"), ("tokens", "tokens"), ("cost (USD)", "cost_usd"),
         ("seconds", "seconds"))  # fmt: skip
EDITS_PLACEHOLDER = '{"instructions": "…", "model": "…"}'


# --- try a change on past runs ------------------------------------------------------------------------------
def _invalid(field: str, message: str) -> InvalidInput:
    return InvalidInput(message, [{"field": field, "message": message}])


def _run_ids(text: str) -> list[int]:
    parts = [p for p in text.replace(",", " ").split() if p]
    try:
        ids = [int(p.lstrip("#")) for p in parts]
    except ValueError:
        raise _invalid("runs", "run ids are numbers, separated by commas or spaces") from None
    if any(not 1 <= i <= ID_MAX for i in ids):
        raise _invalid("runs", "run ids are numbers, separated by commas or spaces")
    return list(dict.fromkeys(ids))


def _limit(text: str) -> int:
    try:
        value = int(text or DEFAULT_LIMIT)
    except ValueError:
        raise _invalid("limit", "how many runs: a number") from None
    if not 1 <= value <= MAX_RUNS:
        raise _invalid("limit", f"how many runs: from 1 to {MAX_RUNS}")
    return value


def _edits(text: str) -> dict:
    try:
        edits = json.loads(text)
    except json.JSONDecodeError as exc:
        raise _invalid("edits", f"the edits are not JSON: {exc}") from None
    if not isinstance(edits, dict) or not edits:
        raise _invalid("edits", "the edits are a JSON object of the agent's fields")
    return edits


def _version(text: str) -> int:
    try:
        number = int(text)
    except ValueError:
        number = 0
    if not 1 <= number <= ID_MAX:
        raise _invalid("version", "choose a version of the agent")
    return number


def _choices(request, operable: list[int] | None, data) -> dict:
    """What the form offers and has chosen: the workflow, the project, the agent, its versions. A run
    named in ``runs`` (the run page's entry) chooses its workflow and project when none is asked for."""
    projects = list(Project.objects.order_by("slug"))
    if operable is not None:
        projects = [p for p in projects if p.id in operable]
    project_by_slug = {p.slug: p for p in projects}
    workflows = [w for w in selectors.replayable_workflows() if w.project_id is None or w.project_id in
                 {p.id for p in projects}]  # fmt: skip
    slug, agent, project_slug = data.get("workflow", ""), data.get("agent", "").strip(), data.get("project", "")
    runs_text = data.get("runs", "").strip()
    if runs_text and not slug:
        first = runs_text.replace(",", " ").split()[0].lstrip("#")
        run = selectors.run_for_replay_form(int(first)) if first.isdigit() and int(first) <= ID_MAX else None
        if run is not None and run.project_id in {p.id for p in projects}:  # others' runs stay unknown
            slug, project_slug = run.workflow.slug, project_slug or run.project.slug
    if not slug and agent:
        slug = next((w.slug for w in workflows if agent in selectors.workflow_agent_slugs(w)), "")
    workflow = next((w for w in workflows if w.slug == slug), None if slug else (workflows or [None])[0])
    agents = selectors.workflow_agent_slugs(workflow) if workflow else []
    agent = agent or (agents[0] if agents else "")
    offered = [workflow.project] if workflow is not None and workflow.project_id else projects
    default = next((p for p in offered if p.slug == default_project().slug), offered[0] if offered else None)
    project = project_by_slug.get(project_slug) if project_slug else default
    current = selectors.agent_current(agent) if agent else None
    return {
        "workflows": workflows,
        "workflow": workflow,
        "workflow_slug": slug,
        "projects": offered,
        "project": project,
        "agents": agents,
        "agent": agent,
        "versions": selectors.agent_versions(agent) if agent else [],
        "current": current,
        "current_config": json.dumps(
            {f: getattr(current, f) for f in EDITABLE}, indent=1, ensure_ascii=False, default=str
        ) if current else "",
    }  # fmt: skip


def _form(data, choices: dict) -> dict:
    versions = choices["versions"]
    return {
        "runs": data.get("runs", "").strip(),
        "status": data.get("status", "") if data.get("status", "") in SETTLED else "",
        "limit": data.get("limit", str(DEFAULT_LIMIT)),
        "candidate": "draft" if data.get("candidate") == "draft" else "version",
        "version": data.get("version") or (str(versions[0].number) if versions else ""),
        "edits": data.get("edits", ""),
        "note": data.get("note", ""),
        "live_reads": data.get("live_reads") == "on",
    }


def _chosen_runs(form: dict, choices: dict) -> list[int]:
    if form["runs"]:
        ids = _run_ids(form["runs"])
        if len(ids) > MAX_RUNS:
            raise _invalid("runs", f"at most {MAX_RUNS} runs at a time")
        return ids
    workflow, project = choices["workflow"], choices["project"]
    if workflow is None:
        raise _invalid("workflow", "choose a workflow whose runs you may replay")
    if project is None:
        raise _invalid("project", "choose a project you operate")
    statuses = [form["status"]] if form["status"] else list(SETTLED)
    found = selectors.runs_to_replay(workflow=workflow, project_id=project.id, statuses=statuses,
                                     limit=_limit(form["limit"]))  # fmt: skip
    if not found:
        raise _invalid("runs", f"no settled run of {workflow.slug} in {project.slug} matches: choose others")
    return [r.id for r in found]


def _start(request, form: dict, choices: dict):
    run_ids = _chosen_runs(form, choices)
    draft = form["candidate"] == "draft"
    version, edits = (None, _edits(form["edits"])) if draft else (_version(form["version"]), None)
    if len(form["note"]) > 2000:
        raise _invalid("note", "the note is at most 2000 characters")
    projects = selectors.run_projects(run_ids)
    first = projects.get(run_ids[0])
    if first is None:
        raise NotFound(f"no run {run_ids[0]}")
    # Trying a version is an operator's; a draft's edits are the agent's configuration: its admin's.
    authorize(request.user, first, "administer" if draft else "operate", what=f"run {run_ids[0]}", request=request)
    for run_id in run_ids:  # another project's run is as unknown as one that does not exist
        if projects.get(run_id) != first:
            raise NotFound(f"no run {run_id}")
    return replay_start(
        run_ids=run_ids, agent=choices["agent"], version=version, edits=edits, actor=request.user, via="page",
        request=request, note=form["note"].strip(), live_reads=form["live_reads"],
    )  # fmt: skip


@login_required
@require_http_methods(["GET", "POST"])
def replay_new(request):
    operable = project_ids(request.user, "operate")
    if operable == []:
        audit(actor=request.user, action="denied:operate", target="a new replay", outcome="denied",
              detail={"why": "operates no project"}, request=request)  # fmt: skip
        raise PermissionDenied("only a project's operator may replay its runs")
    data = request.POST if request.method == "POST" else request.GET
    choices = _choices(request, operable, data)
    form = _form(data, choices)
    error, fields, status = "", {}, 200
    if request.method == "POST":
        try:
            replay = _start(request, form, choices)
        except WardenError as exc:
            error, status = _describe(exc), _status(exc)
            for item in getattr(exc, "errors", None) or []:
                fields.setdefault(str(item["field"]).split(".")[0], item["message"])
        else:
            return _see_other(reverse("runs:replay", args=[replay.id]))
    preview = []
    if not form["runs"] and choices["workflow"] is not None and choices["project"] is not None:
        try:
            statuses = [form["status"]] if form["status"] else list(SETTLED)
            preview = selectors.runs_to_replay(workflow=choices["workflow"], project_id=choices["project"].id,
                                               statuses=statuses, limit=_limit(form["limit"]))  # fmt: skip
        except InvalidInput:
            preview = []
    context = {
        **choices,
        "form": form,
        "error": error,
        "fields": fields,
        "statuses": sorted(SETTLED),
        "preview": preview,
        "max_runs": MAX_RUNS,
        "editable": EDITABLE,
        "edits_placeholder": EDITS_PLACEHOLDER,
    }
    return render(request, "replay/new.html", context, status=status)


# --- a replay, and a pair --------------------------------------------------------------------------------
def _replay(request, replay_id: int):
    return authorized(request, selectors.replay_for_page(replay_id), "view", what=f"replay {replay_id}")


def _candidate(replay) -> dict:
    candidate = replay.candidate or {}
    edits = candidate.get("edits")
    return {
        "agent": candidate.get("agent", "?"),
        "version": candidate.get("version"),
        "draft": bool(candidate.get("draft")),
        "workflow_version": candidate.get("workflow_version"),
        "edited": sorted(edits) if isinstance(edits, dict) else [],
        "edits": json.dumps(edits, indent=1, ensure_ascii=False, default=str) if edits else "",
    }


def _usd(value) -> str:
    return f"${(value or 0):.4f}"


def _totals(total: dict) -> dict:
    return {
        **total,
        "cost_original": _usd(total.get("cost_usd_original")),
        "cost_replay": _usd(total.get("cost_usd_replay")),
    }


@login_required
@require_GET
def replay_list(request):
    return render(request, "replay/list.html", {"replays": selectors.replays_for_user(request.user)})


@login_required
@require_GET
def replay_detail(request, replay_id: int):
    replay = _replay(request, replay_id)
    diff = replay_diff(replay)
    context = {
        "replay": replay,
        "candidate": _candidate(replay),
        "settled": replay_settled(replay),
        "total": _totals(diff["total"]),
        "pairs": diff["runs"],
    }
    template = "replay/replay.html#replay-live" if request.htmx else "replay/replay.html"
    return render(request, template, context)


def _short(value, limit: int = SUMMARY_CHARS) -> str:
    text = value if isinstance(value, str) else json.dumps(value, default=str, sort_keys=True, ensure_ascii=False)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def step_summary(entry: dict) -> str:
    """One line of what a journal step was: what the model said and asked for, or what a tool answered.
    Plain text: the template escapes it."""
    body = entry["body"]
    if not isinstance(body, dict):
        return _short(body) if body is not None else ""
    if entry["kind"] == "model_call":
        parts = [str(body["text"])] if body.get("text") else []
        calls = body.get("tool_calls") or ([body["tool_call"]] if body.get("tool_call") else [])
        parts += [f"→ {c.get('name')} {_short(c.get('arguments') or {}, 80)}" for c in calls if isinstance(c, dict)]
        if body.get("final") is not None:
            parts.append(f"final: {_short(body['final'], 100)}")
        return _short(" ".join(parts))
    if "error" in body:
        return _short(f"error: {_short(body['error'])}")
    return _short(body.get("result", {k: v for k, v in body.items() if k not in selectors.HOW}))


def _entry(entry: dict | None) -> dict | None:
    if entry is None:
        return None
    body = entry["body"] if isinstance(entry["body"], dict) else {}
    record = body.get("replay") if isinstance(body.get("replay"), dict) else {}
    return {
        **entry,
        "label": KIND_LABELS.get(entry["kind"], entry["kind"]),
        "summary": step_summary(entry),
        "answered": str(record.get("answered", "")),
        "verdict": str(record.get("verdict", "")),
    }


def _side_by_side(pair, divergence: dict | None) -> dict:
    side = selectors.pair_side_by_side(pair.original_id, pair.run_id)
    for task in side["tasks"]:
        for row in task["rows"]:
            row["cells"] = [_entry(row["original"]), _entry(row["replay"])]
            row["diverges"] = bool(divergence) and (task["key"], row["step"]) == (
                divergence.get("task"), divergence.get("step"))  # fmt: skip
        task["diverges"] = any(row["diverges"] for row in task["rows"])
        task["differs"] = task["diverges"] or any(not row["same"] for row in task["rows"])
    return side


@login_required
@require_GET
def replay_pair(request, replay_id: int, original_id: int):
    replay = _replay(request, replay_id)
    pair = selectors.replay_pair(replay, original_id)
    if pair is None:
        raise Http404(f"replay {replay_id} has no run {original_id}")
    diff = next((p for p in replay_diff(replay)["runs"] if p["original"] == original_id), None)
    if diff is None:
        raise Http404(f"replay {replay_id} has no run {original_id}")
    context = {
        "replay": replay,
        "candidate": _candidate(replay),
        "pair": pair,
        "diff": diff,
        "side": _side_by_side(pair, diff.get("first_divergence")),
        "steps_shown": selectors.STEPS_SHOWN,
        "usage_rows": [
            (name, (diff.get("original_usage") or {}).get(key), (diff.get("replay_usage") or {}).get(key))
            for name, key in USAGE
        ],
    }
    template = "replay/pair.html#pair-live" if request.htmx else "replay/pair.html"
    return render(request, template, context)
