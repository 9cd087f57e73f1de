"""Project configuration of tools outside Warden's registry: what an external agent's tool does.

Until a project admin classifies it, such a tool is treated as a non-idempotent, irreversible write
that waits for a reviewer (tools/gate.py). A classification is the project's word, never an agent's:
only project admins make it (tokens need the ``admin`` scope; an agent's token never has it), and each
change is audited with what it was before.
"""

import re

from django.db import transaction

from core.errors import Conflict, InvalidInput
from tenancy.access import authorize
from tenancy.audit import audit
from tenancy.governance import change_request_open, second_admin_needed
from tenancy.models import ChangeRequest, Project

from .governance import (
    classification_below_declaration,
    classification_loosenings,
    mcp_tool_class_refusal,
    values_of,
)
from .models import ToolClassification, ToolOperation
from .registry import TOOLS

SUBJECT = "tools.toolclassification"

TOOL_NAME = re.compile(r"^[a-zA-Z0-9][-a-zA-Z0-9_.:]{0,63}$")
TOOL_NAME_RULE = "letters, digits and . _ - :, at most 64 characters"


def classification_refusal(*, tool: str, tool_class: str, reversibility: str, approval: str) -> list[dict]:
    """What is wrong with a classification (field errors); an empty list when it may be saved."""
    errors = []
    if not TOOL_NAME.match(tool or ""):
        errors.append({"field": "tool", "message": f"a tool name: {TOOL_NAME_RULE}"})
    elif tool in TOOLS:
        errors.append({"field": "tool", "message": "a tool of Warden's registry: its code says what it does"})
    if tool_class not in ToolOperation.ToolClass.values:
        errors.append({"field": "tool_class", "message": f"one of {', '.join(ToolOperation.ToolClass.values)}"})
    elif tool_class == "read_only" and reversibility:
        errors.append({"field": "reversibility", "message": "a read changes nothing: leave it empty"})
    elif tool_class != "read_only" and reversibility not in ("reversible", "irreversible"):
        errors.append({"field": "reversibility", "message": "a write is reversible or irreversible"})
    if approval not in ToolClassification.Approval.values:
        errors.append({"field": "approval", "message": "empty (by policy), always or refuse"})
    return errors


CLASSIFICATION_FIELDS = ("tool_class", "reversibility", "approval", "note")


def tool_classification_set(
    *,
    user,
    project: Project,
    tool: str,
    tool_class: str,
    reversibility: str = "",
    approval: str = "",
    note: str = "",
    token=None,
    request=None,
) -> ToolClassification | ChangeRequest:
    """Say what ``tool`` does in ``project`` (a project admin), or change what was said. One that asks
    less than before (or than an MCP server suggests) waits for a second admin: the change request is
    returned and nothing is written. A classification never lowers a declared HTTP tool (refused)."""
    authorize(user, project.id, "administer", what=f"project {project.slug}", token=token, request=request)
    errors = classification_refusal(tool=tool, tool_class=tool_class, reversibility=reversibility, approval=approval)
    if not errors:
        errors = classification_below_declaration(project.id, tool, tool_class, reversibility)
        errors += mcp_tool_class_refusal(project.id, tool, tool_class, reversibility)
    if errors:
        raise InvalidInput(f"cannot classify {tool!r}", errors)
    before = ToolClassification.objects.filter(project=project, tool=tool).first()
    values = {"tool_class": tool_class, "reversibility": reversibility, "approval": approval, "note": note[:2000]}
    loosens = classification_loosenings(before, ToolClassification(project=project, tool=tool, **values))
    if loosens and second_admin_needed(user, project.id):
        return change_request_open(
            user=user, project_id=project.id, subject=SUBJECT, object_id=before.pk if before else None,
            action="change" if before else "create", label=f"the classification of {tool}",
            before=values_of(before, CLASSIFICATION_FIELDS) if before else {}, after={"tool": tool, **values},
            loosens=loosens, request=request,
        )  # fmt: skip
    with transaction.atomic():
        return _classification_write(user, project.id, tool, values, loosens, request)


def _classification_write(user, project_id: int, tool: str, values: dict, loosens, request, change=None):
    before = (
        ToolClassification.objects.select_for_update()
        .filter(project_id=project_id, tool=tool)
        .values("tool_class", "reversibility", "approval")
        .first()
    )
    row, _ = ToolClassification.objects.update_or_create(
        project_id=project_id, tool=tool, defaults={**values, "classified_by": user}
    )
    detail = {"before": before, "after": {k: values[k] for k in ("tool_class", "reversibility", "approval")}}
    if loosens:
        detail["loosens"] = loosens
    if change is not None:
        detail |= {"change_request": change.id, "asked_by": change.requested_by.get_username()}
    audit(actor=user, action="tool_classify", project_id=project_id, target=tool, request=request, detail=detail)
    return row


def tool_classification_remove(*, user, row: ToolClassification, request=None) -> ChangeRequest | None:
    """Forget a classification: an MCP or unregistered tool is treated as the most dangerous class again
    (at once); an HTTP tool goes back to its declaration (a second admin's yes when that loosens it)."""
    authorize(user, row.project_id, "administer", what=f"project {row.project.slug}", request=request)
    loosens = classification_loosenings(row, None)
    if loosens and second_admin_needed(user, row.project_id):
        return change_request_open(
            user=user, project_id=row.project_id, subject=SUBJECT, object_id=row.pk, action="delete",
            label=f"the classification of {row.tool}", before=values_of(row, CLASSIFICATION_FIELDS), after={},
            loosens=loosens, request=request,
        )  # fmt: skip
    with transaction.atomic():
        _classification_delete(user, row, request)
    return None


def _classification_delete(user, row: ToolClassification, request, change=None) -> None:
    ToolClassification.objects.filter(id=row.id).delete()
    detail = {"before": {"tool_class": row.tool_class, "reversibility": row.reversibility, "approval": row.approval}}
    if change is not None:
        detail |= {"change_request": change.id, "asked_by": change.requested_by.get_username()}
    audit(actor=user, action="tool_unclassify", project_id=row.project_id, target=row.tool, request=request,
          detail=detail)  # fmt: skip


def classification_change_apply(*, change: ChangeRequest, user, request=None) -> None:
    """Apply an approved change request of a classification, if it is still as it was asked about (else
    Conflict: it is stale). Inside the deciding transaction."""
    row = ToolClassification.objects.select_for_update().filter(id=change.object_id).first()
    if change.object_id is None:
        tool = change.after.get("tool", "")
        if ToolClassification.objects.filter(project_id=change.project_id, tool=tool).exists():
            raise Conflict(f"{change.label} was made meanwhile: ask again")
    elif row is None or row.project_id != change.project_id or values_of(row, CLASSIFICATION_FIELDS) != change.before:
        raise Conflict(f"{change.label} changed since this was asked for: ask again")
    if change.action == ChangeRequest.Action.DELETE:
        _classification_delete(user, row, request, change)
        return
    values = {k: change.after[k] for k in CLASSIFICATION_FIELDS}
    tool = row.tool if row is not None else change.after["tool"]
    _classification_write(user, change.project_id, tool, values, change.loosens, request, change)
