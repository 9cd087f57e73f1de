from django.apps import AppConfig

from core import bus, hooks


class IntegrationsConfig(AppConfig):
    """Webhooks, OTLP both ways, external agents and the API's idempotency: above the engine, which
    announces what happened (core.bus) and runs the sweeps registered here."""

    name = "integrations"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self):
        from . import actors  # noqa: F401  (every process that sends messages needs the actors registered)
        from .idempotency import idempotency_sweep
        from .otlp import otlp_export_sweep
        from .webhooks import operation_ambiguous_heard, run_settled_heard, webhooks_sweep

        # Durable: the deliveries and their outbox rows commit with the run's status (or the operation's),
        # so a crash between the commit and an after-commit write cannot lose a webhook.
        bus.subscribe(bus.RunSettled, run_settled_heard, durable=True)
        bus.subscribe(bus.OperationAmbiguous, operation_ambiguous_heard, durable=True)
        hooks.add_sweep(otlp_export_sweep)  # a no-op unless OTEL_EXPORTER_OTLP_(TRACES_)ENDPOINT is set
        hooks.add_sweep(idempotency_sweep)
        hooks.add_sweep(webhooks_sweep)
