"""The "needs you" inbox (approvals/selectors/inbox.py): one page of everything waiting for this person,
the counts in the nav, and closing a breaker. Reading changes nothing; closing is a CSRF-checked POST."""

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import HttpResponseRedirect
from django.shortcuts import render
from django.urls import reverse
from django.views.decorators.http import require_GET, require_POST

from approvals.selectors.inbox import KINDS, inbox_counts, inbox_items
from core.errors import Forbidden, NotFound
from tenancy.access import project_ids
from tenancy.models import Project
from tenancy.selectors import projects_visible

from ..inbox import breaker_close


def _visible_projects(user) -> list[Project]:
    return projects_visible(visible=project_ids(user, "view"))


@login_required
@require_GET
def inbox(request):
    return _page(request)


def _page(request, *, status: int = 200):
    projects = _visible_projects(request.user)
    slug, kind = request.GET.get("project", ""), request.GET.get("kind", "")
    project = next((p for p in projects if p.slug == slug), None)
    if kind not in KINDS:
        kind = ""
    items = inbox_items(request.user, project=project, kind=kind)
    counts = inbox_counts(request.user)
    context = {
        "items": items,
        "counts": [(k, label, counts[k]) for k, label in KINDS.items()],
        "total": sum(counts.values()),
        "projects": projects,
        "project": project,
        "kind": kind,
        "unknown_project": bool(slug) and project is None,
    }
    template = "inbox/_items.html" if request.headers.get("HX-Request") else "inbox/page.html"
    return render(request, template, context, status=status)


@login_required
@require_GET
def counts(request):
    """The nav's badge, fetched when the page loads and again when the socket says something changed."""
    total = sum(inbox_counts(request.user).values())
    return render(request, "inbox/_count.html", {"total": total})


@login_required
@require_POST
def breaker_close_view(request, what: str, name: str, project: str = ""):
    """A deployment's breaker (/inbox/breakers/<what>/<name>/close) or a project's own tool's
    (/inbox/breakers/tool/<project>/<name>/close). A refusal answers 404 (not one the person may see) or
    403 (seen, not theirs to close), on the inbox page with the reason."""
    try:
        resumed = breaker_close(user=request.user, what=what, name=name, project=project, request=request)
    except (NotFound, Forbidden) as exc:
        messages.error(request, str(exc))
        return _page(request, status=404 if isinstance(exc, NotFound) else 403)
    whose = f" of project {project}" if project else ""
    messages.success(request, f"The {what} {name}{whose}'s breaker is closed: calls to it go out again"
                              f" ({len(resumed)} parked task{'' if len(resumed) == 1 else 's'} resumed).")  # fmt: skip
    return HttpResponseRedirect(reverse("inbox"))
