"""Print this installation's id, the one every idempotency key starts with (docs/tools.md)."""

from django.core.management.base import BaseCommand

from tools.installation import installation


class Command(BaseCommand):
    help = (
        "Print the installation id in idempotency keys: set WARDEN_INSTALLATION_ID to it to keep it on a new database"
    )

    def handle(self, *args, **options):
        self.stdout.write(installation()[0])
