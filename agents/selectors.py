"""Reads of agents and workflows on behalf of a person: who may see what is decided by tenancy.access."""

from django.db.models import Q, QuerySet

from tenancy.access import project_ids

from .models import Agent, Workflow


def workflows_visible(*, user) -> QuerySet:
    """The workflows ``user`` may see: the shared ones (no project) and those of their projects.
    ``user`` None is a trusted caller (the shell, the demo loaders): every workflow."""
    rows = Workflow.objects.select_related("project")
    if user is None:
        return rows
    allowed = project_ids(user, "view")
    return rows if allowed is None else rows.filter(Q(project__isnull=True) | Q(project_id__in=allowed))


def workflow_visible(*, slug: str, user) -> Workflow | None:
    """The workflow named ``slug`` if ``user`` may see it. One of a project they are not in is None, exactly
    as a slug that names nothing, so that a caller's answer cannot tell the two apart."""
    return workflows_visible(user=user).filter(slug=slug).first()


def agents_listed() -> QuerySet:
    """The agent registry, by slug (every agent: the registry is the deployment's)."""
    return Agent.objects.order_by("slug")
