from django.apps import AppConfig


class TenancyConfig(AppConfig):
    name = "tenancy"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self):
        from . import signals  # noqa: F401  (logins, logouts and the admin's data fixes go to the audit log)
