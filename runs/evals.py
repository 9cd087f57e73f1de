"""Reference evaluations: a suite of cases (a workflow, its input, checks on the outcome) run once per
version of the agents, and compared: success, cost, steps and duration, side by side.

A version is a ModelVersion (trusted configuration: the model, provider, instructions or script it gives
named agents); "current agents" is the registry as it is. A single-agent baseline is a case pair, or a
version that routes the same cases to a one-agent workflow's agent. Each case runs as an ordinary run in
the suite's project, so its trace, ledger and budget are all on the run page.
"""

from dataclasses import dataclass, field

from django.db import transaction

from .models import EvalCase, EvalResult, EvalRun, EvalSuite, Run
from .services import run_start


def _finished(run: Run) -> bool:
    """An outcome to judge: ended, or stopped for a human (an evaluation does not wait for one)."""
    return run.is_terminal or run.status == Run.Status.NEEDS_ATTENTION


def eval_start(*, suite: EvalSuite, version=None, user=None) -> EvalRun:
    """Start every case of the suite, as runs of the suite's project; their results fill in as they end."""
    with transaction.atomic():
        eval_run = EvalRun.objects.create(suite=suite, version=version, started_by=user)
        for case in suite.cases.select_related("workflow"):
            run_input = {**case.input, **({"model_version": version.slug} if version else {})}
            run = run_start(
                workflow=case.workflow.slug, input=run_input, goal=case.goal, started_by=user, project=suite.project
            )
            EvalResult.objects.create(eval_run=eval_run, case=case, run=run)
    return eval_run


def check_failures(case: EvalCase, run: Run) -> list[str]:
    """What of the case's checks the run's outcome does not meet (empty: it passed)."""
    failures = []
    for check in case.checks:
        if "status" in check and run.status != check["status"]:
            failures.append(f"status is {run.status}, not {check['status']}")
        if "artifact" in check:
            artifact = run.artifacts.filter(task__key=check["artifact"]).order_by("-version").first()
            text = "" if artifact is None else str(artifact.content)
            if artifact is None:
                failures.append(f"no artifact from {check['artifact']}")
            elif check.get("contains") and check["contains"] not in text:
                failures.append(f"{check['artifact']} does not say {check['contains']!r}")
        if "max_cost_usd" in check and run.cost_micros > float(check["max_cost_usd"]) * 1_000_000:
            failures.append(f"cost ${run.cost_micros / 1e6:.4f} over ${check['max_cost_usd']}")
        if "max_steps" in check and run.steps_used > int(check["max_steps"]):
            failures.append(f"{run.steps_used} steps, over {check['max_steps']}")
    return failures


def eval_settle(eval_run: EvalRun) -> int:
    """Judge the results whose runs have finished since last time. Returns how many are still going."""
    going = 0
    for result in eval_run.results.filter(passed__isnull=True).select_related("case", "run"):
        if not _finished(result.run):
            going += 1
            continue
        failures = check_failures(result.case, result.run)
        EvalResult.objects.filter(id=result.id, passed__isnull=True).update(passed=not failures, failures=failures)
    return going


@dataclass
class Column:
    """One evaluation run's figures, for the comparison."""

    eval_run: EvalRun
    cells: dict = field(default_factory=dict)  # case id -> result
    passed: int = 0
    judged: int = 0
    going: int = 0
    cost_micros: int = 0
    steps: int = 0
    seconds: float = 0.0

    @property
    def success(self) -> float | None:
        return self.passed / self.judged if self.judged else None

    def mean(self, total) -> float | None:
        return total / self.judged if self.judged else None


def comparison(suite: EvalSuite, *, last: int = 4) -> tuple[list[EvalCase], list[Column]]:
    """The suite's cases and its latest evaluation runs (oldest first), each settled and summed up."""
    eval_runs = list(suite.eval_runs.select_related("version").order_by("-id")[:last])[::-1]
    columns = []
    for eval_run in eval_runs:
        eval_settle(eval_run)
        column = Column(eval_run)
        for result in eval_run.results.select_related("run"):
            column.cells[result.case_id] = result
            if result.passed is None:
                column.going += 1
                continue
            run = result.run
            column.judged += 1
            column.passed += int(result.passed)
            column.cost_micros += run.cost_micros
            column.steps += run.steps_used
            if run.started_at and run.finished_at:
                column.seconds += (run.finished_at - run.started_at).total_seconds()
        columns.append(column)
    return list(suite.cases.select_related("workflow")), columns


# The demo's suite (setup_demo): three reference tasks on deploy-review, and a stricter verifier to compare.
STRICT_VERIFIER = {
    "verifier-agent": {
        "script": [
            {"say": "Looking again at the rollback plan, step by step, before any verdict is given. " * 4},
            {"final": {"decision": "reject", "verdict": "REJECT — no canary; {deps[risk][summary]}"}},
        ]
    }
}


@transaction.atomic
def demo_suite_load() -> EvalSuite:
    """Idempotent, like the demo workflows it uses (load those first)."""
    from agents.models import ModelVersion, Workflow
    from approvals.access import default_project

    ModelVersion.objects.update_or_create(
        slug="strict-verifier",
        defaults={"name": "A stricter verifier (rejects without a canary)", "overrides": STRICT_VERIFIER},
    )
    suite, _ = EvalSuite.objects.update_or_create(
        slug="deploy-reviews",
        defaults={
            "name": "Deploy reviews",
            "project": default_project(),
            "description": "Does a change to the verifier still approve a safe deploy, in as few steps and as cheaply?",
        },
    )
    review = Workflow.objects.get(slug="deploy-review")
    cases = [
        ("approves a safe deploy", [{"status": "completed"}, {"artifact": "verify", "contains": "APPROVE"}]),
        ("finishes within 12 steps", [{"status": "completed"}, {"max_steps": 12}]),
        ("stays cheap", [{"max_cost_usd": 0.05}]),
    ]
    for name, checks in cases:
        EvalCase.objects.update_or_create(suite=suite, name=name, defaults={"workflow": review, "checks": checks})
    return suite
