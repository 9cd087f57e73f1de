"""Write the installed genai-prices package's model prices into the price table (docs/agents.md, "Prices").
Offline: the package ships its data. A price an admin set is left as it is."""

from django.core.management.base import BaseCommand
from django.db import transaction

from agents.prices import PACKAGE, package_version, prices_refresh


class Command(BaseCommand):
    help = "Refresh model prices from the installed genai-prices package; prices set by an admin are kept"

    def handle(self, *args, **options):
        with transaction.atomic():
            counts = prices_refresh()
        self.stdout.write(
            f"{PACKAGE} {package_version()}: {counts['added']} added, {counts['updated']} updated, "
            f"{counts['kept']} kept (unchanged or set by an admin)"
        )
