from django.apps import AppConfig


class ReplayConfig(AppConfig):
    """What-if replays: past runs run again on a candidate agent, with zero effects, and the differences
    (docs/replay.md). Above the engine, beside approvals (docs/architecture.md, "Layers")."""

    name = "replay"
    default_auto_field = "django.db.models.BigAutoField"
