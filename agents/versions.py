"""Versions of agents and workflows: what a run was started with, kept to its end (docs/agents.md,
"Versions").

A version is a snapshot of the configuration that decides what an agent does (instructions, provider
and model, tools, output schema, script, limits) or how a workflow plans (its tasks, planner, agents,
budget). Saving a changed agent or workflow makes a new version (tracked by the digest of its
configuration, so a save that changes nothing makes none; a change written around ``save``, such as a
queryset update, is caught when the next run starts). A run records, at its start, the versions of
its workflow and of every agent it may use; its tasks run on those versions to the end, whatever is
edited meanwhile.
"""

import hashlib
import json
from dataclasses import dataclass

from django.db import IntegrityError, transaction
from django.db.models import OuterRef, QuerySet, Subquery

from core import bus

from .models import Agent, AgentVersion, Workflow, WorkflowVersion

AGENT_FIELDS = (
    "name", "instructions", "provider", "model", "allowed_tools", "output_schema", "script", "fallback_provider",
    "fallback_model", "routing", "cache_seconds", "max_attempts", "max_steps", "is_planner",
)  # fmt: skip
WORKFLOW_FIELDS = (
    "name", "description", "default_goal", "planner", "agents", "tasks", "default_budget", "max_tasks",
    "max_concurrent_tasks", "tool_policies", "max_replans", "compensate_on_failure", "approve_plans",
)  # fmt: skip


# The agent's own endpoint: in its version only when set, so versions made before these fields keep
# their digests (a run pinned to such a version uses the deployment's endpoint).
ENDPOINT_FIELDS = {"base_url": "", "api_key_secret": "", "send_max_tokens": False, "project": None}


def agent_config(agent: Agent) -> dict:
    config = {name: getattr(agent, name) for name in AGENT_FIELDS}
    endpoint = {**agent.endpoint, "project": agent.project_id}
    config.update({name: endpoint[name] for name in ENDPOINT_FIELDS if endpoint[name]})
    return config


def pinned_endpoint(config: dict) -> dict:
    """The endpoint a version pins, as Agent.endpoint gives it."""
    endpoint = {name: config.get(name, empty) for name, empty in ENDPOINT_FIELDS.items()}
    endpoint["project_id"] = endpoint.pop("project")
    return endpoint


def workflow_config(workflow: Workflow) -> dict:
    config = {name: getattr(workflow, name) for name in WORKFLOW_FIELDS}
    config["planner_agent"] = workflow.planner_agent.slug if workflow.planner_agent_id else None
    config["project"] = workflow.project_id
    return config


@dataclass(frozen=True)
class WorkflowSettings:
    """What decides how a run of a workflow goes, as one version of it says (``workflow_settings``)."""

    planner: str
    planner_agent: str | None  # its slug
    agents: tuple  # the slugs a planner may assign
    tasks: list
    max_tasks: int | None
    max_concurrent_tasks: int | None
    tool_policies: dict
    max_replans: int
    approve_plans: bool
    compensate_on_failure: bool


def workflow_settings(config: dict) -> WorkflowSettings:
    """A version's configuration as settings. A key a version predates (``approve_plans`` came after the
    first versions) reads as the field's default: the behaviour such a run started with."""
    defaults = {f.name: f.get_default() for f in Workflow._meta.concrete_fields}
    value = {name: config.get(name, defaults.get(name)) for name in WORKFLOW_FIELDS}
    policies = value["tool_policies"]
    return WorkflowSettings(
        planner=value["planner"],
        planner_agent=config.get("planner_agent"),
        agents=tuple(slug for slug in value["agents"] or () if isinstance(slug, str)),
        tasks=list(value["tasks"] or []),
        max_tasks=value["max_tasks"],
        max_concurrent_tasks=value["max_concurrent_tasks"],
        tool_policies=policies if isinstance(policies, dict) else {},
        max_replans=int(value["max_replans"] or 0),
        approve_plans=bool(value["approve_plans"]),
        compensate_on_failure=bool(value["compensate_on_failure"]),
    )


def digest(config: dict) -> str:
    return hashlib.sha256(json.dumps(config, sort_keys=True, default=str).encode()).hexdigest()


LATEST = ("id", "number", "digest")


def with_latest_version(queryset: QuerySet) -> QuerySet:
    """Agents or workflows, each read with its latest version's id, number and digest in the same
    statement: ``agent_version``/``workflow_version`` of such a row need no statement of their own when
    that version is current (a run's start reads every version it pins this way)."""
    model, owner_field = (AgentVersion, "agent") if queryset.model is Agent else (WorkflowVersion, "workflow")
    latest = model.objects.filter(**{owner_field: OuterRef("pk")}, draft=False).order_by("-number")
    return queryset.annotate(**{f"latest_version_{name}": Subquery(latest.values(name)[:1]) for name in LATEST})


def _current(model, owner_field: str, owner, config: dict):
    """The owner's version with this configuration: the latest one if it matches, else a new one."""
    key = digest(config)
    if getattr(owner, "latest_version_digest", None) == key:
        # Read with the owner (with_latest_version). A version never changes, so its configuration is
        # the owner's, as stored (a JSON round trip: what reading the row would have given).
        stored = json.loads(json.dumps(config, default=str))
        return model(
            id=owner.latest_version_id, number=owner.latest_version_number, digest=key, config=stored,
            **{owner_field: owner},
        )  # fmt: skip
    for _ in range(3):  # two savers racing for the same number: the loser reads the winner's
        latest = model.objects.filter(**{owner_field: owner}, draft=False).order_by("-number").first()
        if latest is not None and latest.digest == key:
            return latest
        try:
            with transaction.atomic():
                version = model.objects.create(
                    **{owner_field: owner}, number=_next_number(model, owner_field, owner), config=config, digest=key
                )
                # Listeners (the evaluations that rerun on it) hear after commit, never for a lost race.
                bus.announce(bus.VersionCreated(kind=owner_field, version_id=version.id))
                return version
        except IntegrityError:
            continue
    raise IntegrityError(f"cannot record a version of {owner}")


def _next_number(model, owner_field: str, owner) -> int:
    """The owner's next version number: after its drafts' too (they take numbers)."""
    top = model.objects.filter(**{owner_field: owner}).order_by("-number").values_list("number", flat=True).first()
    return (top or 0) + 1


def agent_version_draft(agent: Agent, edits: dict) -> AgentVersion:
    """A candidate version of ``agent``: its configuration as it is now, with ``edits`` (fields of
    agent_config) applied; a draft, so runs keep starting on the agent as it is. Validated by the caller."""
    config = {**agent_config(agent), **edits}
    for _ in range(3):
        try:
            with transaction.atomic():
                return AgentVersion.objects.create(
                    agent=agent, number=_next_number(AgentVersion, "agent", agent), config=config,
                    digest=digest(config), draft=True,
                )  # fmt: skip
        except IntegrityError:
            continue
    raise IntegrityError(f"cannot record a draft version of {agent}")


def agent_version(agent: Agent) -> AgentVersion:
    return _current(AgentVersion, "agent", agent, agent_config(agent))


def workflow_version(workflow: Workflow) -> WorkflowVersion:
    return _current(WorkflowVersion, "workflow", workflow, workflow_config(workflow))


def version_ref(version) -> dict:
    return {"id": version.id, "version": version.number}


def version_on_save(sender, instance, raw: bool = False, **kwargs) -> None:
    """post_save of an agent or a workflow: a changed configuration is a new version at once."""
    if raw:  # loading a fixture: the next run start records it
        return
    if sender is Agent:
        agent_version(instance)
    elif sender is Workflow:
        workflow_version(instance)
