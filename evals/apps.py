from django.apps import AppConfig

from core import bus


class EvalsConfig(AppConfig):
    """Reference evaluations, above the engine (docs/architecture.md, "Layers"; docs/evaluations.md)."""

    name = "evals"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self):
        from . import actors  # noqa: F401  (registered in every process)
        from .suites import policy_changed_heard, run_settled_heard, version_created_heard

        # A case's run ended or stopped for a human: judged in the same transaction (a grading message, if
        # its checks need a model, leaves through the outbox).
        bus.subscribe(bus.RunSettled, run_settled_heard, durable=True)
        # A new version of an agent, a workflow or a policy runs the suites that name it, after its commit.
        bus.subscribe(bus.VersionCreated, version_created_heard)
        bus.subscribe(bus.PolicyChanged, policy_changed_heard)
