"""Closing a circuit breaker by hand from the inbox (the system behind it is back): audited, and the tasks
it parked resume. The breakers a person sees are read by runs.selectors.breakers."""

from core.errors import Forbidden, NotFound
from runs.selectors.breakers import breaker_seen
from runs.services.breakers import BREAKERS, breaker_resume_parked
from tenancy.access import ACTIONS, role_of
from tenancy.audit import audit
from tenancy.models import Project


def breaker_close(*, user, what: str, name: str, project: str = "", request=None) -> list[int]:
    """Close a breaker by hand (the system behind it is back) and resume the tasks it parked, audited.
    A project's own tool's breaker (``project``: its slug) is closed by an admin of that project and
    resumes that project's tasks; the deployment's (a registry tool's, a provider's) by a superuser, and
    resumes every task it parked. One who may not see it is told it does not exist. Returns the tasks
    retried."""
    try:
        row = breaker_seen(user, what=what, name=name, project=project)
    except NotFound as exc:  # recorded for the project's people (the refused never see the audit log there)
        pid = Project.objects.filter(slug=project).values_list("id", flat=True).first() if project else None
        audit(actor=user, action="breaker_close", outcome="denied", target=":".join([what, project, name] if project
              else [what, name]), project_id=pid, request=request, detail={"why": str(exc)})  # fmt: skip
        raise
    ref = row.ref
    if ref.project_id is None and not user.is_superuser:
        why = "the deployment's breakers are closed by a superuser (every project shares them)"
    elif ref.project_id is not None and role_of(user, ref.project_id) not in ACTIONS["administer"][0]:
        why = f"only an admin of project {row.project} may close its breakers"
    else:
        why = ""
    if why:
        audit(actor=user, action="breaker_close", outcome="denied", target=row.id, project_id=ref.project_id,
              request=request, detail={"why": why})  # fmt: skip
        raise Forbidden(why)
    BREAKERS[what].reset([name], project_id=ref.project_id)
    audit(actor=user, action="breaker_close", target=row.id, project_id=ref.project_id, request=request,
          detail={"state": row.state, "parked": row.parked})  # fmt: skip
    reason = f"the {row.label}'s breaker was closed"
    return breaker_resume_parked(breaker=ref, reason=reason, actor=user, request=request)
