from django.apps import AppConfig


class RunsConfig(AppConfig):
    name = "runs"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self):
        # Every process that sends messages (server, workers, tests) needs the actors registered.
        from . import actors  # noqa: F401
