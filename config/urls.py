from django.contrib import admin
from django.contrib.auth import views as auth_views
from django.urls import include, path
from django.views.generic import RedirectView

from dashboard.views import queue as approvals_views

from .api import api

urlpatterns = [
    path("admin/", admin.site.urls),
    path("api/v1/", api.urls),
    path("login/", auth_views.LoginView.as_view(), name="login"),
    path("logout/", auth_views.LogoutView.as_view(), name="logout"),
    path("approvals/", approvals_views.queue, name="approvals-queue"),
    path("approvals/new", approvals_views.queue_new, name="approvals-new"),
    path("approvals/<int:request_id>/decide", approvals_views.decide, name="approvals-decide"),
    path("", include("dashboard.urls")),
    path("", RedirectView.as_view(pattern_name="runs:list", permanent=False), name="home"),
]
