from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError

from tenancy.tokens import api_token_create


class Command(BaseCommand):
    help = "Create an API token for USERNAME and print it (it is stored hashed and shown only now)."

    def add_arguments(self, parser):
        parser.add_argument("username")
        parser.add_argument("--name", default="")
        parser.add_argument(
            "--scope",
            action="append",
            choices=["read", "run", "operate", "approve", "admin"],
            help="repeat for several; default: read, run, operate (approve and admin only when asked for)",
        )
        parser.add_argument(
            "--agent", action="store_true", help="a token for an agent: it can never approve nor administer"
        )

    def handle(self, username, name, scope=None, agent=False, **options):
        try:
            user = get_user_model().objects.get(username=username)
        except get_user_model().DoesNotExist:
            raise CommandError(f"no user named {username!r}") from None
        try:
            _, raw = api_token_create(user=user, name=name, scopes=scope, for_agent=agent)
        except ValueError as exc:
            raise CommandError(str(exc)) from None
        self.stdout.write(raw)
