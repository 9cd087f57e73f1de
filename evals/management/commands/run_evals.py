"""Run an evaluation suite for CI: start it, wait for every case's verdict, print them beside the
baseline pass, and exit 1 when a case fails that the suite does not name as a known failure
(docs/evaluations.md, "In CI")."""

import time

from django.core.management.base import BaseCommand, CommandError
from django.utils import timezone

from agents.models import ModelVersion
from evals.judge import eval_grade
from evals.models import EvalResult, EvalRun, EvalSuite
from evals.suites import accepted_baseline_for, eval_run_accept, eval_start, failing
from runs.workers import workers_while_waiting

# "previous" once meant the suite's previous pass, whatever its outcome, and a case failing in both passes
# did not count: running a red job again turned it green. It now means the last accepted pass.
DEPRECATED = {"previous": "accepted"}


class Command(BaseCommand):
    help = (
        "Run an evaluation suite and compare it with a baseline pass; exit 1 when a case fails that is not in "
        "the suite's quarantine."
    )

    def add_arguments(self, parser):
        parser.add_argument("suite", help="The suite's slug")
        parser.add_argument("--model-version", default="", help="A model version's slug (default: the current agents)")
        parser.add_argument(
            "--baseline",
            default="accepted",
            help="The pass to show each verdict beside: 'accepted' (the suite's last pass run_evals exited 0 on, "
            "the default), an evaluation run's id, or 'none'; 'previous' is a deprecated alias of 'accepted'. "
            "Whatever the baseline, every failing case outside the suite's quarantine fails the command.",
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
        if baseline in DEPRECATED:
            self.stderr.write(f"--baseline {baseline} is deprecated: it means --baseline {DEPRECATED[baseline]}")
            baseline = DEPRECATED[baseline]
        if baseline not in ("accepted", "none") and not EvalRun.objects.filter(suite=found, id=_id(baseline)).exists():
            raise CommandError(f"no evaluation run {baseline!r} of suite {suite}", returncode=2)
        eval_run = eval_start(suite=found, version=version, via="command", trigger="run_evals")
        if baseline == "accepted":
            base = accepted_baseline_for(eval_run)
        else:
            base = None if baseline == "none" else EvalRun.objects.get(id=_id(baseline))
        self.stdout.write(f"evaluation run {eval_run.id} of {found.slug}, against {_name(base, baseline)}")
        self._wait(eval_run, timeout)
        return self._report(eval_run, base)

    def _wait(self, eval_run: EvalRun, timeout: float) -> None:
        with workers_while_waiting():
            deadline = time.monotonic() + timeout
            while eval_run.results.filter(passed__isnull=True).exists():
                if time.monotonic() > deadline:
                    raise CommandError(f"timed out after {timeout:.0f}s waiting for the verdicts", returncode=2)
                for result_id in _ungraded(eval_run):  # a grading message lost in a crash: grade here
                    eval_grade(result_id)
                time.sleep(0.2)

    def _report(self, eval_run: EvalRun, base: EvalRun | None) -> None:
        before = dict(base.results.values_list("case_id", "passed")) if base else {}
        quarantined = set(eval_run.suite.quarantine.values_list("id", flat=True))
        for result in eval_run.results.select_related("case", "run"):
            was = {True: "passed", False: "failed", None: "—"}[before.get(result.case_id)]
            now = "passed" if result.passed else "failed" if result.case_id in quarantined else "FAILED"
            scores = ", ".join(f"{g['score']}" for g in result.grades if g.get("score") is not None)
            line = f"  {now:7} {result.case.name} (run {result.run_id}; before: {was})"
            if result.case_id in quarantined:
                line += " quarantined: " + ("forgiven" if not result.passed else "passes now, take it out")
            self.stdout.write(line + (f" judge {scores}" if scores else ""))
            for failure in result.failures:
                self.stdout.write(f"          {failure}")
        broken = failing(eval_run, base)
        if broken:
            names = ", ".join(f"{item['name']} ({_how(item['before'])})" for item in broken)
            raise CommandError(f"{len(broken)} case(s) failed: {names}", returncode=1)
        eval_run_accept(eval_run=eval_run)
        self.stdout.write(self.style.SUCCESS(f"no failure: evaluation run {eval_run.id} is accepted"))


def _how(before: bool | None) -> str:
    return {True: "regressed", False: "failed before too", None: "new"}[before]


def _id(value: str) -> int:
    return int(value) if value.isdigit() else 0


def _name(base: EvalRun | None, baseline: str) -> str:
    if base is None:
        return "nothing" if baseline == "none" else "nothing (no accepted pass yet)"
    return f"evaluation run {base.id} ({base.label}{', accepted' if base.accepted else ''})"


def _ungraded(eval_run: EvalRun) -> list[int]:
    """Results whose run has finished but whose judges have not graded it for a while."""
    stale = EvalResult.objects.filter(eval_run=eval_run, passed__isnull=True, run__finished_at__isnull=False)
    return [result.id for result in stale.select_related("run") if _stale(result)]


def _stale(result) -> bool:
    return (timezone.now() - result.run.finished_at).total_seconds() > 30
