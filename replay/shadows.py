"""Shadows: a candidate agent follows a workflow's live traffic in one project (docs/replay.md, "Shadow
runs"). While a shadow is on, each run of the workflow that starts (runs.services.run_start) starts a twin
in shadow mode: a replay of the run while it goes, whose calls wait for the run's ledger and never leave
(tools/replaying.py). The twin is the production run's satellite, never its dependency: it has its own
budget, nothing of the production run waits for it, and switching the shadow off cancels the twins still
going at once.

The twin is started by a message (``SHADOW_START``), written with the production run's start: a shadowed
start costs one outbox row more, an unshadowed one nothing (the workflow row it reads anyway says whether
its project shadows it: ``Workflow.shadowed_in``). A twin runs on the workers' spare time: while live work
is going, its start is put off (later and later), and so is each of its attempts and model calls
(runs/services/spare.py); a twin that could not start within START_WITHIN_SECONDS of its run is skipped
and counted (``Shadow.skipped``).
"""

from django.db import IntegrityError, transaction
from django.db.models import F
from django.utils import timezone

from agents.models import Workflow
from core import bus
from core.errors import Conflict, NotFound
from runs.models import Run
from runs.services import run_cancel, run_replay_start
from runs.services.outbox import outbox_add
from tenancy.audit import audited

from .models import Replay, ReplayRun, Shadow
from .services import candidate_of, invalid

SHADOW_START = "shadow_start"
FIRST_LOOK_MS = 2000
START_WITHIN_SECONDS = 3600


def _workflow_agents(wf: Workflow) -> set[str]:
    """The agents a run of ``wf`` may use: its static plan's, its planner and those a planner may assign."""
    found = {t.get("agent") for t in wf.tasks or [] if isinstance(t, dict)}
    found |= {slug for slug in wf.agents or [] if isinstance(slug, str)}
    if wf.planner_agent_id:
        found.add(wf.planner_agent.slug)
    return found - {None}


def _shadowed_in(workflow_id: int, project_id: int, on: bool) -> None:
    """Keep the workflow's list of shadowing projects (the workflow row locked: two projects at once)."""
    wf = Workflow.objects.select_for_update().get(id=workflow_id)
    projects = {int(p) for p in wf.shadowed_in or []}
    projects = projects | {project_id} if on else projects - {project_id}
    # Not save(): this is not configuration, and must not make a new version of the workflow.
    Workflow.objects.filter(id=workflow_id).update(shadowed_in=sorted(projects))


def shadow_on(
    *, project, workflow: str, agent: str, version: int | None = None, edits: dict | None = None, actor=None,
    via: str = "", request=None, note: str = "", live_reads: bool = False,
) -> Shadow:  # fmt: skip
    """Shadow ``workflow``'s runs in ``project`` with ``agent`` on the candidate (one of its versions, or a
    draft of edits). Audited. One shadow per workflow and project at a time."""
    detail = {"workflow": workflow, "agent": agent, "version": version,
              "edits": sorted(edits) if isinstance(edits, dict) else None, "live_reads": live_reads}  # fmt: skip
    with audited("shadow_on", actor=actor, via=via, request=request, target="shadow", detail=detail) as act:
        act.update(project_id=project.id)
        wf = Workflow.objects.select_related("planner_agent").filter(slug=workflow).first()
        if wf is None or wf.project_id not in (None, project.id):
            raise invalid("workflow", f"unknown workflow {workflow!r}")
        if wf.planner == Workflow.Planner.EXTERNAL:
            raise invalid("workflow", f"{workflow}'s agent runs elsewhere: Warden cannot run it beside")
        if agent not in _workflow_agents(wf):
            raise invalid("agent", f"{workflow} does not use {agent}: a shadow of it would change nothing")
        candidate = candidate_of(agent, version, edits, project_id=project.id)
        if Shadow.objects.filter(project=project, workflow=wf, on=True).exists():
            raise Conflict(f"a shadow of {workflow} is on in this project: switch it off first")
        replay = Replay.objects.create(
            project=project,
            candidate={"agent": agent, "version": candidate.number, "draft": candidate.draft, "edits": edits},
            candidate_version=candidate,
            created_by=actor,
            note=note or f"shadow of {workflow}",
            live_reads=live_reads,
        )
        try:
            with transaction.atomic():
                shadow = Shadow.objects.create(project=project, workflow=wf, replay=replay)
        except IntegrityError:  # another switched one on meanwhile
            raise Conflict(f"a shadow of {workflow} is on in this project: switch it off first") from None
        _shadowed_in(wf.id, project.id, on=True)
        act.update(target=f"shadow {shadow.id}")
    return shadow


def shadow_off(*, shadow: Shadow, actor=None, via: str = "", request=None) -> Shadow:
    """Switch ``shadow`` off: no new twin starts, and the twins still going are cancelled now. Audited."""
    with audited("shadow_off", actor=actor, via=via, request=request, target=f"shadow {shadow.id}") as act:
        act.update(project_id=shadow.project_id)
        shadow = Shadow.objects.select_for_update().get(id=shadow.id)
        if not shadow.on:
            raise Conflict(f"shadow {shadow.id} is off already")
        shadow.on, shadow.switched_off_at, shadow.switched_off_by = False, timezone.now(), actor
        shadow.save(update_fields=["on", "switched_off_at", "switched_off_by"])
        _shadowed_in(shadow.workflow_id, shadow.project_id, on=False)
        going = Run.objects.filter(id__in=shadow.replay.pairs.values("run_id")).exclude(status__in=Run.TERMINAL)
        for run_id in going.values_list("id", flat=True):
            run_cancel(run_id=run_id, reason=f"shadow {shadow.id} was switched off", actor=actor, via=via)
    return shadow


def shadow_get(shadow_id: int) -> Shadow:
    found = Shadow.objects.filter(id=shadow_id).select_related("project", "workflow", "replay").first()
    if found is None:
        raise NotFound(f"no shadow {shadow_id}")
    return found


# --- the twins -------------------------------------------------------------------------------------------
def run_started_heard(event: bus.RunStarted) -> None:
    """A shadowed workflow's run started (durable: in its transaction): its twin starts by a message."""
    # Its run has just started: its twin's first look is a moment later, when that run may be done.
    outbox_add(actor=SHADOW_START, kwargs={"run_id": event.run_id}, delay_ms=FIRST_LOOK_MS)


def shadow_twin_skip(*, run_id: int) -> None:
    """The twin of ``run_id`` could not start in time: counted on its shadow."""
    run = Run.objects.filter(id=run_id).values("project_id", "workflow_id").first()
    if run is not None:
        Shadow.objects.filter(on=True, **run).update(skipped=F("skipped") + 1)


def shadow_twin_start(*, run_id: int) -> Run | None:
    """Start ``run_id``'s twin, if its workflow's shadow in its project is still on (once: a message
    delivered twice finds the pair)."""
    with transaction.atomic():
        run = Run.objects.filter(id=run_id, mode=Run.Mode.LIVE).select_related("project").first()
        if run is None:
            return None
        shadow = (
            Shadow.objects.filter(project_id=run.project_id, workflow_id=run.workflow_id, on=True)
            .select_related("replay__candidate_version__agent")
            .first()
        )
        if shadow is None or ReplayRun.objects.filter(replay=shadow.replay, original=run).exists():
            return None
        candidate = shadow.replay.candidate_version
        if candidate.agent.slug not in ((run.versions or {}).get("agents") or {}):
            return None
        twin = run_replay_start(
            original=run, candidates={candidate.agent.slug: candidate}, shadow=True,
            live_reads=shadow.replay.live_reads,
        )  # fmt: skip
        ReplayRun.objects.create(replay=shadow.replay, original=run, run=twin)
    return twin
