"""What every dashboard view needs: the run it may see or act on, and domain errors as pages."""

from django.core.exceptions import PermissionDenied
from django.http import Http404

from approvals.access import authorize
from runs.errors import Forbidden, NotFound
from runs.models import Run


def run_for_view(request, run_id: int, action: str = "view") -> Run:
    """The run if ``request.user`` may ``action`` it: 404 outside their projects, 403 for a role that may not."""
    run = Run.objects.select_related("workflow", "project", "started_by").filter(id=run_id).first()
    try:
        if run is None:
            raise NotFound(f"run {run_id} does not exist")
        authorize(request.user, run.project_id, action, what=f"run {run_id}", request=request)
    except NotFound as exc:
        raise Http404(str(exc)) from None
    except Forbidden as exc:
        raise PermissionDenied(str(exc)) from None
    return run
