from django.core.management.base import BaseCommand

from agents.demo import load_demo_workflows
from approvals.policies import demo_waivers_load


class Command(BaseCommand):
    help = (
        "Create or update the demo agents and workflows (deploy-review, incident-fanout), and the demo "
        "project's waivers for the sandbox's irreversible tools."
    )

    def handle(self, **options):
        load_demo_workflows()
        waivers = demo_waivers_load()
        self.stdout.write("demo workflows loaded: deploy-review, incident-fanout")
        for waiver in waivers:
            self.stdout.write(f"  waiver in project {waiver.project.slug}: {waiver.name}")
