from django.apps import AppConfig


class AgentsConfig(AppConfig):
    name = "agents"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self):
        from django.db.models.signals import post_save

        from .models import Agent, Workflow
        from .versions import version_on_save

        # Saving a changed agent or workflow makes its next version (agents/versions.py).
        post_save.connect(version_on_save, sender=Agent, dispatch_uid="agents.agent_version")
        post_save.connect(version_on_save, sender=Workflow, dispatch_uid="agents.workflow_version")
