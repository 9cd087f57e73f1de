"""Project configuration of tools outside Warden's registry: what an external agent's tool does.

Until a project admin classifies it, such a tool is treated as a non-idempotent, irreversible write
that waits for a reviewer (tools/gate.py). A classification is the project's word, never an agent's:
only project admins make it (tokens need the ``admin`` scope; an agent's token never has it), and each
change is audited with what it was before.
"""

import re

from django.db import transaction

from core.errors import InvalidInput
from tenancy.access import authorize
from tenancy.audit import audit
from tenancy.models import Project

from .models import ToolClassification, ToolOperation
from .registry import TOOLS

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
) -> ToolClassification:
    """Say what ``tool`` does in ``project`` (a project admin), or change what was said."""
    authorize(user, project.id, "administer", what=f"tool classes of {project.slug}", token=token, request=request)
    errors = classification_refusal(tool=tool, tool_class=tool_class, reversibility=reversibility, approval=approval)
    if errors:
        raise InvalidInput(f"cannot classify {tool!r}", errors)
    with transaction.atomic():
        before = (
            ToolClassification.objects.select_for_update()
            .filter(project=project, tool=tool)
            .values("tool_class", "reversibility", "approval")
            .first()
        )
        row, _ = ToolClassification.objects.update_or_create(
            project=project,
            tool=tool,
            defaults={
                "tool_class": tool_class,
                "reversibility": reversibility,
                "approval": approval,
                "note": note[:2000],
                "classified_by": user,
            },
        )
        after = {"tool_class": tool_class, "reversibility": reversibility, "approval": approval}
        audit(
            actor=user,
            action="tool_classify",
            project_id=project.id,
            target=tool,
            request=request,
            detail={"before": before, "after": after},
        )
    return row


def tool_classification_remove(*, user, row: ToolClassification, request=None) -> None:
    """Forget a classification: the tool is treated as the most dangerous class again."""
    authorize(user, row.project_id, "administer", what=f"tool classes of {row.project.slug}", request=request)
    with transaction.atomic():
        ToolClassification.objects.filter(id=row.id).delete()
        detail = {"before": {"tool_class": row.tool_class, "reversibility": row.reversibility}}
        audit(
            actor=user,
            action="tool_unclassify",
            project_id=row.project_id,
            target=row.tool,
            request=request,
            detail=detail,
        )
