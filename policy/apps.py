from django.apps import AppConfig


class PolicyConfig(AppConfig):
    name = "policy"
    default_auto_field = "django.db.models.BigAutoField"
