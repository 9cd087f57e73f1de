"""Run an evaluation suite for CI: start it, wait for every case's verdict, print them beside the
baseline pass, and exit 1 when a case regresses (docs/evaluations.md, "In CI")."""

import time

import dramatiq
from django.conf import settings
from django.core.management.base import BaseCommand, CommandError
from django.utils import timezone

from agents.models import ModelVersion
from runs.evals import baseline_for, eval_grade, eval_start, regressions
from runs.models import EvalResult, EvalRun, EvalSuite


class Command(BaseCommand):
    help = "Run an evaluation suite and compare it with a baseline pass; exit 1 when a case regresses."

    def add_arguments(self, parser):
        parser.add_argument("suite", help="The suite's slug")
        parser.add_argument("--model-version", default="", help="A model version's slug (default: the current agents)")
        parser.add_argument(
            "--baseline",
            default="previous",
            help="What a regression is measured against: 'previous' (the suite's last pass, the default), "
            "an evaluation run's id, or 'none' (every failing case counts)",
        )
        parser.add_argument("--timeout", type=float, default=900, help="Seconds to wait for the verdicts")

    def handle(self, *, suite, model_version, baseline, timeout, **options):
        found = EvalSuite.objects.select_related("project").filter(slug=suite).first()
        if found is None:
            raise CommandError(f"no evaluation suite {suite!r}", returncode=2)
        version = None
        if model_version:
            version = ModelVersion.objects.filter(slug=model_version).first()
            if version is None:
                raise CommandError(f"no model version {model_version!r}", returncode=2)
        if baseline not in ("previous", "none") and not EvalRun.objects.filter(suite=found, id=_id(baseline)).exists():
            raise CommandError(f"no evaluation run {baseline!r} of suite {suite}", returncode=2)
        eval_run = eval_start(suite=found, version=version, via="command", trigger="run_evals")
        if baseline == "previous":
            base = baseline_for(eval_run)
        else:
            base = None if baseline == "none" else EvalRun.objects.get(id=_id(baseline))
        self.stdout.write(f"evaluation run {eval_run.id} of {found.slug}, against {_name(base)}")
        self._wait(eval_run, timeout)
        return self._report(eval_run, base)

    def _wait(self, eval_run: EvalRun, timeout: float) -> None:
        # Embedded mode: the server's workers use its in-memory broker, out of this process's reach.
        worker = None
        if not settings.WARDEN_SCALED:
            worker = dramatiq.Worker(dramatiq.get_broker(), worker_threads=2, worker_timeout=100)
            worker.start()
        try:
            deadline = time.monotonic() + timeout
            while eval_run.results.filter(passed__isnull=True).exists():
                if time.monotonic() > deadline:
                    raise CommandError(f"timed out after {timeout:.0f}s waiting for the verdicts", returncode=2)
                for result_id in _ungraded(eval_run):  # a grading message lost in a crash: grade here
                    eval_grade(result_id)
                time.sleep(0.2)
        finally:
            if worker is not None:
                worker.stop()

    def _report(self, eval_run: EvalRun, base: EvalRun | None) -> None:
        before = dict(base.results.values_list("case_id", "passed")) if base else {}
        for result in eval_run.results.select_related("case", "run"):
            was = {True: "passed", False: "failed", None: "—"}[before.get(result.case_id)]
            now = "passed" if result.passed else "FAILED"
            scores = ", ".join(f"{g['score']}" for g in result.grades if g.get("score") is not None)
            line = f"  {now:7} {result.case.name} (run {result.run_id}; before: {was})"
            self.stdout.write(line + (f" judge {scores}" if scores else ""))
            for failure in result.failures:
                self.stdout.write(f"          {failure}")
        broken = regressions(eval_run, base)
        if broken:
            names = ", ".join(item["name"] for item in broken)
            raise CommandError(f"{len(broken)} case(s) regressed: {names}", returncode=1)
        self.stdout.write(self.style.SUCCESS("no regression"))


def _id(value: str) -> int:
    return int(value) if value.isdigit() else 0


def _name(base: EvalRun | None) -> str:
    return "nothing (every failure counts)" if base is None else f"evaluation run {base.id} ({base.label})"


def _ungraded(eval_run: EvalRun) -> list[int]:
    """Results whose run has finished but whose judges have not graded it for a while."""
    stale = EvalResult.objects.filter(eval_run=eval_run, passed__isnull=True, run__finished_at__isnull=False)
    return [result.id for result in stale.select_related("run") if _stale(result)]


def _stale(result) -> bool:
    return (timezone.now() - result.run.finished_at).total_seconds() > 30
