"""Integration API for the "needs you" inbox: what waits for the token's person (approvals/selectors/inbox.py)."""

from datetime import datetime
from typing import Literal

from ninja import Field, Query, Router, Schema
from pydantic import ConfigDict

from approvals.selectors.inbox import KINDS, inbox_counts, inbox_items
from core.errors import NotFound
from tenancy.access import authorize, authorize_token
from tenancy.selectors import project_by_slug

router = Router(tags=["inbox"])
Kind = Literal["approval", "question", "operation", "run", "breaker", "blackboard", "change"]


class InboxItemOut(Schema):
    kind: Kind
    id: str = Field(
        description="The item's id within its kind; a breaker's is tool:NAME or provider:NAME for the "
        "deployment's, tool:PROJECT:NAME for a project's own tool (an HTTP or MCP tool it declared)"
    )
    title: str
    detail: str
    since: datetime | None
    url: str = Field(description="The dashboard page where a person acts on it")
    project: str = Field(description="The project's slug; empty for a deployment's breaker")
    run_id: int | None


class InboxOut(Schema):
    model_config = ConfigDict(
        json_schema_extra={
            "examples": [
                {
                    "counts": {
                        "approval": 1,
                        "question": 0,
                        "operation": 1,
                        "run": 1,
                        "breaker": 0,
                        "blackboard": 0,
                        "change": 0,
                    },
                    "items": [
                        {
                            "kind": "approval",
                            "id": "118",
                            "title": "Proposed operations, executed together in run 42 (incident-fanout)",
                            "detail": "Run 42: the supervisor will execute these 5 proposed operations once each",
                            "since": "2026-12-02T09:14:03Z",
                            "url": "/approvals/#request-118",
                            "project": "support",
                            "run_id": 42,
                        },
                        {
                            "kind": "operation",
                            "id": "907",
                            "title": "crm.update in run 41 may or may not have happened",
                            "detail": "the CRM timed out after the request was sent; it has no status lookup",
                            "since": "2026-12-02T09:02:40Z",
                            "url": "/runs/41/operations/907/resolve",
                            "project": "support",
                            "run_id": 41,
                        },
                    ],
                }
            ]
        }
    )

    counts: dict[Kind, int] = Field(description="Per kind, across every project the person can see")
    items: list[InboxItemOut]


class InboxQuery(Schema):
    project: str | None = Field(None, max_length=50, description="A project's slug")
    kind: Kind | None = None


@router.get("/inbox", response=InboxOut, summary="Everything waiting for me: approvals, questions, runs, …")
def inbox(request, filters: Query[InboxQuery]):
    authorize_token(request.auth, "read", what="the inbox", request=request)
    user, project = request.auth.user, None
    if filters.project:
        project = project_by_slug(filters.project)
        if project is None:
            raise NotFound(f"project {filters.project} does not exist")
        authorize(user, project.id, "view", what=f"project {filters.project}", token=request.auth, request=request)
    items = inbox_items(user, project=project, kind=filters.kind or "")
    counts = inbox_counts(user)
    return {"counts": {k: counts[k] for k in KINDS}, "items": [item.as_json() for item in items]}
