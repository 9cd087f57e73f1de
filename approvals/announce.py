"""What the outside world hears about a request: the reviewers' notifications of a new one (recorded in the
transaction that made it, sent after) and the approval.requested / approval.decided webhooks."""

from integrations.webhooks import webhook_emit
from policy.models import ApprovalRequest
from runs.models import Run

from .notify import notifications_add


def request_announce(request: ApprovalRequest, event: str) -> None:
    project_id = Run.objects.filter(id=request.run_id).values_list("project_id", flat=True).first()
    data = {
        "request": request.id,
        "run": request.run_id,
        "kind": request.kind,
        "status": request.status,
        "summary": request.summary,
        "decided_by": request.decided_by.get_username() if request.decided_by_id else None,
        "note": request.note,
    }
    webhook_emit(event=event, project_id=project_id, data=data)


def approval_requested(request: ApprovalRequest) -> None:
    """A top-level request was made (policy/services.py, through core.hooks.APPROVAL_REQUESTED, in its
    transaction): its reviewers are told, and the project's webhooks."""
    notifications_add(request, kind="new")
    request_announce(request, "approval.requested")
