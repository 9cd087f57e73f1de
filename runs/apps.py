from django.apps import AppConfig

from core import bus, hooks


class RunsConfig(AppConfig):
    name = "runs"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self):
        # Every process that sends messages (server, workers, tests) needs the actors registered.
        from . import actors, checks  # noqa: F401  (checks: Warden's system checks register on import)
        from .fault_log import fault_fire_once
        from .saga import ledger_sweep, operation_awaits_decision, proposals_bundle_if_any, proposals_drop
        from .services.breakers import breaker_closed_heard
        from .webhooks import webhook_emit

        # The saga sits above the engine's services, which ask it by name (core.hooks) when a run finishes.
        hooks.provide(hooks.PROPOSALS_BUNDLE_IF_ANY, proposals_bundle_if_any)
        hooks.provide(hooks.PROPOSALS_DROP, proposals_drop)
        hooks.provide(hooks.OPERATION_AWAITS_DECISION, operation_awaits_decision)
        hooks.add_sweep(ledger_sweep)
        from .otlp import otlp_export_sweep

        hooks.add_sweep(otlp_export_sweep)  # a no-op unless OTEL_EXPORTER_OTLP_(TRACES_)ENDPOINT is set
        hooks.provide(hooks.WEBHOOK_EMIT, webhook_emit)  # the broker's operation.ambiguous
        hooks.provide(hooks.FAULT_FIRE_ONCE, fault_fire_once)  # drill faults (core/faults.py)
        bus.on_breaker_closed(breaker_closed_heard)  # a probe closed a breaker: its parked tasks go on
        from django.db.models.signals import post_save

        from agents.models import AgentVersion, WorkflowVersion

        from .evals import version_saved

        # A new version of an agent or a workflow runs the suites that name it (docs/evaluations.md).
        post_save.connect(version_saved, sender=AgentVersion, dispatch_uid="runs.evals.agent_version")
        post_save.connect(version_saved, sender=WorkflowVersion, dispatch_uid="runs.evals.workflow_version")
