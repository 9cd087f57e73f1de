"""Approval policies and waivers as a project's admins change them (the admin): checked, and saved at once
when the change makes the rules stricter, or held as a change request for a second admin when it
loosens them (tenancy/governance.py; docs/access.md, "Four eyes on the rules").

Loosening: a waiver made, enabled or widened; a requiring policy disabled, removed, turned into a
waiver, or weakened (a smaller quorum, reviewers where admins decided, a narrower tool, workflow or
project, another condition, a rejection that no longer fails the task).
"""

import re

from django.conf import settings
from django.db import transaction

from core.errors import Conflict, InvalidInput
from policy.models import ApprovalPolicy
from tenancy.access import default_project
from tenancy.audit import audit
from tenancy.governance import change_request_open, second_admin_needed
from tenancy.models import ChangeRequest
from tools.governance import change_audited, changed_fields, values_of
from tools.registry import TOOLS, Reversibility

SUBJECT = "approvals.approvalpolicy"
FIELDS = (
    "name",
    "enabled",
    "effect",
    "project",
    "workflow",
    "tool",
    "condition",
    "quorum",
    "decided_by_role",
    "expires_after_seconds",
    "remind_before_seconds",
    "on_expiry",
    "on_reject",
)
OPERATORS = (">", ">=", "<", "<=", "==", "!=", "in")
TOOL = re.compile(r"^[a-zA-Z0-9][-a-zA-Z0-9_.:]{0,63}$")
WAIVE, REQUIRE = ApprovalPolicy.Effect.WAIVE, ApprovalPolicy.Effect.REQUIRE


def policy_problems(row: ApprovalPolicy) -> list[tuple[str, str]]:
    """What is wrong with a policy, as (field, message); empty when it may be saved."""
    problems = []
    if row.effect not in ApprovalPolicy.Effect.values:
        problems.append(("effect", "require (calls wait) or waive (irreversible calls leave unattended)"))
    if row.effect == WAIVE and row.project_id is None:
        problems.append(("project", "a waiver is one project's: name the project"))
    if row.tool and not TOOL.fullmatch(row.tool):
        problems.append(("tool", "a tool's name (letters, digits and . _ - :), or empty for every tool"))
    condition = row.condition
    if condition not in ({}, None) and not (
        isinstance(condition, dict)
        and set(condition) == {"field", "op", "value"}
        and isinstance(condition["field"], str)
        and condition["op"] in OPERATORS
    ):
        example = '{"field": "amount", "op": ">", "value": 100}'
        problems.append(("condition", f"empty, or {example}; op one of {', '.join(OPERATORS)}"))
    if row.condition is None:
        problems.append(("condition", "an object, or {} for none"))
    if not row.quorum or row.quorum < 1:
        problems.append(("quorum", "at least 1"))
    return problems


def _narrowed(before, after, name: str) -> bool:
    """A scope (tool, workflow, project) that covered everything, or one thing, now covers another one:
    what it covered before is no longer covered."""
    was, now = values_of(before, [name])[name], values_of(after, [name])[name]
    return was != now and now not in ("", None)


def policy_loosenings(before: ApprovalPolicy | None, after: ApprovalPolicy | None) -> list[str]:
    """Why this change needs a second admin (none: it may apply at once)."""
    if after is None:
        return ["an enabled approval policy is removed"] if before.effect == REQUIRE and before.enabled else []
    if before is None:
        return ["a waiver lets irreversible calls leave without a reviewer"] if after.effect == WAIVE else []
    if after.effect == WAIVE:
        return _waiver_loosenings(before, after)
    if not before.enabled:
        return []  # a disabled policy asked nothing: anything it asks now is more
    found = ["it is disabled"] if not after.enabled else []
    found += [f"its {name} narrows" for name in ("tool", "workflow", "project") if _narrowed(before, after, name)]
    if after.quorum < before.quorum:
        found.append(f"its quorum drops from {before.quorum} to {after.quorum}")
    if before.decided_by_role == "admin" and after.decided_by_role != "admin":
        found.append("reviewers may decide what only admins decided")
    if (before.condition or {}) != (after.condition or {}):
        found.append("its condition changes")
    if before.on_reject == ApprovalPolicy.OnReject.FAIL_TASK and after.on_reject != before.on_reject:
        found.append("a rejection no longer fails the task")
    return found


def _waiver_loosenings(before: ApprovalPolicy, after: ApprovalPolicy) -> list[str]:
    if before.effect != WAIVE:
        return ["an approval policy becomes a waiver"]
    if not after.enabled:
        return []
    found = ["the waiver is enabled"] if not before.enabled else []
    for name in ("tool", "workflow"):
        if values_of(before, [name])[name] not in ("", None) and values_of(after, [name]) != values_of(before, [name]):
            found.append(f"the waiver's {name} changes")
    if after.project_id != before.project_id:
        found.append("the waiver moves to another project")
    if (before.condition or {}) != (after.condition or {}):
        found.append("the waiver's condition changes")
    return found


def policy_save(*, user, row: ApprovalPolicy, fields=FIELDS, request=None) -> ChangeRequest | None:
    """Save a checked policy at once, or open a change request when it loosens a project's rules and
    ``user`` needs a second admin (nothing is saved then; the request is returned)."""
    problems = policy_problems(row)
    if problems:
        raise InvalidInput("the policy is not valid", [{"field": f, "message": m} for f, m in problems])
    before = ApprovalPolicy.objects.filter(id=row.pk).first() if row.pk else None
    loosens = policy_loosenings(before, row)
    project_id = row.project_id or (before.project_id if before else None)
    if loosens and project_id is not None and second_admin_needed(user, project_id):
        changed = changed_fields(before, row, fields) if before is not None else list(FIELDS)
        return change_request_open(
            user=user, project_id=project_id, subject=SUBJECT, object_id=row.pk,
            action="change" if before else "create", label=f"approval policy {row.name!r}",
            before=values_of(before, changed) if before else {}, after=values_of(row, changed), loosens=loosens,
            request=request,
        )  # fmt: skip
    changed = changed_fields(before, row, fields) if before is not None else list(FIELDS)
    with transaction.atomic():
        row.save()
        change_audited(user, row, before, changed, loosens, request)
    return None


def policy_delete(*, user, row: ApprovalPolicy, request=None) -> ChangeRequest | None:
    loosens = policy_loosenings(row, None)
    if loosens and row.project_id is not None and second_admin_needed(user, row.project_id):
        return change_request_open(
            user=user, project_id=row.project_id, subject=SUBJECT, object_id=row.pk, action="delete",
            label=f"approval policy {row.name!r}", before=values_of(row, FIELDS), after={}, loosens=loosens,
            request=request,
        )  # fmt: skip
    with transaction.atomic():
        _deleted(user, row, loosens, request)
    return None


def _deleted(user, row: ApprovalPolicy, loosens, request, change=None) -> None:
    label, before = f"approvals.approvalpolicy {row.pk}", values_of(row, FIELDS)
    row.delete()
    detail = {"object": str(row)[:200], "before": before} | ({"loosens": loosens} if loosens else {})
    if change is not None:
        detail |= {"change_request": change.id, "asked_by": change.requested_by.get_username()}
    audit(actor=user, action="admin:delete", project_id=before["project"], target=label, request=request,
          detail=detail)  # fmt: skip


def policy_change_apply(*, change: ChangeRequest, user, request=None) -> None:
    """Apply an approved change request of a policy, if the row is still as it was asked about (else
    Conflict: it is stale), checked again. Inside the deciding transaction."""
    if change.action == ChangeRequest.Action.CREATE:
        row, before = ApprovalPolicy(), None
    else:
        row = ApprovalPolicy.objects.select_for_update().filter(id=change.object_id).first()
        if row is None or values_of(row, list(change.before)) != change.before:
            raise Conflict(f"{change.label} changed since this was asked for: ask again")
        before = ApprovalPolicy.objects.get(id=row.id)
    if change.action == ChangeRequest.Action.DELETE:
        _deleted(user, row, change.loosens, request, change)
        return
    for name, value in change.after.items():
        setattr(row, row._meta.get_field(name).attname, value)
    if (row.project_id or change.project_id) != change.project_id:
        raise Conflict("a change request applies to its own project only")
    problems = policy_problems(row)
    if problems:
        errors = [{"field": f, "message": m} for f, m in problems]
        raise InvalidInput(f"{change.label} would not be valid any more", errors)
    row.save()
    change_audited(user, row, before, list(change.after), change.loosens, request, change)


def demo_waivers_load() -> list[ApprovalPolicy]:
    """The demo project's explicit waivers: the sandbox's irreversible tools (its e-mail service) leave
    without a reviewer there, as the drills expect. Idempotent; each waiver made is audited. Nothing
    while the sandbox tools are off."""
    if not settings.WARDEN["SANDBOX_TOOLS"]:
        return []
    project, made = default_project(), []
    for spec in TOOLS.values():
        if spec.module != "tools.sandbox_tools" or spec.internal or spec.reversibility != Reversibility.IRREVERSIBLE:
            continue
        waiver, created = ApprovalPolicy.objects.get_or_create(
            project=project,
            effect=WAIVE,
            tool=spec.name,
            workflow=None,
            defaults={"name": f"Demo: the sandbox's {spec.name} leaves without a reviewer"},
        )
        if created:
            detail = {"object": str(waiver), "after": values_of(waiver, FIELDS), "why": "the demo's setup"}
            target = f"approvals.approvalpolicy {waiver.pk}"
            audit(actor=None, action="admin:add", project_id=project.id, target=target, detail=detail)
        made.append(waiver)
    return made
