"""Scoped allow rules: created by reviewers (irreversible tools only by an admin, explicitly), revoked by
reviewers, both audited; the broker asks ``allow_rule_for`` before it parks a call for approval."""

from django.db.models import Q
from django.utils import timezone

from runs.errors import Forbidden, InvalidInput, NotFound

from .access import authorize
from .audit import audit
from .models import AllowRule, Project


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
    token=None,
    request=None,
) -> AllowRule:
    from tools.registry import TOOLS

    role = authorize(user, project.id, "decide", what=f"allow rules of {project.slug}", token=token, request=request)
    spec = TOOLS.get(tool)
    if spec is None or spec.internal or not spec.is_write:
        raise InvalidInput(f"{tool!r} is not a write tool", [{"field": "tool", "message": "no such write tool"}])
    if spec.reversibility == "irreversible":
        if not covers_irreversible:
            raise InvalidInput(
                f"{tool} is irreversible: an allow rule covers it only when an admin says so explicitly",
                [{"field": "covers_irreversible", "message": "required for an irreversible tool"}],
            )
        if role != "admin":
            audit(
                actor=user,
                action="allow_rule_add",
                outcome="denied",
                project_id=project.id,
                target=tool,
                request=request,
                detail={"why": "irreversible tool, not an admin"},
            )
            raise Forbidden("only a project admin may allow an irreversible tool without review")
    unknown = set(arguments or {}) - set(spec.arguments.model_fields)
    if unknown:
        raise InvalidInput(f"{tool} has no arguments {sorted(unknown)}", [{"field": "arguments", "message": "unknown"}])
    if run is not None and run.project_id != project.id:
        raise NotFound(f"run {run.id} does not exist")
    rule = AllowRule.objects.create(
        project=project,
        tool=tool,
        arguments=arguments or {},
        agent=agent,
        run=run,
        covers_irreversible=covers_irreversible,
        note=note[:2000],
        created_by=user,
    )
    audit(
        actor=user,
        action="allow_rule_add",
        project_id=project.id,
        target=str(rule)[:200],
        request=request,
        detail={"rule": rule.id, "arguments": rule.arguments},
    )
    return rule


def allow_rule_revoke(*, user, rule_id: int, token=None, request=None) -> AllowRule:
    rule = AllowRule.objects.select_related("project").filter(id=rule_id).first()
    if rule is None:
        raise NotFound(f"allow rule {rule_id} does not exist")
    authorize(user, rule.project_id, "decide", what=f"allow rule {rule_id}", token=token, request=request)
    if rule.revoked_at is None:
        AllowRule.objects.filter(id=rule.id, revoked_at__isnull=True).update(revoked_at=timezone.now(), revoked_by=user)
        audit(
            actor=user,
            action="allow_rule_revoke",
            project_id=rule.project_id,
            target=str(rule)[:200],
            request=request,
            detail={"rule": rule.id},
        )
    rule.refresh_from_db()
    return rule


def allow_rule_for(*, run, task, tool: str, arguments: dict, irreversible: bool) -> AllowRule | None:
    """An active rule that covers this call, if any."""
    from runs.models import Run

    project_id = Run.objects.filter(id=run.id).values_list("project_id", flat=True).first()
    rules = AllowRule.objects.filter(project_id=project_id, tool=tool, revoked_at__isnull=True)
    rules = rules.filter(Q(run__isnull=True) | Q(run_id=run.id)).filter(
        Q(agent__isnull=True) | Q(agent_id=task.agent_id)
    )
    if irreversible:
        rules = rules.filter(covers_irreversible=True)
    return next((rule for rule in rules.order_by("id") if rule.covers(arguments=arguments)), None)
