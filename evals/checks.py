"""A case's checks: what its run's outcome must meet (docs/evaluations.md, "Checks").

Each check is a small JSON object. All but the judge are decided from the database alone, inside the
transaction that ends the run; the judge asks a model, so it is graded after commit (runs/evals/judge.py).
``checks_refusal`` validates a list before it is stored, so a bad check is a 422 that writes nothing,
never a failure found when the run ends.
"""

import math

import jsonschema

from runs.models import Run, Span
from tools.models import ToolOperation

# The operations that left (or may have left) for the outside world.
WENT_OUT = ("executing", "committed", "ambiguous", "compensating", "compensated", "compensation_failed")

KEYS = {
    "status": {"status"},
    "contains": {"artifact", "contains"},
    "schema": {"artifact", "schema"},
    "equals": {"artifact", "path", "equals"},
    "approx": {"artifact", "path", "approx", "tolerance"},
    "range": {"artifact", "path", "min", "max"},
    "max_cost_usd": {"max_cost_usd"},
    "max_steps": {"max_steps"},
    "tool_called": {"tool_called"},
    "tool_not_called": {"tool_not_called"},
    "no_unapproved_irreversible": {"no_unapproved_irreversible"},
    "judge": {"judge"},
}
JUDGE_KEYS = {"agent", "artifact", "rubric", "min_score"}


def kind_of(check: dict) -> str | None:
    """Which check this is, by the key that names it (None: none known)."""
    for kind in ("judge", "schema", "equals", "approx", "contains", "tool_called", "tool_not_called"):
        if kind in check:
            return kind
    if "min" in check or "max" in check:
        return "range"
    return next(
        (kind for kind in ("status", "max_cost_usd", "max_steps", "no_unapproved_irreversible") if kind in check),
        "contains" if "artifact" in check else None,
    )


def _number(value) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _check_refusal(check, where: str) -> str | None:
    if not isinstance(check, dict):
        return f"{where}: a check is a JSON object"
    kind = kind_of(check)
    if kind is None:
        return f"{where}: unknown check {sorted(check)} (see docs/evaluations.md)"
    unknown = set(check) - KEYS[kind] - {"artifact", "path"}
    if unknown:
        return f"{where}: {kind} check does not take {sorted(unknown)}"
    if kind == "status" and check["status"] not in Run.Status.values:
        return f"{where}: unknown status {check['status']!r}"
    if kind == "schema":
        try:
            jsonschema.Draft202012Validator.check_schema(check["schema"])
        except jsonschema.SchemaError as exc:
            return f"{where}: not a JSON Schema: {exc.message}"
    numbers = [check.get(name) for name in ("approx", "tolerance", "min", "max", "max_cost_usd", "max_steps")]
    if any(value is not None and not _number(value) for value in numbers):
        return f"{where}: approx, tolerance, min, max, max_cost_usd and max_steps are numbers"
    if kind in ("equals", "approx", "range", "schema", "contains") and not check.get("artifact"):
        return f"{where}: {kind} needs the artifact (a task key) it reads"
    if kind in ("tool_called", "tool_not_called") and not (isinstance(check[kind], str) and check[kind]):
        return f"{where}: {kind} names a tool"
    if kind == "judge":
        return _judge_refusal(check["judge"], where)
    return None


def _judge_refusal(judge, where: str) -> str | None:
    if not isinstance(judge, dict) or set(judge) - JUDGE_KEYS:
        return f"{where}: judge takes {sorted(JUDGE_KEYS)}"
    if not all(isinstance(judge.get(name), str) and judge.get(name) for name in ("agent", "artifact", "rubric")):
        return f"{where}: judge needs agent (its model), artifact (a task key) and rubric"
    if not _number(judge.get("min_score", 0.5)) or not 0 <= judge.get("min_score", 0.5) <= 1:
        return f"{where}: judge min_score is between 0 and 1"
    return None


def checks_refusal(checks) -> list[dict]:
    """Why these checks cannot be stored, as API errors ({field, message}); empty: they can."""
    if not isinstance(checks, list):
        return [{"field": "checks", "message": "a list of checks"}]
    errors = [_check_refusal(check, f"checks[{n}]") for n, check in enumerate(checks)]
    return [{"field": message.split(":")[0], "message": message} for message in errors if message]


def finished(run: Run) -> bool:
    """An outcome to judge: ended, or stopped for a human (an evaluation does not wait for one)."""
    return run.is_terminal or run.status == Run.Status.NEEDS_ATTENTION


def judges(checks: list[dict]) -> list[dict]:
    return [check["judge"] for check in checks if isinstance(check, dict) and "judge" in check]


def _artifact(run: Run, key: str):
    return run.artifacts.filter(task__key=key).order_by("-version").first()


def _at(value, path: str):
    """The value at a dotted path ("findings.0.severity"); KeyError when it is not there."""
    for part in [p for p in path.split(".") if p]:
        if isinstance(value, list) and part.isdigit() and int(part) < len(value):
            value = value[int(part)]
        elif isinstance(value, dict) and part in value:
            value = value[part]
        else:
            raise KeyError(path)
    return value


def _artifact_failure(check: dict, kind: str, run: Run) -> str | None:
    artifact = _artifact(run, check["artifact"])
    if artifact is None:
        return f"no artifact from {check['artifact']}"
    name = check["artifact"] + (f".{check['path']}" if check.get("path") else "")
    if kind == "contains":
        return (
            None if check.get("contains", "") in str(artifact.content) else f"{name} does not say {check['contains']!r}"
        )
    if kind == "schema":
        error = jsonschema.exceptions.best_match(
            jsonschema.Draft202012Validator(check["schema"]).iter_errors(artifact.content)
        )
        return None if error is None else f"{name} does not match the schema: {error.message[:200]}"
    try:
        value = _at(artifact.content, check.get("path", ""))
    except KeyError:
        return f"{name} is missing"
    if kind == "equals":
        return None if value == check["equals"] else f"{name} is {value!r}, not {check['equals']!r}"
    if not _number(value):
        return f"{name} is {value!r}, not a number"
    if kind == "approx" and abs(value - check["approx"]) > check.get("tolerance", 0):
        return f"{name} is {value}, not {check['approx']} ± {check.get('tolerance', 0)}"
    if kind == "range" and not check.get("min", -math.inf) <= value <= check.get("max", math.inf):
        return f"{name} is {value}, outside [{check.get('min', '-∞')}, {check.get('max', '∞')}]"
    return None


def _replay_calls(run: Run) -> list[dict]:
    """A replay's calls, from its journal (it has no ledger rows: tools/replaying.py), refused ones left out."""
    bodies = Span.objects.filter(run_id=run.id, kind=Span.Kind.TOOL_CALL, step__isnull=False).values_list(
        "body", flat=True
    )
    records = [(body or {}).get("replay") or {} for body in bodies]
    return [r for r in records if r.get("tool") and r.get("answered") != "refused"]


def _replay_ledger_failure(check: dict, kind: str, run: Run) -> str | None:
    """As _ledger_failure, on what a replay would have called: an irreversible write the gate would have
    let through without a reviewer (not one the original's receipt answered) is an unapproved one."""
    calls = _replay_calls(run)
    tools = {c["tool"] for c in calls}
    if kind == "tool_called" and check["tool_called"] not in tools:
        return f"{check['tool_called']} would not have been called"
    if kind == "tool_not_called" and check["tool_not_called"] in tools:
        return f"{check['tool_not_called']} would have been called"
    if kind == "no_unapproved_irreversible" and check["no_unapproved_irreversible"]:
        unapproved = {
            c["tool"] for c in calls
            if c.get("reversibility") == ToolOperation.Reversibility.IRREVERSIBLE and c.get("write")
            and c.get("verdict") == "allow" and c.get("answered") != "recorded"
        }  # fmt: skip
        if unapproved:
            return f"irreversible call without approval: {', '.join(sorted(unapproved))}"
    return None


def _ledger_failure(check: dict, kind: str, run: Run) -> str | None:
    if run.mode != Run.Mode.LIVE:
        return _replay_ledger_failure(check, kind, run)
    operations = ToolOperation.objects.filter(run_id=run.id)
    if kind == "tool_called" and not operations.filter(tool=check["tool_called"]).exists():
        return f"{check['tool_called']} was not called"
    if kind == "tool_not_called" and operations.filter(tool=check["tool_not_called"]).exists():
        return f"{check['tool_not_called']} was called"
    if kind == "no_unapproved_irreversible" and check["no_unapproved_irreversible"]:
        unapproved = (
            operations.filter(reversibility=ToolOperation.Reversibility.IRREVERSIBLE, status__in=WENT_OUT)
            .exclude(approval__status="approved")
            .values_list("tool", flat=True)
        )
        if unapproved:
            return f"irreversible call without approval: {', '.join(sorted(set(unapproved)))}"
    return None


def check_failure(check: dict, run: Run) -> str | None:
    """What this check finds wrong with the run's outcome (None: it holds). Judges are graded apart."""
    kind = kind_of(check)
    if kind == "status":
        return None if run.status == check["status"] else f"status is {run.status}, not {check['status']}"
    if kind == "max_cost_usd" and run.cost_micros > float(check["max_cost_usd"]) * 1_000_000:
        return f"cost ${run.cost_micros / 1e6:.4f} over ${check['max_cost_usd']}"
    if kind == "max_steps" and run.steps_used > int(check["max_steps"]):
        return f"{run.steps_used} steps, over {check['max_steps']}"
    if kind in ("contains", "schema", "equals", "approx", "range"):
        return _artifact_failure(check, kind, run)
    if kind in ("tool_called", "tool_not_called", "no_unapproved_irreversible"):
        return _ledger_failure(check, kind, run)
    return None


def check_failures(case, run: Run) -> list[str]:
    """What of the case's checks the run's outcome does not meet (empty: it passed, judges aside)."""
    return [failure for check in case.checks if (failure := check_failure(check, run))]
