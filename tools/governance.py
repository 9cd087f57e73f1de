"""Which changes to a project's tools loosen its rules, and saving those changes (docs/access.md, "Four
eyes on the rules").

Loosening: lowering a tool's class or reversibility; an HTTP tool's URL, lookup URL, method or headers;
an MCP server's address (transport, URL, command), headers or secrets; a classification that asks less
than it did (or than an MCP server suggests). Such a change by one admin becomes a change request
(tenancy/governance.py) that another admin of the project decides; everything else, and every change a
superuser makes, applies at once. Either way the audit log has the fields before and after.
"""

from collections import namedtuple

from django.db import transaction

from core.errors import Conflict, InvalidInput
from tenancy.audit import audit
from tenancy.governance import change_request_open, second_admin_needed
from tenancy.models import ChangeRequest

from .catalog import CLASS_RANK, REVERSIBILITY_RANK
from .http_tools import http_tool_problems
from .mcp_tools import mcp_server_problems, mcp_tools_store
from .models import HttpTool, McpServer, McpTool, ToolClassification
from .registry import ToolClass

HTTP_TARGET = ("url", "lookup_url", "method", "headers", "idempotency_header")
MCP_ADDRESS = ("transport", "url", "command", "headers", "secrets")
SUBJECTS = {"tools.httptool": HttpTool, "tools.mcpserver": McpServer}
_Class = namedtuple("_Class", "tool_class reversibility")


def _lowered(before: str, after: str, ranks: dict) -> bool:
    return ranks.get(after, 2) < ranks.get(before, 2)


def values_of(row, fields) -> dict:
    """The fields' stored values (a foreign key by its id), as JSON."""
    return {name: getattr(row, row._meta.get_field(name).attname) for name in fields}


def changed_fields(before, row, fields) -> list[str]:
    """The editable fields whose values differ between two versions of a row."""
    return [name for name in fields if values_of(before, [name]) != values_of(row, [name])]


def _class_loosenings(before, after) -> list[str]:
    found = []
    if _lowered(before.tool_class, after.tool_class, CLASS_RANK):
        found.append(f"its class is lowered from {before.tool_class} to {after.tool_class}")
    if _lowered(before.reversibility or "", after.reversibility or "", REVERSIBILITY_RANK):
        was, now = before.reversibility or "none", after.reversibility or "none (a read)"
        found.append(f"its reversibility is lowered from {was} to {now}")
    return found


def http_tool_loosenings(before: HttpTool | None, after: HttpTool) -> list[str]:
    """Why this change of an HTTP tool needs a second admin (none: it may apply at once). A new tool
    needs none: its calls are judged as it is declared."""
    if before is None:
        return []
    found = [f"its {name.replace('_', ' ')} changes" for name in HTTP_TARGET if changed_fields(before, after, [name])]
    return found + _class_loosenings(before, after)


def mcp_server_loosenings(before: McpServer | None, after: McpServer) -> list[str]:
    if before is None:
        return []
    return [f"its {name} changes" for name in MCP_ADDRESS if changed_fields(before, after, [name])]


def mcp_suggestion(project_id: int, tool: str) -> McpTool | None:
    return McpTool.objects.filter(server__project_id=project_id, name=tool).first()


def classification_loosenings(before: ToolClassification | None, after: ToolClassification | None) -> list[str]:
    """A classification asks less than before (or, for a first one of an MCP tool, than its server
    suggests); ``after`` None: it is removed. Lowering an HTTP tool below its declaration is refused
    elsewhere (``classification_below_declaration``)."""
    project_id, tool = (after or before).project_id, (after or before).tool
    if after is None:  # removed: an MCP or unregistered tool is unclassified again, the strictest
        declared = HttpTool.objects.filter(project_id=project_id, name=tool).first()
        if declared is None:
            return []
        back = [f"removed, {why}" for why in _class_loosenings(before, declared)]
        return back + ([f"removed, its approval {before.approval} goes"] if before.approval else [])
    found = []
    if before is None:
        suggested = mcp_suggestion(project_id, tool)
        if suggested is not None:
            found = [
                f"the class confirmed is below what its MCP server suggests: {why}"
                for why in _class_loosenings(suggested, after)
            ]
        return found
    found += _class_loosenings(before, after)
    if (
        before.approval
        and after.approval != before.approval
        and not (before.approval == "always" and after.approval == "refuse")
    ):
        found.append(f"its approval changes from {before.approval} to {after.approval or 'as the policies say'}")
    return found


def classification_below_declaration(project_id: int, tool: str, tool_class: str, reversibility: str) -> list[dict]:
    """A classification cannot lower a declared HTTP tool: field errors, empty when it does not."""
    row = HttpTool.objects.filter(project_id=project_id, name=tool).first()
    if row is None:
        return []
    lowered = _class_loosenings(_Class(row.tool_class, row.reversibility), _Class(tool_class, reversibility))
    return [
        {
            "field": "tool_class" if "class" in why else "reversibility",
            "message": f"{tool} is an HTTP tool declared as {row.tool_class} {row.reversibility}".rstrip()
            + f": a classification can only make it stricter ({why}); change its declaration instead",
        }
        for why in lowered
    ]


def mcp_tool_class_refusal(project_id: int, tool: str, tool_class: str, reversibility: str) -> list[dict]:
    """An MCP tool's effect cannot be undone by Warden: a confirmed write is irreversible."""
    if tool_class != ToolClass.READ_ONLY and reversibility == "reversible" and mcp_suggestion(project_id, tool):
        return [{"field": "reversibility", "message": "MCP cannot say how an effect is undone: an MCP write is "
                 "irreversible"}]  # fmt: skip
    return []


# --- saving declarations (the admin) ---------------------------------------------------------------


def declaration_save(*, user, row, fields, request=None) -> ChangeRequest | None:
    """Save a checked HTTP tool or MCP server (``fields``: the form's editable fields) at once, or, when
    the change loosens the project's rules and ``user`` needs a second admin, open a change request
    instead and save nothing. Returns the request, if one was opened."""
    model = type(row)
    subject = model._meta.label_lower
    before = model.objects.filter(id=row.pk).first() if row.pk else None
    loosens = (http_tool_loosenings if model is HttpTool else mcp_server_loosenings)(before, row)
    if loosens and second_admin_needed(user, row.project_id):
        changed = changed_fields(before, row, fields)
        return change_request_open(
            user=user, project_id=row.project_id, subject=subject, object_id=row.pk, action="change",
            label=f"{model._meta.verbose_name} {row.name}", before=values_of(before, changed),
            after=values_of(row, changed), loosens=loosens, request=request,
        )  # fmt: skip
    changed = changed_fields(before, row, fields) if before is not None else list(fields)
    with transaction.atomic():
        row.save()
        change_audited(user, row, before, changed, loosens, request)
    return None


def change_audited(user, row, before, changed, loosens, request, change_request=None) -> None:
    """Audit a saved change of a project's configuration row: its fields before and after, why it loosens
    the rules, and the change request it applies (with who asked). Inside the saving transaction."""
    detail = {"object": str(row)[:200], "changed": sorted(changed), "after": values_of(row, changed)}
    if before is not None:
        detail["before"] = values_of(before, changed)
    if loosens:
        detail["loosens"] = loosens
    if change_request is not None:
        detail["change_request"] = change_request.id
        detail["asked_by"] = change_request.requested_by.get_username()
    audit(
        actor=user,
        action="admin:change" if before is not None else "admin:add",
        project_id=row.project_id,
        target=f"{row._meta.label_lower} {row.pk}",
        request=request,
        detail=detail,
    )


def declaration_change_preview(change: ChangeRequest):
    """The row a change request of an HTTP tool or MCP server would make, unsaved (None: it is gone, or
    no longer as it was asked about). An MCP server's tools are listed from it before the change applies."""
    model = SUBJECTS[change.subject]
    row = model.objects.filter(id=change.object_id, project_id=change.project_id).first()
    if row is None or values_of(row, list(change.before)) != change.before:
        return None
    for name, value in change.after.items():
        setattr(row, row._meta.get_field(name).attname, value)
    return row


def declaration_change_apply(*, change: ChangeRequest, user, listed: list | None = None, request=None):
    """Apply an approved change request of an HTTP tool or MCP server, if the row is still as it was asked
    about (else Conflict: it is stale), checked again as a whole. ``listed``: an MCP server's tools as its
    new address listed them (the caller asked, outside any transaction). Inside the deciding transaction."""
    model = SUBJECTS[change.subject]
    row = model.objects.select_for_update().filter(id=change.object_id, project_id=change.project_id).first()
    if row is None or values_of(row, list(change.before)) != change.before:
        raise Conflict(f"the {change.label} changed since this was asked for: ask again")
    before = model.objects.get(id=row.id)
    for name, value in change.after.items():
        setattr(row, row._meta.get_field(name).attname, value)
    problems = http_tool_problems(row) if model is HttpTool else mcp_server_problems(row)
    if problems:
        errors = [{"field": field or "", "message": message} for field, message in problems]
        raise InvalidInput(f"the {change.label} would not be valid any more", errors)
    row.save()
    if model is McpServer and listed is not None:
        mcp_tools_store(row, listed)
    change_audited(user, row, before, list(change.after), change.loosens, request, change_request=change)
    return row
