"""Scoped allow rules: created by reviewers (irreversible tools only by an admin, explicitly), revoked by
reviewers (policy/rules.py), both audited, each with a lifetime. The gate (tools/gate.py) decides at each call whether a
rule may stand in for a reviewer there: only where its creator could have approved alone."""

from django.conf import settings
from django.utils import timezone

from core.errors import Forbidden, InvalidInput, NotFound
from policy.models import AllowRule
from tenancy.access import authorize
from tenancy.audit import audit
from tenancy.models import Project
from tools.catalog import tool_spec


def _tool_refusal(user, project: Project, tool: str, arguments, *, covers_irreversible: bool, role: str, request):
    """Raises unless a rule may cover this tool: a write tool, its arguments its own; an irreversible one
    only by an admin who says so explicitly."""
    spec = tool_spec(tool, project.id)
    if spec is None or spec.internal or not spec.is_write:
        raise InvalidInput(f"{tool!r} is not a write tool", [{"field": "tool", "message": "no such write tool"}])
    if spec.reversibility == "irreversible":
        if not covers_irreversible:
            raise InvalidInput(
                f"{tool} is irreversible: an allow rule covers it only when an admin says so explicitly",
                [{"field": "covers_irreversible", "message": "required for an irreversible tool"}],
            )
        if role != "admin":
            _refused(user, project, tool, request, "irreversible tool, not an admin")
            raise Forbidden("only a project admin may allow an irreversible tool without review")
    unknown = set(arguments or {}) - spec.argument_names()
    if unknown:
        raise InvalidInput(f"{tool} has no arguments {sorted(unknown)}", [{"field": "arguments", "message": "unknown"}])


def allow_rule_create(
    *,
    user,
    project: Project,
    tool: str,
    arguments: dict | None = None,
    agent=None,
    run=None,
    covers_irreversible: bool = False,
    note: str = "",
    expires_at=None,
    token=None,
    request=None,
) -> AllowRule:
    """``expires_at``: when the rule ends (at most ``ALLOW_RULE_MAX_DAYS`` ahead, which is also the
    default)."""

    role = authorize(user, project.id, "decide", what=f"allow rules of {project.slug}", token=token, request=request)
    _tool_refusal(user, project, tool, arguments, covers_irreversible=covers_irreversible, role=role, request=request)
    if run is not None and run.project_id != project.id:
        raise NotFound(f"run {run.id} does not exist")
    if run is not None and run.started_by_id == user.pk:
        _refused(user, project, tool, request, "a rule for a run its creator started")
        raise Forbidden("separation of duties: an allow rule cannot cover a run you started")
    now = timezone.now()
    longest = now + timezone.timedelta(days=settings.WARDEN["ALLOW_RULE_MAX_DAYS"])
    if expires_at is not None and not now < expires_at <= longest:
        raise InvalidInput(
            f"an allow rule ends in the future and within {settings.WARDEN['ALLOW_RULE_MAX_DAYS']:g} days",
            [{"field": "expires_at", "message": "in the past or beyond the longest lifetime"}],
        )
    rule = AllowRule.objects.create(
        project=project,
        tool=tool,
        arguments=arguments or {},
        agent=agent,
        run=run,
        covers_irreversible=covers_irreversible,
        note=note[:2000],
        created_by=user,
        expires_at=expires_at or longest,
    )
    audit(
        actor=user,
        action="allow_rule_add",
        project_id=project.id,
        target=str(rule)[:200],
        request=request,
        detail={"rule": rule.id, "arguments": rule.arguments, "expires_at": rule.expires_at.isoformat()},
    )
    return rule


def _refused(user, project: Project, tool: str, request, why: str) -> None:
    audit(
        actor=user,
        action="allow_rule_add",
        outcome="denied",
        project_id=project.id,
        target=tool,
        request=request,
        detail={"why": why},
    )
