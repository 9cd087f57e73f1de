from django.apps import AppConfig, apps
from django.conf import settings
from django.utils.module_loading import module_has_submodule

DISCOVERED = "warden_tools"  # a Django app's tool module, found without being named in a setting


def discovered_modules() -> list[str]:
    """The ``warden_tools`` module of every installed app that has one (Django's autodiscovery idiom)."""
    return [
        f"{config.name}.{DISCOVERED}"
        for config in apps.get_app_configs()
        if module_has_submodule(config.module, DISCOVERED)
    ]


class ToolsConfig(AppConfig):
    name = "tools"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self):
        from django.core.exceptions import ImproperlyConfigured

        from . import checks  # noqa: F401  (the secret grants' system check registers on import)
        from .registry import tools_load
        from .secrets import grants_problems

        # Before any tool is loaded: a grant of Warden's own settings is refused, in every process.
        if problems := grants_problems():
            raise ImproperlyConfigured("; ".join(problems))

        builtin = ["tools.human"]  # Warden's own, in every installation
        sandbox = ["tools.sandbox_tools"] if settings.WARDEN["SANDBOX_TOOLS"] else []
        named = list(settings.WARDEN["TOOL_MODULES"])
        tools_load(builtin + sandbox + named + [m for m in discovered_modules() if m not in named])
