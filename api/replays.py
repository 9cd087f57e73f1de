"""Integration API for what-if replays (docs/replay.md): replay settled runs on a candidate agent with zero
effects, and read what the candidate did differently."""

from typing import Any

from ninja import Field, Router, Schema, Status
from pydantic import ConfigDict

from api.schemas import BodyIn
from core.errors import InvalidInput, NotFound
from core.schemas import PathId, Whole
from evals.models import EvalSuite
from replay.services import replay_diff, replay_get, replay_settled, replay_start
from runs.models import Run
from tenancy.access import authorize

router = Router(tags=["replays"])


ADDED = {
    "tool": "email.send", "digest": "9f2c…", "write": True, "tool_class": "non_idempotent_write",
    "reversibility": "irreversible", "verdict": "allow", "waits_for": [], "answered": "not_sent",
    "task": "worker-1", "step": 11,
}  # fmt: skip
USAGE = {"steps": 61, "tokens": 5120, "cost_usd": 0.0, "seconds": 1.4, "status": "completed", "reason": ""}
REPLAY_EXAMPLE = {
    "id": 3,
    "project": "default",
    "candidate": {"agent": "incident-worker", "version": 4, "draft": True, "edits": {"instructions": "Also…"}},
    "live_reads": False,
    "settled": True,
    "total": {"runs": 1, "settled": 1, "differing": 1, "calls_added": 1, "calls_removed": 0, "irreversible_added": 1,
              "would_wait_for_approval": 0, "outputs_differing": 1, "checks_regressed": 0, "steps_original": 56,
              "steps_replay": 61,
              "tokens_original": 4700, "tokens_replay": 5120, "cost_usd_original": 0.0, "cost_usd_replay": 0.0},
    "runs": [{"original": 12, "replay": 31, "settled": True, "difference": True,
              "status": {"original": "completed", "replay": "completed"}, "output_equal": False,
              "outputs_differing": ["worker-1"], "calls_added": [ADDED], "calls_removed": [],
              "irreversible_added": [ADDED], "would_wait_for_approval": [], "not_sent": [ADDED],
              "original_usage": {**USAGE, "steps": 56, "tokens": 4700}, "replay_usage": USAGE,
              "first_divergence": {"task": "worker-1", "step": 9, "what": "tool_call crm.read / tool_call crm.read"}}],
}  # fmt: skip


class ReplayIn(BodyIn):
    model_config = ConfigDict(
        json_schema_extra={"examples": [{"runs": [12, 13], "agent": "incident-worker", "version": 3, "note": "v3?"}]}
    )

    runs: list[Whole(ge=1)] = Field([], max_length=500, description="Settled runs of one project...")
    suite: str | None = Field(
        None, max_length=64, description="...or an evaluation suite (its slug): the runs its cases last had, each "
        "pair then graded by its case's checks",
    )  # fmt: skip
    agent: str = Field("", max_length=64, description="The agent whose candidate is tried (its slug)")
    version: Whole(ge=1) | None = Field(None, description="One of the agent's version numbers...")
    edits: dict[str, Any] | None = Field(
        None,
        description="...or a draft: the agent as it is with these fields changed (instructions, provider, model, "
        "script, allowed_tools, output_schema, max_steps); needs the project's admin",
    )
    workflow_version: Whole(ge=1) | None = Field(
        None, description="And/or the runs' workflow as this version of it says (its plan, agents, limits, policies)"
    )
    note: str = Field("", max_length=2000, description="Why this replay (kept with it)")
    live_reads: bool = Field(
        False, description="Send the reads the originals did not make when the tool says they are safe to repeat"
    )


class ReplayOut(Schema):
    model_config = ConfigDict(json_schema_extra={"examples": [REPLAY_EXAMPLE]})

    id: int
    project: str
    candidate: dict[str, Any] = Field(description="The agent, its version number, whether it is a draft, the edits")
    live_reads: bool = Field(False, description="Whether reads the originals did not make were sent live")
    settled: bool = Field(description="Every replay run has ended or stopped: the differences are final")
    total: dict[str, Any] = Field(description="Runs, differing, calls added (irreversible), removed, usage")
    runs: list[dict[str, Any]] = Field(
        description="Per original run: its replay, the calls added and removed (irreversible first, each with the "
        "verdict it would have had), outputs, usage and the first point of divergence"
    )


def _out(replay) -> dict:
    diff = replay_diff(replay)
    return {"id": replay.id, "project": replay.project.slug, "candidate": replay.candidate,
            "live_reads": replay.live_reads,
            "settled": replay_settled(replay), "total": diff["total"], "runs": diff["runs"]}  # fmt: skip


@router.post("/replays", response={201: ReplayOut}, summary="Replay settled runs on a candidate agent, sending nothing")
def create_replay(request, payload: ReplayIn):
    # Trying a version is an operator's; a draft's edits are the agent's configuration: its admin's.
    action = "administer" if payload.edits is not None else "operate"
    if payload.suite is not None:
        suite = EvalSuite.objects.filter(slug=payload.suite).first()
        if suite is None:
            raise NotFound(f"no suite {payload.suite}")
        authorize(request.auth.user, suite.project_id, action, what=f"suite {suite.slug}", token=request.auth,
                  request=request)  # fmt: skip
        replay = replay_start(
            run_ids=payload.runs, suite=suite, agent=payload.agent, version=payload.version, edits=payload.edits,
            actor=request.auth.user, via="api", request=request, note=payload.note, live_reads=payload.live_reads,
            workflow_version=payload.workflow_version,
        )  # fmt: skip
        return Status(201, _out(replay_get(replay.id)))
    if not payload.runs:
        raise InvalidInput("choose runs or a suite", [{"field": "runs", "message": "choose runs or a suite"}])
    projects = dict(Run.objects.filter(id__in=payload.runs).values_list("id", "project_id"))
    first = projects.get(payload.runs[0])
    if first is None:
        raise NotFound(f"no run {payload.runs[0]}")
    authorize(request.auth.user, first, action, what=f"run {payload.runs[0]}", token=request.auth, request=request)
    for run_id in payload.runs:  # another project's run is as unknown as one that does not exist
        if projects.get(run_id) != first:
            raise NotFound(f"no run {run_id}")
    replay = replay_start(
        run_ids=payload.runs, agent=payload.agent, version=payload.version, edits=payload.edits,
        actor=request.auth.user, via="api", request=request, note=payload.note, live_reads=payload.live_reads,
        workflow_version=payload.workflow_version,
    )  # fmt: skip
    return Status(201, _out(replay_get(replay.id)))


@router.get("/replays/{replay_id}", response=ReplayOut, summary="A replay's differences, per run and in total")
def get_replay(request, replay_id: PathId):
    replay = replay_get(replay_id)
    authorize(request.auth.user, replay.project_id, "view", what=f"replay {replay_id}", token=request.auth,
              request=request)  # fmt: skip
    return _out(replay)
