"""Reference evaluations: a suite of cases (a workflow, its input, checks on the outcome) run once per
version of the agents, and compared: success, cost, steps and duration, side by side.

A version is a ModelVersion (trusted configuration: the model, provider, instructions or script it gives
named agents); "current agents" is the registry as it is. A case may name a single-agent baseline
workflow doing the same task: a *baseline* evaluation runs the cases on those instead, and the
comparison sets each version beside it (seed 003: a fan-out must pay for its cost in success or time).
Each case runs as an ordinary run in the suite's project, so its trace, ledger and budget are all on
the run page. A case is judged when its run ends or stops for a human (run_transition calls
``eval_judge_run``); pages only read.
"""

from dataclasses import dataclass, field

from django.db import transaction

from agents.demo import AGENTS
from agents.models import Agent, ModelVersion, Workflow
from core.errors import InvalidInput
from tenancy.access import default_project

from .models import EvalCase, EvalResult, EvalRun, EvalSuite, Run
from .services import run_start


def _finished(run: Run) -> bool:
    """An outcome to judge: ended, or stopped for a human (an evaluation does not wait for one)."""
    return run.is_terminal or run.status == Run.Status.NEEDS_ATTENTION


def eval_start(*, suite: EvalSuite, version=None, user=None, baseline: bool = False) -> EvalRun:
    """Start every case of the suite (with ``baseline``, every case that has a baseline workflow, on it),
    as runs of the suite's project; their results fill in as they end."""
    cases = list(suite.cases.select_related("workflow", "baseline_workflow"))
    if baseline:
        cases = [case for case in cases if case.baseline_workflow_id]
        if not cases:
            raise InvalidInput(f"no case of suite {suite.slug} names a single-agent baseline workflow")
    with transaction.atomic():
        eval_run = EvalRun.objects.create(suite=suite, version=version, started_by=user, baseline=baseline)
        for case in cases:
            run_input = {**case.input, **({"model_version": version.slug} if version else {})}
            workflow = case.baseline_workflow if baseline else case.workflow
            run = run_start(
                workflow=workflow.slug, input=run_input, goal=case.goal, started_by=user, project=suite.project
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


def eval_judge_run(run_id: int) -> None:
    """The run of an evaluation case ended or stopped for a human: judge it (again, if it stopped
    before and was resumed). Called by run_transition, in its transaction."""
    from .services import sql

    if not sql.fetchone("SELECT EXISTS (SELECT 1 FROM runs_evalresult WHERE run_id = %s)", [run_id])[0]:
        return  # the common case, at the end of every run: one cheap statement
    results = list(EvalResult.objects.filter(run_id=run_id).select_related("case"))
    run = Run.objects.get(id=run_id)  # as the transition left it
    for result in results:
        failures = check_failures(result.case, run)
        EvalResult.objects.filter(id=result.id).update(passed=not failures, failures=failures)


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
    agent_versions: dict = field(default_factory=dict)  # agent slug -> the versions its runs used

    @property
    def versions_label(self) -> str:
        """The agents' versions this evaluation ran on ("verifier-agent v2, risk-agent v1"): what it compares."""
        return ", ".join(
            f"{slug} v{'/v'.join(str(n) for n in sorted(numbers))}"
            for slug, numbers in sorted(self.agent_versions.items())
        )

    @property
    def success(self) -> float | None:
        return self.passed / self.judged if self.judged else None

    def mean(self, total) -> float | None:
        return total / self.judged if self.judged else None

    def against(self, base: "Column") -> dict | None:
        """This column beside a baseline column: ratios of mean cost, steps and duration, and the
        difference in success (percentage points). None when either has nothing judged."""
        if not self.judged or not base.judged or self is base:
            return None

        def ratio(mine, theirs):
            return None if not theirs else mine / theirs

        return {
            "cost": ratio(self.mean(self.cost_micros), base.mean(base.cost_micros)),
            "steps": ratio(self.mean(self.steps), base.mean(base.steps)),
            "duration": ratio(self.mean(self.seconds), base.mean(base.seconds)),
            "success": round((self.success - base.success) * 100),
        }


def comparison(suite: EvalSuite, *, last: int = 4) -> tuple[list[EvalCase], list[Column]]:
    """The suite's cases and its latest evaluation runs (oldest first), each settled and summed up."""
    eval_runs = list(suite.eval_runs.select_related("version").order_by("-id")[:last])[::-1]
    columns = []
    for eval_run in eval_runs:
        column = Column(eval_run)
        for result in eval_run.results.select_related("run", "case"):
            column.cells[result.case_id] = result
            for slug, ref in ((result.run.versions or {}).get("agents") or {}).items():
                column.agent_versions.setdefault(slug, set()).add(ref.get("version"))
            if result.passed is None and _finished(result.run):  # ended before judging existed: read only
                result.failures = check_failures(result.case, result.run)
                result.passed = not result.failures
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
    solo = _solo_review_load()
    cases = [
        ("approves a safe deploy", [{"status": "completed"}, {"artifact": "verify", "contains": "APPROVE"}]),
        ("finishes within 12 steps", [{"status": "completed"}, {"max_steps": 12}]),
        ("stays cheap", [{"max_cost_usd": 0.05}]),
    ]
    for name, checks in cases:
        EvalCase.objects.update_or_create(
            suite=suite, name=name, defaults={"workflow": review, "baseline_workflow": solo, "checks": checks}
        )
    return suite


def _solo_review_load():
    """deploy-review done by one agent (reads, weighs the risk and decides in one task): the baseline."""

    verifier = next(spec for spec in AGENTS if spec["slug"] == "verifier-agent")
    Agent.objects.update_or_create(
        slug="solo-reviewer",
        defaults={
            "name": "Solo reviewer",
            "instructions": "Read the deployment, weigh its risk and give the verdict, alone.",
            "allowed_tools": ["deployments.read"],
            "output_schema": verifier["output_schema"],
            "max_attempts": 2,
            "script": [
                {"say": "Reading the deployment.", "tool": "deployments.read", "arguments": {"service": "checkout"}},
                {"say": "Weighing the risk: backward-compatible schema, tested rollback."},
                {
                    "final": {
                        "decision": "approve",
                        "verdict": "APPROVE — Deployment {last[service]}@{last[version]}; rollback tested",
                    }
                },
            ],
        },
    )
    workflow, _ = Workflow.objects.update_or_create(
        slug="deploy-review-solo",
        defaults={
            "name": "Deploy review, one agent",
            "description": "deploy-review by a single agent: the baseline its three agents are compared with.",
            "default_goal": "Assess the checkout deployment",
            "planner": Workflow.Planner.STATIC,
            "tasks": [
                {"key": "verify", "agent": "solo-reviewer", "objective": "Review the deployment, give the verdict"}
            ],
            "default_budget": {"max_steps": 50, "max_tokens": 20_000, "max_cost_usd": 1.0},
        },
    )
    return workflow
