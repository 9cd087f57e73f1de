"""Integration API for declarations as code (docs/declarations.md): a project's whole document, or one
item, PUT as the command applies it (the admin's checks, one transaction, the four-eyes rules: 202 when
a change waits for a second admin), with ``?dry_run=true`` for the diff; GET exports what exists."""

from typing import Any

from ninja import Field, Query, Router, Schema, Status
from pydantic import BaseModel, ConfigDict

from approvals.declarations.apply import declaration_documents, declarations_apply
from approvals.declarations.export import declarations_export
from approvals.declarations.kinds import ORDER
from core.errors import InvalidInput, NotFound
from tenancy.access import authorize_token
from tenancy.models import Project

router = Router(tags=["declarations"])

OUTCOME_EXAMPLE = {
    "project": "payments",
    "kind": "http_tools",
    "name": "payments.refund",
    "status": "pending",
    "changes": {"url": {"before": "https://payments.internal/v1/charges/{charge_id}/refunds",
                        "after": "https://payments.internal/v2/charges/{charge_id}/refunds"}},
    "change_request": 4,
}  # fmt: skip


DOCUMENT_EXAMPLE = {
    "project": "payments",
    "http_tools": [
        {"name": "payments.get_charge", "method": "GET", "url": "https://payments.internal/v1/charges/{charge_id}",
         "tool_class": "read_only", "headers": {"Authorization": "Bearer {secret:PAYMENTS_API_KEY}"},
         "arguments_schema": {"type": "object", "properties": {"charge_id": {"type": "string"}}}},
    ],
    "classifications": [{"tool": "helpdesk.search_tickets", "tool_class": "read_only"}],
    "policies": [{"name": "every refund waits for a reviewer", "tool": "payments.refund"}],
}  # fmt: skip
ITEMS = Field(None, description="Items of this kind (docs/declarations.md)")


class DocumentSchema(Schema):
    """A project's declarations: lists of items by kind; a kind left out is left as it is."""

    model_config = ConfigDict(extra="forbid", json_schema_extra={"examples": [DOCUMENT_EXAMPLE]})

    project: str | None = Field(None, description="The project's slug: the address's, or left out")
    agents: list[dict[str, Any]] | None = ITEMS
    mcp_servers: list[dict[str, Any]] | None = ITEMS
    http_tools: list[dict[str, Any]] | None = ITEMS
    classifications: list[dict[str, Any]] | None = ITEMS
    workflows: list[dict[str, Any]] | None = ITEMS
    policies: list[dict[str, Any]] | None = ITEMS
    waivers: list[dict[str, Any]] | None = ITEMS


class ItemIn(BaseModel):
    """One item of a kind, its fields as in a document; its name is the address's."""

    model_config = ConfigDict(
        extra="allow", json_schema_extra={"examples": [{"tool_class": "non_idempotent_write", "reversibility":
                                                        "irreversible", "approval": "always"}]}
    )  # fmt: skip


class DryRunQuery(Schema):
    dry_run: bool = Field(False, description="Check and show the diff; write nothing")


class OutcomeOut(Schema):
    project: str | None
    kind: str = Field(description=", ".join(ORDER))
    name: str
    status: str = Field(description="created, changed, unchanged, or pending (waits for a second admin)")
    changes: dict[str, Any] = Field(description="Per field: {before, after}, as declared (secrets by name)")
    change_request: int | None = Field(description="The change request a pending item waits in")


class AppliedOut(Schema):
    model_config = {"json_schema_extra": {"examples": [{"dry_run": False, "pending": 1, "items": [OUTCOME_EXAMPLE]}]}}

    dry_run: bool
    pending: int = Field(description="Items that wait for a second admin (the answer is then 202)")
    items: list[OutcomeOut]


def _project(slug: str) -> Project:
    project = Project.objects.filter(slug=slug).first()
    if project is None:
        raise NotFound(f"project {slug} does not exist")
    return project


def _answer(outcomes: list[dict], dry_run: bool):
    pending = sum(o["status"] == "pending" for o in outcomes)
    body = {"dry_run": dry_run, "pending": pending, "items": outcomes}
    return Status(202, body) if pending and not dry_run else body


def _apply(request, documents: list, dry_run: bool):
    authorize_token(request.auth, "admin", what="declarations", request=request)
    outcomes = declarations_apply(user=request.auth.user, documents=documents, dry_run=dry_run, token=request.auth,
                                  request=request)  # fmt: skip
    return _answer(outcomes, dry_run)


@router.get("/projects/{slug}/declarations", response=DocumentSchema, exclude_none=True,
            summary="A project's declarations, as warden_export writes them (secrets by name only)")  # fmt: skip
def export_declarations(request, slug: str):
    """Members of the project (any role) with a token that may ``read``."""
    authorize_token(request.auth, "read", what="declarations", request=request)
    [document] = declarations_export(user=request.auth.user, project=slug, token=request.auth, request=request)
    return document


@router.put("/projects/{slug}/declarations", response={200: AppliedOut, 202: AppliedOut},
            summary="Apply a project's declaration document (project admins; 202 when a change waits)")  # fmt: skip
def apply_declarations(request, slug: str, query: Query[DryRunQuery], payload: DocumentSchema):
    """The document's ``project``, if given, is the address's; what it does not name is left as it is."""
    project, document = _project(slug), payload.model_dump(exclude_none=True)
    if document.get("project", slug) != slug:
        raise InvalidInput("a document is PUT at its own project's address",
                           [{"field": "project", "message": f"{slug} (as in the address) or left out"}])  # fmt: skip
    return _apply(request, [{**document, "project": project.slug}], query.dry_run)


@router.put("/projects/{slug}/declarations/{kind}/{name}", response={200: AppliedOut, 202: AppliedOut},
            summary="Apply one declared item (project admins; 202 when the change waits)")  # fmt: skip
def apply_declaration(request, slug: str, kind: str, name: str, query: Query[DryRunQuery],
                      item: ItemIn):  # fmt: skip
    project = _project(slug)
    return _apply(request, declaration_documents(kind, name, item.model_dump(), project), query.dry_run)
