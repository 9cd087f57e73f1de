from django.conf import settings
from django.core.management.base import BaseCommand, CommandError
from django.template.defaultfilters import filesizeformat
from django.utils import timezone

from runs.retention import runs_prune


def _size(count: int) -> str:
    return filesizeformat(count).replace("\xa0", " ")


def _n(count: int, one: str, many: str) -> str:
    return f"{count} {one if count == 1 else many}"


def _counts(done: dict) -> str:
    return (
        f"{done['spans']} span bodies, {done['payloads']} payloads, {done['quarantined']} quarantined bodies, "
        f"{_size(done['bytes'])}"
    )


class Command(BaseCommand):
    help = (
        "Prune span bodies, payloads and quarantined bodies of runs finished more than N days ago; the ledger, "
        "decisions, audit, artifacts and figures stay (docs/operations.md, Retention)."
    )

    def add_arguments(self, parser):
        parser.add_argument(
            "--older-than-days",
            type=int,
            default=None,
            help=f"Default: WARDEN_RETENTION_DAYS ({settings.WARDEN['RETENTION_DAYS']}); 0 prunes nothing",
        )
        parser.add_argument("--dry-run", action="store_true", help="Count what would be pruned; change nothing")
        parser.add_argument("--batch", type=int, default=200, help="Runs per transaction (default 200)")

    def handle(self, *, older_than_days, dry_run, batch, **options):
        days = settings.WARDEN["RETENTION_DAYS"] if older_than_days is None else older_than_days
        if days < 0 or batch < 1:
            raise CommandError("--older-than-days must be 0 or more and --batch 1 or more")
        if days == 0:
            self.stdout.write("retention is off (0 days): nothing pruned; pass --older-than-days N")
            return
        now = timezone.now()
        cutoff = now - timezone.timedelta(days=days)
        verb = "would prune" if dry_run else "pruned"

        def progress(number: int, done: dict) -> None:
            self.stdout.write(f"batch {number}: {verb} {_n(done['runs'], 'run', 'runs')}: {_counts(done)}")

        totals = runs_prune(older_than_days=days, now=now, batch=batch, dry_run=dry_run, on_batch=progress)
        self.stdout.write(
            f"{'dry run: ' if dry_run else ''}{verb} {_n(totals['runs'], 'run', 'runs')} finished before "
            f"{cutoff:%Y-%m-%d %H:%M} UTC: {_counts(totals)}, in {_n(totals['batches'], 'batch', 'batches')}"
        )
