from django.apps import AppConfig

from core import hooks


class ToolsConfig(AppConfig):
    name = "tools"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self):
        from . import actors  # noqa: F401  (registered in every process that sends or runs it)
        from .saga import ledger_sweep, operation_awaits_decision, proposals_bundle_if_any, proposals_drop

        # The engine calls these by name (core.hooks): it sits below the tools and imports none of them.
        hooks.provide(hooks.PROPOSALS_BUNDLE_IF_ANY, proposals_bundle_if_any)
        hooks.provide(hooks.PROPOSALS_DROP, proposals_drop)
        hooks.provide(hooks.OPERATION_AWAITS_DECISION, operation_awaits_decision)
        hooks.add_sweep(ledger_sweep)
