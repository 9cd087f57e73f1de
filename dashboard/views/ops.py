"""Operating Warden: /healthz and /readyz for load balancers (public, ok or not per dependency, nothing
else), /metrics for Prometheus (its token or allowlist), and the workers page (operators), with the
breakers they may see."""

from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.http import HttpResponse, JsonResponse
from django.shortcuts import render
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_GET
from prometheus_client import CONTENT_TYPE_PLAIN_0_0_4

from core.errors import Forbidden
from runs.selectors.breakers import breakers_visible
from runs.selectors.workers import workers_visible

from ..ops import metrics_allowed, metrics_text, readiness


@require_GET
@never_cache
def healthz(request):
    """The process is up and answers: no dependency is asked."""
    return JsonResponse({"status": "ok"})


@require_GET
@never_cache
def readyz(request):
    checks = readiness()
    ready = all(v == "ok" for v in checks.values())
    return JsonResponse({"status": "ok" if ready else "not ready", "checks": checks}, status=200 if ready else 503)


@require_GET
@never_cache
def metrics(request):
    if not metrics_allowed(request):
        return HttpResponse("metrics: a token or an allowed address is needed\n", status=403, content_type="text/plain")
    return HttpResponse(metrics_text(), content_type=CONTENT_TYPE_PLAIN_0_0_4)  # read by every Prometheus


@login_required
@require_GET
def workers(request):
    try:
        rows = workers_visible(request.user, request=request)
    except Forbidden as exc:
        raise PermissionDenied(str(exc)) from None
    # The breakers beside them: what keeps the workers from calling a tool or a provider, of the
    # viewer's projects and the deployment's (closed from the inbox).
    breakers = [b for b in breakers_visible(request.user) if b.state != "closed"]
    return render(request, "runs/workers.html", {"workers": rows, "breakers": breakers})
