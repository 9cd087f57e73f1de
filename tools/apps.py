from django.apps import AppConfig
from django.conf import settings


class ToolsConfig(AppConfig):
    name = "tools"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self):
        from .registry import tools_load

        sandbox = ["tools.sandbox_tools"] if settings.WARDEN["SANDBOX_TOOLS"] else []
        tools_load(sandbox + list(settings.WARDEN["TOOL_MODULES"]))
