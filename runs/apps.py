import dramatiq
from django.apps import AppConfig

from core import bus, hooks


class RunsConfig(AppConfig):
    name = "runs"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self):
        # Every process that sends messages (server, workers, tests) needs the actors registered.
        from . import actors, checks  # noqa: F401  (checks: Warden's system checks register on import)
        from .fault_log import fault_fire_once
        from .selectors import run_gate_facts
        from .services.breakers import breaker_closed_heard
        from .services.recovery import RecoverySweeperMiddleware

        # Every worker process runs the sweeper (the settings' broker is built before the models load).
        dramatiq.get_broker().add_middleware(RecoverySweeperMiddleware())
        hooks.provide(hooks.RUN_GATE_FACTS, run_gate_facts)  # what the broker's gate judges a call by
        hooks.provide(hooks.FAULT_FIRE_ONCE, fault_fire_once)  # drill faults (core/faults.py)
        bus.on_breaker_closed(breaker_closed_heard)  # a probe closed a breaker: its parked tasks go on
