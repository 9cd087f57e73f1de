"""Integration API for shadows (docs/replay.md, "Shadow runs"): a candidate agent follows a workflow's live
runs in one project, with zero effects; its differences from each run, once both have finished."""

from typing import Any

from ninja import Field, Router, Schema, Status
from pydantic import ConfigDict

from agents.models import Workflow
from api.replays import REPLAY_EXAMPLE
from api.runs import project_for
from api.schemas import BodyIn
from core.schemas import PathId, Whole
from replay.services import replay_diff
from replay.shadows import shadow_get, shadow_off, shadow_on
from tenancy.access import authorize

router = Router(tags=["replays"])

LATEST = 100  # the pairs a shadow's page of differences shows: the latest runs of live traffic
SHADOW_EXAMPLE = {
    "id": 2, "project": "default", "workflow": "incident-fanout", "on": True,
    "candidate": {"agent": "incident-worker", "version": 4, "draft": False, "edits": None},
    "switched_on_at": "2026-12-07T09:00:00Z", "switched_off_at": None,
    "total": REPLAY_EXAMPLE["total"], "runs": REPLAY_EXAMPLE["runs"],
}  # fmt: skip


class ShadowIn(BodyIn):
    model_config = ConfigDict(
        json_schema_extra={"examples": [{"workflow": "incident-fanout", "agent": "incident-worker", "version": 4}]}
    )

    workflow: str = Field(min_length=1, max_length=64, description="The workflow whose new runs are shadowed")
    project: str | None = Field(None, max_length=64, description="Project slug; default: the workflow's")
    agent: str = Field(min_length=1, max_length=64, description="The agent whose candidate follows (its slug)")
    version: Whole(ge=1) | None = Field(None, description="One of the agent's version numbers...")
    edits: dict[str, Any] | None = Field(
        None, description="...or a draft of the agent with these fields changed; needs the project's admin"
    )
    note: str = Field("", max_length=2000)
    live_reads: bool = Field(False, description="Twins send the reads safe to repeat that production did not make")


class ShadowOut(Schema):
    model_config = ConfigDict(json_schema_extra={"examples": [SHADOW_EXAMPLE]})

    id: int
    project: str
    workflow: str
    on: bool = Field(description="Whether new runs of the workflow start a twin")
    candidate: dict[str, Any]
    switched_on_at: Any
    switched_off_at: Any = None
    total: dict[str, Any] = Field(description="As a replay's, of the pairs where both runs have finished")
    runs: list[dict[str, Any]] = Field(description=f"The latest {LATEST} pairs: a live run and its twin")


def _out(shadow) -> dict:
    diff = replay_diff(shadow.replay, latest=LATEST)
    return {"id": shadow.id, "project": shadow.project.slug, "workflow": shadow.workflow.slug, "on": shadow.on,
            "candidate": shadow.replay.candidate, "switched_on_at": shadow.switched_on_at,
            "switched_off_at": shadow.switched_off_at, "total": diff["total"], "runs": diff["runs"]}  # fmt: skip


def _shadow_for(request, shadow_id: int, action: str):
    shadow = shadow_get(shadow_id)
    authorize(request.auth.user, shadow.project_id, action, what=f"shadow {shadow_id}", token=request.auth,
              request=request)  # fmt: skip
    return shadow


@router.post("/shadows", response={201: ShadowOut}, summary="Shadow a workflow's new runs with a candidate agent")
def create_shadow(request, payload: ShadowIn):
    wf = Workflow.objects.filter(slug=payload.workflow).select_related("project").first()
    project = project_for(payload.project, wf)
    # A version is an operator's to try; a draft's edits are the agent's configuration: its admin's.
    action = "administer" if payload.edits is not None else "operate"
    authorize(request.auth.user, project.id, action, what=f"project {project.slug}", token=request.auth,
              request=request)  # fmt: skip
    shadow = shadow_on(
        project=project, workflow=payload.workflow, agent=payload.agent, version=payload.version,
        edits=payload.edits, actor=request.auth.user, via="api", request=request, note=payload.note,
        live_reads=payload.live_reads,
    )  # fmt: skip
    return Status(201, _out(shadow_get(shadow.id)))


@router.get("/shadows/{shadow_id}", response=ShadowOut, summary="A shadow's differences from the live runs")
def get_shadow(request, shadow_id: PathId):
    return _out(_shadow_for(request, shadow_id, "view"))


@router.post("/shadows/{shadow_id}/off", response=ShadowOut, summary="Switch a shadow off; its twins stop now")
def switch_shadow_off(request, shadow_id: PathId):
    shadow = _shadow_for(request, shadow_id, "operate")
    shadow_off(shadow=shadow, actor=request.auth.user, via="api", request=request)
    return _out(shadow_get(shadow.id))
