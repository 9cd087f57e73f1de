"""The reviewer queue's reads: pending requests of the viewer's projects, and what a card shows of one (its
operations, the agent's stated reason, the steps before it). ``visible`` is the viewer's scope: the ids of
the projects they may see, None for every project. The card is drawn by dashboard/views/queue.py.

Every function here reads the approval requests' rows: they move with that table's owner."""

from policy.models import ApprovalRequest
from runs.models import Span
from tenancy.models import ChangeRequest
from tools.models import ToolOperation

TRACE_STEPS = 5  # the steps before the call a card lists


def approvals_pending(*, visible: list[int] | None, after: int = 0):
    """Top-level pending requests newer than ``after``, oldest first, with their run, workflow, task and
    policy. One query when evaluated."""
    rows = ApprovalRequest.objects.filter(status="pending", parent=None, id__gt=after)
    if visible is not None:
        rows = rows.filter(run__project_id__in=visible)
    return rows.select_related("run__project", "run__workflow", "task", "policy").order_by("requested_at", "id")


def approvals_pending_counted():
    """Pending top-level requests, as the queue and the runs list count them (a bundle of five e-mails is
    one request). A queryset for a subquery: the runs list correlates it to each of its rows."""
    return ApprovalRequest.objects.filter(status=ApprovalRequest.Status.PENDING, parent=None)


def approval_get(request_id: int) -> ApprovalRequest | None:
    """One request with its run's project (the decide action's access check). One query."""
    return ApprovalRequest.objects.select_related("run__project").filter(id=request_id).first()


def approval_operations(request: ApprovalRequest) -> list[ToolOperation]:
    """The ledger rows a request holds: its own operation, or a bundle's items' in their order. One or two
    queries."""
    return list(ToolOperation.objects.filter(approval=request)) or list(
        ToolOperation.objects.filter(approval__parent=request).order_by("order", "id")
    )


def approval_asked(first: ToolOperation) -> tuple[str, list[tuple]]:
    """The agent's stated reason for the call (the model step that asked for it) and the (step, kind, name)
    of the steps up to it. Two queries; none for a call outside a task's steps."""
    if not (first.task_id and first.step):
        return "", []
    asked = Span.objects.filter(task_id=first.task_id, step=first.step - 1).values_list("body", flat=True).first()
    trace = list(
        Span.objects.filter(task_id=first.task_id, step__isnull=False, step__lte=first.step)
        .order_by("-step")
        .values_list("step", "kind", "name")[:TRACE_STEPS]
    )[::-1]
    return (asked or {}).get("text", ""), trace


def change_request_project(change_id: int) -> int | None:
    """The project of a change request, or None. One query."""
    return ChangeRequest.objects.filter(id=change_id).values_list("project_id", flat=True).first()


def change_request_get(change_id: int) -> ChangeRequest:
    """A change request with its project and people. One query."""
    return ChangeRequest.objects.select_related("project", "requested_by", "decided_by").get(id=change_id)
