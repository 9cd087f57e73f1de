from django.apps import AppConfig

from core import hooks


class SagaConfig(AppConfig):
    """The supervisor's executor and compensation, above the engine (docs/architecture.md, "Layers")."""

    name = "saga"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self):
        from . import actors  # noqa: F401  (registered in every process)
        from .executor import compensation_step_reported
        from .sweeps import ledger_sweep

        hooks.add_sweep(ledger_sweep)
        # An external agent's report of an undo it carried out is recorded in the reporting transaction.
        hooks.provide(hooks.COMPENSATION_STEP_REPORTED, compensation_step_reported)
