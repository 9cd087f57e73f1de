"""Reads of projects and the audit log. ``visible`` is the viewer's scope: the ids of the projects they may
see (tenancy.access.project_ids), None for every project."""

from django.db.models import QuerySet

from .models import AuditEvent, Project


def audit_events(*, visible: list[int] | None, run_id: int | None = None, action: str | None = None) -> QuerySet:
    """Audit events of the ``visible`` projects, newest first, of one run and one action when given. A
    queryset: the caller pages it."""
    rows = AuditEvent.objects.order_by("-id")
    if visible is not None:
        rows = rows.filter(project_id__in=visible)
    if run_id:
        rows = rows.filter(run_id=run_id)
    if action:
        rows = rows.filter(action=action)
    return rows


def project_slugs(ids) -> dict[int, str]:
    """Project id → slug, of ``ids``. One query."""
    return dict(Project.objects.filter(id__in=ids).values_list("id", "slug"))


def projects_visible(*, visible: list[int] | None) -> list[Project]:
    """The ``visible`` projects (None: every one), by slug. One query."""
    rows = Project.objects.order_by("slug")
    return list(rows if visible is None else rows.filter(id__in=visible))


def project_by_slug(slug: str) -> Project | None:
    """The project named ``slug``, or None: the caller checks the viewer may see it. One query."""
    return Project.objects.filter(slug=slug).first()
