"""The one rule of who may decide: separation of duties (whoever started the run, or asked for the work,
decides none of it), the role (a project's reviewers and admins decide; some calls its admins only). The
reviewer deciding a request (approvals' deciding), the decisions counted just before a call leaves
(``approval_refusal`` in policy/verdicts.py) and an allow rule standing in for its creator all ask it."""

from tenancy.access import role_of

DECIDERS = ("reviewer", "admin")
_UNREAD = object()


class Refusal:
    """Why someone may not decide, for each caller to phrase for its reader ('' when they may)."""

    STARTED_THE_RUN = "started_the_run"
    ASKED_FOR_IT = "asked_for_it"
    NOT_A_DECIDER = "not_a_decider"
    ADMINS_ONLY = "admins_only"


def decider_refusal(
    user, *, project_id: int, started_by_id: int | None, requested_by_id: int | None = None,
    admins_only: bool = False, role_known: bool = False, role=_UNREAD,
) -> str:  # fmt: skip
    """A ``Refusal`` ('' when ``user`` may decide). ``role_known``: the caller has already checked that
    ``user`` may decide in the project (``authorize``), so the role is read only when admins alone may;
    ``role``: the user's role there, when the caller has read it already."""
    if started_by_id is not None and user.pk == started_by_id:
        return Refusal.STARTED_THE_RUN
    if requested_by_id is not None and user.pk == requested_by_id:
        return Refusal.ASKED_FOR_IT
    if role_known and not admins_only:
        return ""
    role = role_of(user, project_id) if role is _UNREAD else role
    if admins_only and role != "admin":
        return Refusal.ADMINS_ONLY
    return "" if role in DECIDERS else Refusal.NOT_A_DECIDER


def request_admins_only(request) -> bool:
    """Does a request reserve its decision for project admins (its verdict, or the policy that set its expiry)?"""
    return request.admins_only or (request.policy_id is not None and request.policy.decided_by_role == "admin")
