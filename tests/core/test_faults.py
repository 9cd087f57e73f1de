"""Drill faults live behind one injector (core/faults.py): a no-op unless drill faults are on and the run
asks for some, and no production signature carries a fault list."""

import ast
from pathlib import Path

from core.faults import faults
from runs.models import FaultFiring

ROOT = Path(__file__).resolve().parents[2]
INPUT = {
    "faults": [
        {"task": "worker-1", "call": 2, "mode": "error"},
        {"task": "worker-1", "at": "start", "mode": "crash"},
    ]
}


def test_no_production_function_takes_a_fault_list():
    found = []
    for app in ("core", "tenancy", "runs", "agents", "tools", "approvals", "saga", "evals", "dashboard", "api"):
        for path in (ROOT / app).rglob("*.py"):
            if "migrations" in path.parts or path.name == "faults.py":
                continue
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                    names = [a.arg for a in node.args.args + node.args.kwonlyargs]
                    if {"faults", "fault_list"} & set(names):
                        found.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name}")
    assert not found, found


def test_the_injector_is_a_no_op_when_drill_faults_are_off(db, settings):
    settings.WARDEN = {**settings.WARDEN, "DRILL_FAULTS": False}
    with faults.around_call(INPUT, run_id=1, task_key="worker-1", call=2):
        assert faults.system is None and not faults.no_lookup
        faults.crash("after_intent")  # nothing to do
    assert not faults.start_crash_due(INPUT, run_id=1, task_key="worker-1")
    assert not FaultFiring.objects.exists()


def test_the_injector_applies_a_runs_faults_to_its_call_only(demo, settings):
    from runs.services import run_start

    settings.WARDEN = {**settings.WARDEN, "DRILL_FAULTS": True}
    run_id = run_start(workflow="deploy-review").id
    with faults.around_call(INPUT, run_id=run_id, task_key="worker-1", call=2):
        assert faults.system == "error"
    with faults.around_call(INPUT, run_id=run_id, task_key="worker-1", call=3):
        assert faults.system is None  # another call
    assert faults.system is None  # outside any call
    assert faults.start_crash_due(INPUT, run_id=run_id, task_key="worker-1")
    assert not faults.start_crash_due(INPUT, run_id=run_id, task_key="worker-1")  # once: the resumed worker lives
    assert FaultFiring.objects.filter(point="start").count() == 1
