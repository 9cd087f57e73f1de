"""What every dashboard view needs: the run it may see or act on, and domain errors as pages."""

from django.core.exceptions import PermissionDenied
from django.http import Http404

from core.errors import Forbidden, NotFound
from runs.models import Run
from runs.selectors.run_page import run_for_page
from tenancy.access import authorize


def authorized(request, obj, action: str, *, what: str):
    """``obj`` (it has a ``project_id``) if ``request.user`` may ``action`` it: 404 when it does not exist or
    lies outside their projects, 403 for a role that may not."""
    try:
        if obj is None:
            raise NotFound(f"{what} does not exist")
        authorize(request.user, obj.project_id, action, what=what, request=request)
    except NotFound as exc:
        raise Http404(str(exc)) from None
    except Forbidden as exc:
        raise PermissionDenied(str(exc)) from None
    return obj


def run_for_view(request, run_id: int, action: str = "view") -> Run:
    return authorized(request, run_for_page(run_id), action, what=f"run {run_id}")
