"""Every status of the four state machines (run, task, tool operation, approval request) is written by
core/machine.py, applying its machine's table; the hand-written SQL fast paths name their moves from the
same table. This test reads the tree and fails on a status written anywhere else."""

import ast
import re
import sys
from pathlib import Path

import pytest

from approvals.transitions import APPROVAL_REQUEST
from core.machine import StateMachine, TransitionNotAllowed
from policy.models import ApprovalRequest
from runs.models import Run, Task
from runs.transitions import RUN, TASK
from tools.models import ToolOperation
from tools.transitions import OPERATION

ROOT = Path(__file__).resolve().parents[2]
APPS = [
    "core",
    "tenancy",
    "runs",
    "agents",
    "tools",
    "approvals",
    "saga",
    "evals",
    "integrations",
    "dashboard",
    "api",
    "config",
]
MACHINE = "core/machine.py"
TABLES = "runs_run|runs_task|tools_tooloperation|approvals_approvalrequest"
# A statement that sets a machine's status: "UPDATE <table> ... SET ... status = ..." before any WHERE.
BEFORE_WHERE = r"(?:(?!\bWHERE\b).)*?"
SQL_WRITE = re.compile(rf"UPDATE\s+({TABLES})\b{BEFORE_WHERE}\bSET\b{BEFORE_WHERE}\bstatus\s*=", re.S | re.I)
# Calls by which a scope names its moves from a table (core/machine.py).
NAMES_ITS_MOVES = {"edge", "check", "assign", "sql_in", "sources"}

# Status writes of things that are not these machines, each with why: (file, function) -> what the
# write's subject (the object or queryset written) must look like there.
SPANS = r"^Span\.objects\."
OTHER_MACHINES = {
    # spans: a trace's record (running, then ok or error), not a state anyone moves
    ("runs/services/failure.py", "fail_task"): SPANS,
    ("runs/services/completion.py", "_cancel_own"): SPANS,
    ("runs/services/leases.py", "record_lease_expiry"): SPANS,
    ("runs/services/recovery.py", "expire_leases"): SPANS,
    ("runs/services/recovery.py", "reap_cancelled"): SPANS,
    ("integrations/external.py", "external_run_finish"): SPANS,
    # webhook deliveries and idempotency keys: each its own small lifecycle, written by its one module
    ("integrations/webhooks.py", "webhook_deliver"): r"^(WebhookDelivery\.objects\.|claimed|delivery)",
    ("integrations/webhooks.py", "webhook_redeliver"): r"^(WebhookDelivery\.objects\.|delivery)",
    ("integrations/idempotency.py", "__call__"): r"^IdempotencyKey\.objects\.",
    # the sandbox's tickets are the outside world that tools act on
    ("tools/sandbox.py", "tickets_close"): r"^ticket$",
    # a budget change: run_budget_set refuses every field but the budget's before this line
    ("runs/services/runs.py", "run_budget_set"): r"^Run\.objects\.filter\(id=run_id\)$",
}


def _text(node) -> str | None:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):
        return "".join(_text(v) or "{}" for v in node.values)
    return None


def _scan():
    """(file, scope, line, what) for every status write, and the writes that name their moves from a
    table: in their own scope (edge, check, assign, sql_in, sources) or through a module-level name bound
    to an ``edge`` (``_COMPLETED = TASK.edge(RUNNING, COMPLETED)``)."""
    writes, naming = [], set()
    for app in APPS:
        for path in sorted((ROOT / app).rglob("*.py")):
            if "migrations" in path.parts:
                continue
            rel = str(path.relative_to(ROOT))
            tree = ast.parse(path.read_text())
            parents = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}

            def enclosing(node, parents=parents):
                while node in parents:
                    node = parents[node]
                    if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                        return node
                return None

            def scope(node):
                function = enclosing(node)
                return function.name if function else "<module>"

            edge_names = {
                target.id
                for statement in tree.body
                if isinstance(statement, ast.Assign)
                and any(isinstance(c, ast.Call) and getattr(c.func, "attr", "") == "edge" for c in ast.walk(statement))
                for target in ast.walk(statement.targets[0])
                if isinstance(target, ast.Name)
            }

            for node in ast.walk(tree):
                what, subject = None, ""
                if isinstance(node, ast.Assign | ast.AugAssign | ast.AnnAssign):
                    targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                    for target in targets:
                        for t in target.elts if isinstance(target, ast.Tuple) else [target]:
                            if isinstance(t, ast.Attribute) and t.attr == "status":
                                what, subject = "assigns .status", ast.unparse(t.value)
                elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
                    subject = ast.unparse(node.func.value)
                    if node.func.attr in ("update", "bulk_update"):
                        if any(k.arg == "status" for k in node.keywords):
                            what = "update(status=...)"
                        elif any(k.arg is None for k in node.keywords):
                            what = "update(**fields)"
                    for k in node.keywords:
                        if k.arg == "update_fields" and any(
                            isinstance(e, ast.Constant) and e.value == "status" for e in ast.walk(k.value)
                        ):
                            what = "save(update_fields=[status])"
                    if node.func.attr in NAMES_ITS_MOVES and isinstance(node.func.value, ast.Name):
                        naming.add((rel, scope(node), None))
                elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "setattr":
                    if len(node.args) > 1 and _text(node.args[1]) == "status":
                        what = "setattr(status)"
                text = _text(node) if isinstance(node, ast.Constant | ast.JoinedStr) else None
                if text and SQL_WRITE.search(text):
                    what = "SQL"
                    where = enclosing(node) or node
                    if edge_names & {n.id for n in ast.walk(where) if isinstance(n, ast.Name)}:
                        naming.add((rel, scope(node), node.lineno))
                if what:
                    writes.append((rel, scope(node), node.lineno, what, subject))
    return writes, naming


def test_statuses_are_written_only_through_their_state_machines():
    writes, naming = _scan()
    assert writes, "the scan found nothing: it is broken"
    wrong = []
    for rel, scope, line, what, subject in writes:
        if rel == MACHINE or re.search(OTHER_MACHINES.get((rel, scope), "^$^"), subject):
            continue
        if what == "SQL" and ((rel, scope, None) in naming or (rel, scope, line) in naming):
            continue  # a fast path that names its move from the table (edge/check/assign/sql_in)
        wrong.append(f"{rel}:{line} ({scope}): {what} on {subject}")
    assert not wrong, "statuses written outside core/machine.py:\n" + "\n".join(wrong)
    found = {(rel, scope) for rel, scope, *_ in writes}
    stale = OTHER_MACHINES.keys() - found
    assert not stale, f"exemptions that write no status now: {stale}"


def test_the_scan_finds_a_status_written_behind_the_machines_back(tmp_path, monkeypatch):
    """The scan itself: each way of writing a status is caught."""
    bad = tmp_path / "runs"
    bad.mkdir()
    (bad / "sneaky.py").write_text(
        "def a(t):\n    t.status = 'ready'\n"
        "def b(qs):\n    qs.update(status='failed')\n"
        "def c(t):\n    t.save(update_fields=['status'])\n"
        "def d():\n    return \"UPDATE runs_task SET pending_deps = 0, status = 'ready' WHERE id = 1\"\n"
    )
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    writes, _ = _scan()
    assert sorted(w[1] for w in writes) == ["a", "b", "c", "d"]


MACHINES = [
    (RUN, Run.Status),
    (TASK, Task.Status),
    (OPERATION, ToolOperation.Status),
    (APPROVAL_REQUEST, ApprovalRequest.Status),
]


@pytest.mark.parametrize("machine,states", MACHINES, ids=lambda m: getattr(m, "name", ""))
def test_each_table_covers_its_states_and_finished_states_stay_finished(machine: StateMachine, states):
    assert set(machine.table) == set(states.values)
    reachable = {to for targets in machine.table.values() for to in targets}
    assert reachable <= set(states.values)


def test_a_table_applies_to_single_and_bulk_moves(demo):
    """move refuses a forbidden move; move_where touches only rows in an allowed source; a bulk move may
    not name a source the table forbids."""
    from runs.services import run_start

    run = run_start(workflow="deploy-review")
    done, ready, running = list(run.tasks.order_by("id"))[:3]
    Task.objects.filter(id=done.id).update(status=Task.Status.COMPLETED)
    Task.objects.filter(id=ready.id).update(status=Task.Status.READY)
    Task.objects.filter(id=running.id).update(status=Task.Status.RUNNING)
    done.refresh_from_db()
    with pytest.raises(TransitionNotAllowed, match="task cannot go from completed to ready"):
        TASK.move(done, Task.Status.READY)
    trio = Task.objects.filter(id__in=[done.id, ready.id, running.id])
    assert TASK.move_where(trio, Task.Status.CANCELLED, sources=[Task.Status.READY]) == 1
    assert dict(trio.values_list("id", "status")) == {
        done.id: Task.Status.COMPLETED,
        ready.id: Task.Status.CANCELLED,
        running.id: Task.Status.RUNNING,
    }
    with pytest.raises(TransitionNotAllowed, match="from completed to cancelled"):
        TASK.move_where(trio, Task.Status.CANCELLED, sources=[Task.Status.COMPLETED])
    assert TASK.move_where(trio, Task.Status.CANCELLED) == 1  # the running one; the finished stay
    with pytest.raises(TransitionNotAllowed):
        TASK.edge(Task.Status.COMPLETED, Task.Status.READY)
    assert TASK.sql_in(Task.Status.COMPLETED) == "('running')"
