"""The kinds of rows a declaration file holds (docs/declarations.md): for each, its model, the field that
names an item, the fields an item may say (any other is refused; one it leaves out takes the model's
default, so an item is the whole row), how a row is found in its project, and how a field is written
out. References to other rows are by name (a workflow's or an agent's slug), never by id."""

import json
from dataclasses import dataclass

from django import forms
from django.db import models

from agents.forms import AgentForm
from agents.models import Agent, Workflow
from agents.versions import AGENT_FIELDS, ENDPOINT_FIELDS, WORKFLOW_FIELDS
from policy.models import ApprovalPolicy
from tools.classifications import CLASSIFICATION_FIELDS
from tools.models import HttpTool, McpServer, ToolClassification

POLICY_FIELDS = (
    "enabled", "workflow", "tool", "condition", "quorum", "decided_by_role", "expires_after_seconds",
    "remind_before_seconds", "on_expiry", "on_reject",
)  # fmt: skip
WAIVER_FIELDS = ("enabled", "workflow", "tool", "condition")


@dataclass(frozen=True)
class Kind:
    key: str  # the document's key and the API's path segment
    model: type[models.Model]
    identity: str
    fields: tuple[str, ...]
    shared: bool = False  # every project's (agents): only a superuser changes one

    @property
    def declared(self) -> tuple[str, ...]:
        return (self.identity, *self.fields)

    def rows(self, project):
        """The rows of this kind a document for ``project`` (None: the deployment's own) speaks of."""
        manager = self.model.objects
        if self.model is Agent:
            return manager.all()
        if self.model is ApprovalPolicy:
            effect = ApprovalPolicy.Effect.WAIVE if self.key == "waivers" else ApprovalPolicy.Effect.REQUIRE
            return manager.filter(project=project, effect=effect)
        if self.model is Workflow:
            return manager.filter(project=project).select_related("planner_agent")
        return manager.filter(project=project)


KINDS = {
    kind.key: kind
    for kind in (
        Kind("agents", Agent, "slug", (*AGENT_FIELDS, *ENDPOINT_FIELDS), shared=True),
        Kind(
            "mcp_servers",
            McpServer,
            "name",
            ("transport", "url", "command", "headers", "secrets", "timeout_seconds", "on_refusal", "enabled"),
        ),  # fmt: skip
        Kind(
            "http_tools",
            HttpTool,
            "name",
            (
                "description",
                "method",
                "url",
                "arguments_schema",
                "tool_class",
                "reversibility",
                "headers",
                "idempotency_header",
                "lookup_url",
                "undo",
                "external_id",
                "example_answer",
                "repeatable",
                "timeout_seconds",
                "rate_per_minute",
                "on_refusal",
                "enabled",
            ),
        ),  # fmt: skip
        Kind("classifications", ToolClassification, "tool", CLASSIFICATION_FIELDS),
        Kind("workflows", Workflow, "slug", (*WORKFLOW_FIELDS, "planner_agent")),
        Kind("policies", ApprovalPolicy, "name", POLICY_FIELDS),
        Kind("waivers", ApprovalPolicy, "name", WAIVER_FIELDS),
    )
}
# Applied in this order: what an item names exists by then (a workflow's agents, a policy's workflow,
# an HTTP tool a classification may only make stricter).
ORDER = tuple(KINDS)
PROJECT_KINDS = tuple(key for key in ORDER if key != "agents")
REFERENCES = {"workflow": "slug", "planner_agent": "slug", "project": "slug"}


def default_of(kind: Kind, name: str):
    field = kind.model._meta.get_field(name)
    if field.is_relation:
        return None
    return field.get_default()


def written(row, name: str):
    """A field of a row as a declaration says it: a reference by its slug."""
    field = row._meta.get_field(name)
    if field.is_relation:
        related = getattr(row, name)
        return getattr(related, REFERENCES[name]) if related is not None else None
    return getattr(row, name)


def item_of(kind: Kind, row) -> dict:
    """A row as an item: its name, then each field that is not its default (what applying it back
    would fill in anyway)."""
    item = {kind.identity: getattr(row, kind.identity)}
    for name in kind.fields:
        value = written(row, name)
        if value != default_of(kind, name):
            item[name] = value
    return item


def value_problems(kind: Kind, item: dict) -> list[tuple[str, str]]:
    """Values of the wrong shape for their field, which the admin's form (made for posted text) would
    otherwise turn into text: a list where a name goes, a YAML date in a JSON field, "no" for a box."""
    problems = []
    for name in kind.declared:
        if name not in item:
            continue
        value, field = item[name], kind.model._meta.get_field(name)
        if isinstance(field, models.JSONField):
            try:
                json.dumps(value)
            except (TypeError, ValueError):
                problems.append((name, "JSON values only (text, numbers, true/false, lists, mappings)"))
        elif isinstance(field, models.BooleanField):
            if not isinstance(value, bool):
                problems.append((name, "true or false"))
        elif field.is_relation:
            if value is not None and not isinstance(value, str):
                problems.append((name, "a name (slug), or null"))
        elif isinstance(value, bool) or not isinstance(value, str | int | float | type(None)):
            problems.append((name, "a single value (text or a number)"))
    return problems


def form_class(kind: Kind) -> type[forms.ModelForm]:
    # An agent's endpoint key is checked against its project's grants, as in the admin.
    base = AgentForm if kind.model is Agent else forms.ModelForm
    return forms.modelform_factory(kind.model, form=base, fields=kind.declared)


def form_data(kind: Kind, item: dict, references: dict) -> dict:
    """An item as the admin's form would post it: JSON fields as JSON text, references as ids (from
    ``references``: name → {slug: id}, unknown slugs as a value no row has), empty values as empty."""
    data = {}
    for name in kind.declared:
        value = item.get(name, default_of(kind, name))
        field = kind.model._meta.get_field(name)
        if isinstance(field, models.JSONField):
            value = json.dumps(value)
        elif field.is_relation:
            value = "" if value in (None, "") else references.get(name, {}).get(value, -1)
        elif value is None:
            value = ""
        data[name] = value
    return data
