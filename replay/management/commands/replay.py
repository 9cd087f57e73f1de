"""Replay past runs on a candidate agent, wait for the replays, print the differences, and exit 1 when
they cross ``--fail-on`` (for CI: docs/replay.md)."""

import json
import time
from pathlib import Path

from django.core.management.base import BaseCommand, CommandError

from core.errors import WardenError
from evals.models import EvalSuite
from replay.services import FAIL_ON, replay_diff, replay_fails, replay_settled, replay_start
from runs.models import Run
from runs.workers import workers_while_waiting


def edits_read(path: str) -> dict | None:
    """--edits FILE: a draft's fields, as JSON (none without a path)."""
    if not path:
        return None
    try:
        return json.loads(Path(path).read_text())
    except (OSError, ValueError) as exc:
        raise CommandError(f"--edits: {exc}", returncode=2) from exc


class Command(BaseCommand):
    help = "Replay settled runs on a candidate agent (a version, or a draft's edits) with zero effects, and compare."

    def add_arguments(self, parser):
        parser.add_argument("--runs", default="", help="Run ids, comma-separated")
        parser.add_argument("--workflow", default="", help="...or the latest settled runs of this workflow")
        parser.add_argument("--suite", default="", help="...or an evaluation suite's (graded by its cases' checks)")
        parser.add_argument("--limit", type=int, default=20, help="How many of the workflow's runs (default 20)")
        parser.add_argument("--agent", default="", help="The agent whose candidate is tried (its slug)")
        parser.add_argument("--workflow-version", type=int, default=None,
                            help="And/or the runs' workflow as this version of it says")  # fmt: skip
        parser.add_argument("--agent-version", type=int, default=None, help="One of the agent's version numbers")
        parser.add_argument("--edits", default="", help="A JSON file of the draft's fields (instructions, script, …)")
        parser.add_argument("--fail-on", default="", choices=["", *FAIL_ON], help="Exit 1 when the replay shows this")
        parser.add_argument("--timeout", type=float, default=600, help="Seconds to wait for the replays")
        parser.add_argument("--json", action="store_true", help="Print the differences as JSON")
        parser.add_argument("--live-reads", action="store_true",
                            help="Send the reads the originals did not make, where safe to repeat")  # fmt: skip

    def handle(self, *, runs, workflow, limit, agent, agent_version, edits, fail_on, timeout, **options):
        suite = self._suite(options["suite"])
        run_ids = self._runs(runs, workflow, limit) if suite is None else None
        draft = self._edits(edits)
        try:
            replay = replay_start(run_ids=run_ids, agent=agent, version=agent_version, edits=draft, via="command",
                                  live_reads=options["live_reads"], suite=suite,
                                  workflow_version=options["workflow_version"])  # fmt: skip
        except WardenError as exc:
            raise CommandError(str(exc), returncode=2) from exc
        count, candidate = replay.pairs.count(), replay.candidate
        tried = f"{agent} v{candidate['version']}" if agent else f"workflow v{candidate['workflow_version']}"
        self.stderr.write(f"replay {replay.id}: {count} run(s) on {tried}")
        self._wait(replay, timeout)
        diff = replay_diff(replay)
        if options["json"]:
            self.stdout.write(json.dumps(diff, default=str))
        else:
            self._print(diff)
        if fail_on and replay_fails(diff, fail_on):
            raise CommandError(f"the candidate fails --fail-on {fail_on}", returncode=1)

    def _runs(self, runs: str, workflow: str, limit: int) -> list[int]:
        if runs:
            try:
                return [int(part) for part in runs.split(",") if part.strip()]
            except ValueError as exc:
                raise CommandError("--runs takes run ids, comma-separated", returncode=2) from exc
        if not workflow:
            raise CommandError("choose the runs: --runs or --workflow", returncode=2)
        settled = [*Run.TERMINAL, Run.Status.NEEDS_ATTENTION]
        found = Run.objects.filter(workflow__slug=workflow, mode=Run.Mode.LIVE, status__in=settled)
        ids = list(found.order_by("-id").values_list("id", flat=True)[: max(1, limit)])
        if not ids:
            raise CommandError(f"no settled run of {workflow!r}", returncode=2)
        return sorted(ids)

    def _suite(self, slug: str) -> EvalSuite | None:
        if not slug:
            return None
        found = EvalSuite.objects.filter(slug=slug).first()
        if found is None:
            raise CommandError(f"no suite {slug!r}", returncode=2)
        return found

    def _edits(self, path: str) -> dict | None:
        return edits_read(path)

    def _wait(self, replay, timeout: float) -> None:
        with workers_while_waiting():
            deadline = time.monotonic() + timeout
            while not replay_settled(replay):
                if time.monotonic() > deadline:
                    raise CommandError(f"timed out after {timeout:.0f}s waiting for the replays", returncode=2)
                time.sleep(0.2)

    def _print(self, diff: dict) -> None:
        total = diff["total"]
        for pair in diff["runs"]:
            if pair["difference"] is None:
                self.stdout.write(f"  run {pair['replay']}: its original is gone")
                continue
            head = "DIFFERS" if pair["difference"] else "same"
            self.stdout.write(f"  {head:7} run {pair['original']} → replay {pair['replay']}")
            for call in pair["calls_added"]:
                kind = "irreversible" if call.get("reversibility") == "irreversible" else call.get("tool_class", "")
                self.stdout.write(
                    f"          + {call['tool']} ({kind}, task {call['task']} step {call['step']}, "
                    f"would have been: {call.get('verdict')})"
                )
            for call in pair["calls_removed"]:
                self.stdout.write(f"          - {call['tool']} (task {call['task']} step {call['step']})")
            if not pair["output_equal"]:
                self.stdout.write(f"          output differs: {', '.join(pair['outputs_differing'])}")
            if pair["first_divergence"]:
                where = pair["first_divergence"]
                self.stdout.write(f"          first divergence: task {where['task']} step {where['step']}")
            checks = pair.get("checks")
            if checks and (checks["regressed"] or checks["fixed"]):
                what = "REGRESSED" if checks["regressed"] else "fixed"
                failures = "; ".join(checks["replay"] or checks["original"])
                self.stdout.write(f"          checks of case {checks['case']!r} {what}: {failures}")
        self.stdout.write(
            f"{total['runs']} run(s), {total['differing']} differing; calls added {total['calls_added']} "
            f"(irreversible {total['irreversible_added']}), removed {total['calls_removed']}; "
            f"checks regressed {total['checks_regressed']}; "
            f"steps {total['steps_original']} → {total['steps_replay']}, "
            f"tokens {total['tokens_original']} → {total['tokens_replay']}"
        )
