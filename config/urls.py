from django.contrib import admin
from django.contrib.auth import views as auth_views
from django.templatetags.static import static
from django.urls import include, path, re_path
from django.views.generic import RedirectView

from api.otlp import otlp_traces
from dashboard.views import inbox as inbox_views
from dashboard.views import ops as ops_views
from dashboard.views import questions as questions_views
from dashboard.views import queue as approvals_views

from .api import api


class AdminModelMoved(RedirectView):
    """Admin pages of models that moved to another app keep answering: the admin's URLs are a public
    contract, so old links and bookmarks land on the new page, query string kept (the old paths are
    deprecated: README, "Changes that need your attention")."""

    app = ""
    permanent = True  # the move is final

    def get_redirect_url(self, *args, **kwargs):
        query = self.request.META.get("QUERY_STRING", "")
        return f"/admin/{self.app}/{kwargs['model']}/{kwargs['rest']}" + (f"?{query}" if query else "")


# old admin path → the app that owns the model now
MOVED = [
    (r"runs/(?P<model>webhookendpoint|webhookdelivery|otlptrace|otlpexportcursor|idempotencykey)", "integrations"),
    (r"runs/(?P<model>evalsuite|evalcase|evalrun|evalresult|annotation)", "evals"),
    (r"approvals/(?P<model>approvalpolicy|allowrule|approvalrequest|decision)", "policy"),
]


class Favicon(RedirectView):
    """Browsers ask for /favicon.ico on every page that names no icon (the admin's, a JSON answer)."""

    permanent = False  # the icon's hashed name may change with a release

    def get_redirect_url(self, *args, **kwargs):
        return static("warden/favicon.svg")  # at request time: the storage's hashed name when there is one


urlpatterns = [
    *(re_path(rf"^admin/{old}/(?P<rest>.*)$", AdminModelMoved.as_view(app=app)) for old, app in MOVED),
    re_path(
        r"^admin/approvals/(?P<model>project|membership|apitoken|auditevent)/(?P<rest>.*)$",
        AdminModelMoved.as_view(app="tenancy", permanent=False),
    ),
    path("admin/", admin.site.urls),
    path("favicon.ico", Favicon.as_view()),
    # Operating Warden (docs/operations.md): probes for load balancers, Prometheus, the workers page
    path("healthz", ops_views.healthz, name="healthz"),
    path("readyz", ops_views.readyz, name="readyz"),
    path("metrics", ops_views.metrics, name="metrics"),
    path("workers/", ops_views.workers, name="workers"),
    # OTLP/HTTP trace export (api/otlp.py): the standard path, and under the API for an exporter whose
    # OTEL_EXPORTER_OTLP_ENDPOINT is https://warden.example/api/v1/otlp
    path("v1/traces", otlp_traces, name="otlp-traces"),
    path("api/v1/otlp/v1/traces", otlp_traces),
    path("api/v1/", api.urls),
    path("login/", auth_views.LoginView.as_view(), name="login"),
    path("logout/", auth_views.LogoutView.as_view(), name="logout"),
    path("approvals/", approvals_views.queue, name="approvals-queue"),
    path("approvals/new", approvals_views.queue_new, name="approvals-new"),
    path("approvals/<int:request_id>/decide", approvals_views.decide, name="approvals-decide"),
    path("approvals/changes/<int:change_id>/decide", approvals_views.change_decide, name="approvals-change-decide"),
    path("approvals/link/<str:token>", approvals_views.decision_link_page, name="approvals-link"),
    path("inbox/", inbox_views.inbox, name="inbox"),
    path("inbox/counts", inbox_views.counts, name="inbox-counts"),
    path("inbox/breakers/<str:what>/<str:name>/close", inbox_views.breaker_close_view, name="inbox-breaker-close"),
    path(  # a project's own tool's breaker (an HTTP or MCP tool it declared)
        "inbox/breakers/<str:what>/<slug:project>/<str:name>/close",
        inbox_views.breaker_close_view,
        name="inbox-breaker-close-project",
    ),
    path("questions/<int:question_id>/answer", questions_views.answer, name="questions-answer"),
    path("", include("dashboard.urls")),
    path("", RedirectView.as_view(pattern_name="runs:list", permanent=False), name="home"),
]
