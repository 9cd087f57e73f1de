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

from .checks import check_failures, checks_refusal
from .compare import Column, comparison, history
from .demo import STRICT_VERIFIER, demo_suite_load
from .judge import eval_grade
from .suites import (
    accepted_baseline_for,
    annotation_create,
    baseline_for,
    eval_case_create,
    eval_case_from_run,
    eval_judge_run,
    eval_run_accept,
    eval_start,
    eval_start_for_change,
    eval_suite_create,
    expected_checks,
    failing,
    regressions,
    rerun_on_refusal,
    version_saved,
)

__all__ = [
    "Column", "STRICT_VERIFIER", "accepted_baseline_for", "annotation_create", "baseline_for", "check_failures",
    "checks_refusal", "comparison", "demo_suite_load", "eval_case_create", "eval_case_from_run", "eval_grade",
    "eval_judge_run", "eval_run_accept", "eval_start", "eval_start_for_change", "eval_suite_create",
    "expected_checks", "failing", "history", "regressions", "rerun_on_refusal", "version_saved",
]  # fmt: skip
