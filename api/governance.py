"""Integration API for change requests: the changes that loosen a project's rules, waiting for a second
admin (docs/access.md, "Four eyes on the rules"). Listed to the project's admins; decided by one who did
not ask for it; withdrawn by its author."""

from datetime import datetime
from typing import Any, Literal

from ninja import Field, Router, Schema
from pydantic import ConfigDict

from api.schemas import BodyIn
from approvals.governance import change_request_decide, change_requests_pending
from core.errors import Forbidden, NotFound
from core.schemas import PathId
from tenancy.access import authorize, authorize_token
from tenancy.audit import audit
from tenancy.governance import change_request_withdraw
from tenancy.models import ChangeRequest

router = Router(tags=["governance"])

CHANGE_REQUEST_EXAMPLE = {
    "id": 4,
    "project": "payments",
    "subject": "tools.httptool",
    "object_id": 12,
    "action": "change",
    "label": "HTTP tool payments.refund",
    "before": {"url": "https://payments.internal/v1/charges/{charge_id}/refunds"},
    "after": {"url": "https://payments.internal/v2/charges/{charge_id}/refunds"},
    "loosens": ["its url changes"],
    "status": "pending",
    "requested_by": "ada",
    "requested_at": "2026-03-14T09:31:04.882Z",
    "decided_by": None,
    "decided_at": None,
    "note": "",
}


class ChangeRequestOut(Schema):
    model_config = ConfigDict(json_schema_extra={"examples": [CHANGE_REQUEST_EXAMPLE]})

    id: int
    project: str
    subject: str = Field(description="What kind of row: tools.httptool, tools.mcpserver, tools.toolclassification, "
                         "approvals.approvalpolicy")  # fmt: skip
    object_id: int | None = Field(description="The row changed (none: one to create)")
    action: str = Field(description="create, change or delete")
    label: str
    before: dict[str, Any] = Field(description="The fields it changes, as they are")
    after: dict[str, Any] = Field(description="The fields it changes, as they would be")
    loosens: list[str] = Field(description="Why it needs a second admin")
    status: str = Field(description="pending, applied, rejected, withdrawn or stale")
    requested_by: str
    requested_at: datetime
    decided_by: str | None
    decided_at: datetime | None
    note: str


def change_request_out(row: ChangeRequest) -> dict:
    return {
        "id": row.id,
        "project": row.project.slug,
        "subject": row.subject,
        "object_id": row.object_id,
        "action": row.action,
        "label": row.label,
        "before": row.before,
        "after": row.after,
        "loosens": row.loosens,
        "status": row.status,
        "requested_by": row.requested_by.get_username(),
        "requested_at": row.requested_at,
        "decided_by": row.decided_by.get_username() if row.decided_by_id else None,
        "decided_at": row.decided_at,
        "note": row.note,
    }


def _one(request_id: int) -> ChangeRequest:
    return ChangeRequest.objects.select_related("project", "requested_by", "decided_by").get(id=request_id)


@router.get("/change-requests", response=list[ChangeRequestOut], summary="Rule changes waiting for a second admin")
def list_change_requests(request):
    """The pending change requests of the projects the caller administers (a read: any token)."""
    authorize_token(request.auth, "read", what="change requests", request=request)
    return [change_request_out(row) for row in change_requests_pending(request.auth.user)[:500]]


@router.get("/change-requests/{change_id}", response=ChangeRequestOut, summary="One change request")
def get_change_request(request, change_id: PathId):
    project_id = ChangeRequest.objects.filter(id=change_id).values_list("project_id", flat=True).first()
    if project_id is None:
        raise NotFound(f"change request {change_id} does not exist")
    what = f"change request {change_id}"
    role = authorize(request.auth.user, project_id, "view", what=what, token=request.auth, request=request)
    if role != "admin":
        audit(actor=request.auth.user, action="denied:administer", project_id=project_id, target=what,
              outcome="denied", detail={"why": f"role {role}"}, request=request)  # fmt: skip
        raise Forbidden(f"your role in this project ({role}) may not see its change requests (its admins do)")
    return change_request_out(_one(change_id))


class ChangeDecisionIn(BodyIn):
    model_config = ConfigDict(
        json_schema_extra={"examples": [{"decision": "approve", "note": "v2 is the refunds endpoint since March"}]}
    )

    decision: Literal["approve", "reject"]
    note: str = Field(default="", max_length=2000, description="Required to reject")


@router.post(
    "/change-requests/{change_id}/decision",
    response=ChangeRequestOut,
    summary="Approve (the change applies now) or reject a change request (another admin of the project)",
)
def decide_change_request(request, change_id: PathId, payload: ChangeDecisionIn):
    change_request_decide(
        request_id=change_id,
        user=request.auth.user,
        approve=payload.decision == "approve",
        note=payload.note,
        token=request.auth,
        request=request,
    )
    return change_request_out(_one(change_id))


@router.post("/change-requests/{change_id}/withdraw", response=ChangeRequestOut, summary="Take back one's request")
def withdraw_change_request(request, change_id: PathId):
    project_id = ChangeRequest.objects.filter(id=change_id).values_list("project_id", flat=True).first()
    if project_id is None:
        raise NotFound(f"change request {change_id} does not exist")
    authorize(request.auth.user, project_id, "administer", what=f"change request {change_id}", token=request.auth,
              request=request)  # fmt: skip
    change_request_withdraw(request_id=change_id, user=request.auth.user, request=request)
    return change_request_out(_one(change_id))
