from django.core.management.base import BaseCommand

from agents.demo import load_demo_workflows


class Command(BaseCommand):
    help = "Create or update the demo agents and workflows (deploy-review, incident-fanout)."

    def handle(self, **options):
        load_demo_workflows()
        self.stdout.write("demo workflows loaded: deploy-review, incident-fanout")
