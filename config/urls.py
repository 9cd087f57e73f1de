from django.contrib import admin
from django.urls import path
from django.views.generic import RedirectView

from .api import api

urlpatterns = [
    path("admin/", admin.site.urls),
    path("api/v1/", api.urls),
    # Until the dashboard lands, the admin's run list is the cockpit.
    path("", RedirectView.as_view(url="/admin/runs/run/", permanent=False)),
]
