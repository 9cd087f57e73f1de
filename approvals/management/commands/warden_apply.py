"""manage.py warden_apply FILE|DIR --as USERNAME [--dry-run] [--json] (docs/declarations.md)."""

import json as jsonlib
from pathlib import Path

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError

from approvals.declarations.apply import declarations_apply
from approvals.declarations.export import documents_parse
from core.errors import WardenError

SUFFIXES = (".yaml", ".yml", ".json")


def documents_read(path: Path) -> list:
    """A file's documents, or those of every .yaml, .yml and .json file of a directory, by name."""
    if path.is_dir():
        files = sorted(p for p in path.rglob("*") if p.is_file() and p.suffix in SUFFIXES)
        if not files:
            raise CommandError(f"{path} holds no .yaml, .yml or .json file")
    elif path.is_file():
        files = [path]
    else:
        raise CommandError(f"{path} is neither a file nor a directory")
    documents = []
    for file in files:
        documents += documents_parse(file.read_text(encoding="utf-8"), name=str(file))
    return documents


def outcome_line(outcome: dict) -> str:
    where = f"{outcome['project']}: " if outcome["project"] else ""
    line = f"{outcome['status']:>9}  {where}{outcome['kind']} {outcome['name']}"
    if outcome["change_request"]:
        line += f" (waits for a second admin: change request {outcome['change_request']})"
    elif outcome["status"] == "pending":
        line += " (would wait for a second admin)"
    for field, change in outcome["changes"].items():
        before = "" if outcome["status"] == "created" else f"{jsonlib.dumps(change['before'], default=str)} -> "
        line += f"\n           {field}: {before}{jsonlib.dumps(change['after'], default=str)}"
    return line


class Command(BaseCommand):
    help = "Apply declaration files (YAML or JSON) as a person, with the admin's checks and its four-eyes rules."

    def add_arguments(self, parser):
        parser.add_argument("path", help="a declaration file, or a directory of them")
        parser.add_argument("--as", dest="username", required=True, help="whose rights apply (no anonymous path)")
        parser.add_argument("--dry-run", action="store_true", help="print what would change; write nothing")
        parser.add_argument("--json", action="store_true", help="print the outcomes as JSON")

    def handle(self, path, username, dry_run=False, json=False, **options):
        user = get_user_model().objects.filter(username=username, is_active=True).first()
        if user is None:
            raise CommandError(f"no active user named {username!r}")
        documents = documents_read(Path(path))
        try:
            outcomes = declarations_apply(user=user, documents=documents, dry_run=dry_run)
        except WardenError as exc:
            errors = getattr(exc, "errors", [])
            if json:
                self.stdout.write(_json({"code": exc.code, "message": str(exc), "errors": errors}))
            lines = [str(exc)] + [f"  {e['field']}: {e['message']}" for e in errors]
            raise CommandError("\n".join(lines)) from None
        self._report(outcomes, dry_run, json)

    def _report(self, outcomes, dry_run: bool, as_json: bool) -> None:
        pending = sum(o["status"] == "pending" for o in outcomes)
        if as_json:
            self.stdout.write(_json({"dry_run": dry_run, "pending": pending, "items": outcomes}))
            return
        for outcome in outcomes:
            self.stdout.write(outcome_line(outcome))
        counts = {s: sum(o["status"] == s for o in outcomes) for s in ("created", "changed", "unchanged", "pending")}
        summary = ", ".join(f"{n} {s}" for s, n in counts.items())
        self.stdout.write(f"{'dry run, nothing written: ' if dry_run else ''}{summary}")
        if pending and not dry_run:
            self.stdout.write(f"{pending} change(s) loosen the rules and wait for a second admin of the project "
                              "(reviewer queue, or GET /api/v1/change-requests)")  # fmt: skip


def _json(value) -> str:
    return jsonlib.dumps(value, indent=2, default=str)
