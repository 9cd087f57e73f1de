from django.apps import AppConfig


class ToolsConfig(AppConfig):
    name = "tools"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self):
        from . import actors  # noqa: F401  (registered in every process that sends or runs it)
