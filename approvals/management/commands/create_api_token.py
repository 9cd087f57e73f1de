from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError

from approvals.tokens import api_token_create


class Command(BaseCommand):
    help = "Create an API token for USERNAME and print it (it is stored hashed and shown only now)."

    def add_arguments(self, parser):
        parser.add_argument("username")
        parser.add_argument("--name", default="")
        parser.add_argument(
            "--scope",
            action="append",
            choices=["read", "run", "operate", "approve"],
            help="repeat for several; default: read, run, operate (approve only when asked for)",
        )

    def handle(self, username, name, scope=None, **options):
        try:
            user = get_user_model().objects.get(username=username)
        except get_user_model().DoesNotExist:
            raise CommandError(f"no user named {username!r}") from None
        _, raw = api_token_create(user=user, name=name, scopes=scope)
        self.stdout.write(raw)
