"""Who may do what, where. Every view, API endpoint and admin action asks here, on the server.

A user acts on a project through their role in it; a superuser is an admin everywhere. An object of a
project the user is not a member of answers 404 (its existence is not revealed); a member whose role
does not allow the action gets 403. An API token narrows its user's rights to its scopes. Every refusal
is written to the audit log.
"""

from runs.errors import Forbidden, NotFound

from .models import ApiToken, Membership, Project

Role = Membership.Role
DEFAULT_PROJECT = "default"

# action → (roles that may do it, the token scope it needs)
ACTIONS: dict[str, tuple[frozenset, str]] = {
    "view": (frozenset({Role.VIEWER, Role.OPERATOR, Role.REVIEWER, Role.ADMIN}), ApiToken.Scope.READ.value),
    "start": (frozenset({Role.OPERATOR, Role.ADMIN}), ApiToken.Scope.RUN.value),
    "operate": (frozenset({Role.OPERATOR, Role.ADMIN}), ApiToken.Scope.OPERATE.value),
    "decide": (frozenset({Role.REVIEWER, Role.ADMIN}), ApiToken.Scope.APPROVE.value),
    # Configure the project: classify tools, change its policies and memberships (admin pages, the API).
    "administer": (frozenset({Role.ADMIN}), ApiToken.Scope.ADMIN.value),
}


def default_project() -> Project:
    project, _ = Project.objects.get_or_create(slug=DEFAULT_PROJECT, defaults={"name": "Default"})
    return project


def role_of(user, project_id: int) -> str | None:
    if user is None or not user.is_active:
        return None
    if user.is_superuser:
        return Role.ADMIN
    return Membership.objects.filter(user=user, project_id=project_id).values_list("role", flat=True).first()


def project_ids(user, action: str = "view") -> list[int] | None:
    """The projects where ``user`` may do ``action``; None means every project (a superuser)."""
    if user is None or not user.is_active:
        return []
    if user.is_superuser:
        return None
    roles = ACTIONS[action][0]
    return list(Membership.objects.filter(user=user, role__in=roles).values_list("project_id", flat=True))


def visible_rows(rows, user, *, field: str = "project_id", action: str = "view"):
    """``rows`` narrowed to the projects where ``user`` may ``action`` (all of them for a superuser)."""
    allowed = project_ids(user, action)
    return rows if allowed is None else rows.filter(**{f"{field}__in": allowed})


def authorize(user, project_id: int, action: str, *, what: str, token: ApiToken | None = None, request=None) -> str:
    """Return the user's role, or raise NotFound (not a member) / Forbidden (role or token scope)."""
    roles, scope = ACTIONS[action]
    role = role_of(user, project_id)
    if role is None:
        _denied(user, project_id, action, what, "not a member", request)
        raise NotFound(f"{what} does not exist")
    if role not in roles:
        _denied(user, project_id, action, what, f"role {role}", request)
        raise Forbidden(f"your role in this project ({role}) may not {action} {what}")
    if token is not None and scope not in (token.scopes or []):
        _denied(user, project_id, action, what, f"token without the {scope} scope", request)
        raise Forbidden(f"this API token lacks the {scope!r} scope needed to {action} {what}")
    if token is not None and token.for_agent and action in ("decide", "administer"):  # even if its scopes were edited
        _denied(user, project_id, action, what, "an agent's token", request)
        raise Forbidden(f"a token used by an agent can never {action} ({what})")
    return role


def authorize_token(token: ApiToken | None, scope: str, *, what: str, request=None) -> None:
    """For endpoints that are not about one project (the sandbox listing): the token's scope only."""
    if token is not None and scope not in (token.scopes or []):
        _denied(token.user, None, scope, what, f"token without the {scope} scope", request)
        raise Forbidden(f"this API token lacks the {scope!r} scope needed for {what}")


def _denied(user, project_id, action: str, what: str, why: str, request) -> None:
    from .audit import audit

    # Checks run before any service opens its transaction, so the record is not rolled back with it.
    audit(
        actor=user,
        action=f"denied:{action}",
        project_id=project_id,
        target=what,
        outcome="denied",
        detail={"why": why},
        request=request,
    )


def membership_grant(*, user, project: Project, role: str) -> Membership:
    from runs.events import access_changed

    membership, _ = Membership.objects.update_or_create(user=user, project=project, defaults={"role": role})
    access_changed(user.id)
    return membership


def membership_revoke(*, user, project: Project) -> int:
    from runs.events import access_changed

    deleted, _ = Membership.objects.filter(user=user, project=project).delete()
    access_changed(user.id)
    return deleted
