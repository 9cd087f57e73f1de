"""manage.py warden_export [--project SLUG] [-o FILE] [--json] [--as USERNAME] (docs/declarations.md)."""

from pathlib import Path

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError

from approvals.declarations.export import declarations_export, documents_dump
from core.errors import WardenError


class Command(BaseCommand):
    help = "Write what is declared (a project's, or everything) as declaration documents; secrets by name only."

    def add_arguments(self, parser):
        parser.add_argument("--project", help="one project's (default: every project's and the shared configuration)")
        parser.add_argument("-o", "--output", help="write to this file (default: standard output)")
        parser.add_argument("--json", action="store_true", help="JSON instead of YAML")
        parser.add_argument("--as", dest="username", help="only what this person may see")

    def handle(self, project=None, output=None, json=False, username=None, **options):
        user = None
        if username is not None:
            user = get_user_model().objects.filter(username=username, is_active=True).first()
            if user is None:
                raise CommandError(f"no active user named {username!r}")
        try:
            documents = declarations_export(user=user, project=project)
        except WardenError as exc:
            raise CommandError(str(exc)) from None
        text = documents_dump(documents, as_json=json)
        if output:
            Path(output).write_text(text, encoding="utf-8")
            self.stderr.write(f"wrote {len(documents)} document(s) to {output}")
        else:
            self.stdout.write(text, ending="")
