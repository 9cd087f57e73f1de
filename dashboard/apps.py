from django.apps import AppConfig

from core import bus, links

from .links import DashboardPages


class DashboardConfig(AppConfig):
    name = "dashboard"

    def ready(self):
        # The dashboard listens to what the engine announces (core.bus); the engine never imports it.
        from . import live

        bus.on_run_changed(live.run_changed)
        bus.on_access_changed(live.access_changed)
        # Lower layers name pages by id (webhooks, notifications, "View on site"); the URLs are the dashboard's.
        links.provide(DashboardPages())
