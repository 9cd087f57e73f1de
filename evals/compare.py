"""The comparison: a suite's latest passes side by side, per case and in aggregate (success, cost, steps,
duration, judge scores), each beside a single-agent baseline; and each figure across the last passes
(the chart). Reads only."""

from dataclasses import dataclass, field

from .checks import check_failures, finished, judges
from .models import EvalCase, EvalRun, EvalSuite


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
    scores: list = field(default_factory=list)  # every judge score of its settled cases
    judge_cost_micros: int = 0
    agent_versions: dict = field(default_factory=dict)  # agent slug -> the versions its runs used
    workflow_versions: dict = field(default_factory=dict)  # workflow slug -> the versions its runs used

    @property
    def versions_label(self) -> str:
        """The workflows' and agents' versions this evaluation ran on ("workflow deploy-review v3 · agents
        verifier-agent v2, risk-agent v1"): what it compares."""

        def listed(versions: dict) -> str:
            return ", ".join(
                f"{slug} v{'/v'.join(str(n) for n in sorted(numbers))}" for slug, numbers in sorted(versions.items())
            )

        parts = []
        if self.workflow_versions:
            parts.append(f"workflow {listed(self.workflow_versions)}")
        if self.agent_versions:
            parts.append(f"agents {listed(self.agent_versions)}")
        return " · ".join(parts)

    @property
    def success(self) -> float | None:
        return self.passed / self.judged if self.judged else None

    def mean(self, total) -> float | None:
        return total / self.judged if self.judged else None

    @property
    def mean_score(self) -> float | None:
        return sum(self.scores) / len(self.scores) if self.scores else None

    def figures(self) -> dict:
        """The aggregate figures the comparison and its chart show (None: nothing settled)."""
        return {
            "success": None if self.success is None else round(self.success * 100, 1),
            "cost_usd": None if not self.judged else round(self.mean(self.cost_micros) / 1e6, 6),
            "steps": self.mean(self.steps),
            "seconds": self.mean(self.seconds),
            "judge_score": self.mean_score,
        }

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
    if not any(eval_run.baseline for eval_run in eval_runs):  # the single-agent baseline stays a column
        base = suite.eval_runs.select_related("version").filter(baseline=True).order_by("-id").first()
        eval_runs = ([base] if base else []) + eval_runs
    return list(suite.cases.select_related("workflow")), columns_of(eval_runs)


def columns_of(eval_runs: list[EvalRun]) -> list[Column]:
    columns = []
    for eval_run in eval_runs:
        column = Column(eval_run)
        for result in eval_run.results.select_related("run__workflow_version__workflow", "case"):
            column.cells[result.case_id] = result
            pinned = result.run.workflow_version
            if pinned is not None:
                column.workflow_versions.setdefault(pinned.workflow.slug, set()).add(pinned.number)
            for slug, ref in ((result.run.versions or {}).get("agents") or {}).items():
                column.agent_versions.setdefault(slug, set()).add(ref.get("version"))
            if result.passed is None and finished(result.run) and not judges(result.case.checks):
                # ended before judging existed: settled here, read only
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
            column.scores += [g["score"] for g in result.grades or [] if g.get("score") is not None]
            column.judge_cost_micros += result.judge_cost_micros
            if run.started_at and run.finished_at:
                column.seconds += (run.finished_at - run.started_at).total_seconds()
        columns.append(column)
    return columns


FIGURES = (("success", "success %"), ("cost_usd", "mean cost $"), ("steps", "mean steps"),
           ("seconds", "mean duration s"), ("judge_score", "mean judge score"))  # fmt: skip


def history(suite: EvalSuite, *, last: int = 10) -> dict:
    """Each figure across the suite's last ``last`` passes (oldest first), for the chart: {figure: [(label,
    value or None)]}, with the passes' labels."""
    eval_runs = list(suite.eval_runs.select_related("version").order_by("-id")[:last])[::-1]
    columns = columns_of(eval_runs)
    labels = [f"#{column.eval_run.id} {column.eval_run.label}" for column in columns]
    return {"labels": labels, "series": {name: [column.figures()[name] for column in columns] for name, _ in FIGURES}}
