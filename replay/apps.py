from django.apps import AppConfig

from core import bus


class ReplayConfig(AppConfig):
    """What-if replays and shadows: past runs run again, or live runs followed, on a candidate agent, with
    zero effects, and the differences (docs/replay.md). Above the engine, beside approvals
    (docs/architecture.md, "Layers")."""

    name = "replay"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from . import actors  # noqa: F401  (registered in every process)
        from .services import replay_run_settled_heard
        from .shadows import run_started_heard

        bus.subscribe(bus.RunStarted, run_started_heard, durable=True)
        # A suite's replay run ended: its judges are asked after commit (the outbox row commits with it).
        bus.subscribe(bus.RunSettled, replay_run_settled_heard, durable=True)
