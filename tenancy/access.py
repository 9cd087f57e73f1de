"""Who may do what, where. Every view, API endpoint and admin action asks here, on the server.

A user acts on a project through their role in it; a superuser is an admin everywhere. An object of a
project the user is not a member of answers 404 (its existence is not revealed); a member whose role
does not allow the action gets 403. An API token narrows its user's rights to its scopes. Every refusal
is written to the audit log.
"""

from core.bus import access_changed
from core.errors import Forbidden, InvalidInput, NotFound

from .audit import audit
from .models import ApiToken, Membership, Project

Role = Membership.Role
DEFAULT_PROJECT = "default"

# action → (roles that may do it, the token scope it needs; a tuple: any one of them)
ACTIONS: dict[str, tuple[frozenset, str | tuple[str, ...]]] = {
    "view": (frozenset({Role.VIEWER, Role.OPERATOR, Role.REVIEWER, Role.ADMIN}), ApiToken.Scope.READ.value),
    "start": (frozenset({Role.OPERATOR, Role.ADMIN}), ApiToken.Scope.RUN.value),
    "operate": (frozenset({Role.OPERATOR, Role.ADMIN}), ApiToken.Scope.OPERATE.value),
    "decide": (frozenset({Role.REVIEWER, Role.ADMIN}), ApiToken.Scope.APPROVE.value),
    # Grow an evaluation suite: add cases (a reviewed run among them). Reviewers annotate runs, operators
    # run suites: both keep what they saw as a case, with the token scope either of them works with.
    "curate": (
        frozenset({Role.OPERATOR, Role.REVIEWER, Role.ADMIN}),
        (ApiToken.Scope.OPERATE.value, ApiToken.Scope.APPROVE.value),
    ),
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


def actions_anywhere(user) -> frozenset[str]:
    """The actions ``user`` may take in at least one project (every action for a superuser): what the nav
    offers. One query; each page checks again."""
    if user is None or not user.is_active or not user.is_authenticated:
        return frozenset()
    if user.is_superuser:
        return frozenset(ACTIONS)
    roles = set(Membership.objects.filter(user=user).values_list("role", flat=True).distinct())
    return frozenset(action for action, (allowed, _) in ACTIONS.items() if roles & allowed)


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
    scopes = (scope,) if isinstance(scope, str) else scope
    if token is not None and not set(scopes) & set(token.scopes or []):
        _denied(user, project_id, action, what, f"token without the {' or '.join(scopes)} scope", request)
        needed = " or ".join(repr(s) for s in scopes)
        raise Forbidden(f"this API token lacks the {needed} scope needed to {action} {what}")
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


ROLE_RANK = {Role.VIEWER: 0, Role.OPERATOR: 1, Role.REVIEWER: 1, Role.ADMIN: 2}


def membership_refusal(*, granter, project_id: int, role: str | None) -> Forbidden | None:
    """Why ``granter`` may not give ``role`` in a project (``role`` None: take a role away); None when they may.
    Only an admin of that project grants, and never above their own role (superusers: anything)."""
    if granter.is_superuser:
        return None
    mine = role_of(granter, project_id)
    if mine != Role.ADMIN:
        return Forbidden("only an admin of this project may change who belongs to it")
    if role is not None and ROLE_RANK.get(role, 99) > ROLE_RANK[mine]:
        return Forbidden(f"you may not grant a role above your own ({mine})")
    return None


def membership_grant(*, user, project: Project, role: str, granter=None, request=None) -> Membership:
    """``granter``: who asks (the admin); without one, a trusted caller (setup, the shell)."""
    if role not in Role.values:
        raise InvalidInput(
            f"unknown role {role!r}", [{"field": "role", "message": "viewer, operator, reviewer, admin"}]
        )
    if granter is not None:
        refusal = membership_refusal(granter=granter, project_id=project.id, role=role)
        if refusal is not None:
            audit(actor=granter, action="membership_grant", outcome="denied", project_id=project.id,
                  target=str(user), request=request, detail={"role": role, "why": str(refusal)})  # fmt: skip
            raise refusal
    before = Membership.objects.filter(user=user, project=project).values_list("role", flat=True).first()
    membership, _ = Membership.objects.update_or_create(user=user, project=project, defaults={"role": role})
    if granter is not None:
        audit(actor=granter, action="membership_grant", project_id=project.id, target=str(user), request=request,
              detail={"role": role, "before": before})  # fmt: skip
    access_changed(user.id)
    return membership


def membership_revoke(*, user, project: Project, granter=None, request=None) -> int:
    if granter is not None:
        refusal = membership_refusal(granter=granter, project_id=project.id, role=None)
        if refusal is not None:
            audit(actor=granter, action="membership_revoke", outcome="denied", project_id=project.id,
                  target=str(user), request=request, detail={"why": str(refusal)})  # fmt: skip
            raise refusal
    deleted, _ = Membership.objects.filter(user=user, project=project).delete()
    if granter is not None and deleted:
        audit(actor=granter, action="membership_revoke", project_id=project.id, target=str(user), request=request)
    access_changed(user.id)
    return deleted
