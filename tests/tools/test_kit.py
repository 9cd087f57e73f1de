"""A team's own Python tools (tests/tools/team_tools.py, declared with tools/kit.py): registered from the
tool modules setting, called through the gate and the ledger like Warden's own, given their credentials by
name and never showing them, undone by the tool they name, reconciled by their lookup; a bad declaration
stops the start with its reason and registers nothing."""

import json
import logging
import sys
import time
import types
import uuid

import pytest
from django.apps import apps
from django.core.exceptions import ImproperlyConfigured

from policy.models import ApprovalPolicy
from runs.models import Run
from runs.services import run_start
from saga.compensation import run_compensate
from tenancy.access import default_project
from tests.conftest import wait_for
from tests.runs.test_engine import finished, scripted_workflow
from tests.tools import team_tools
from tools.models import ToolOperation
from tools.registry import TOOLS, tools_load

OS = ToolOperation.Status
CANARY = f"pay-key-{uuid.uuid4().hex}"


@pytest.fixture
def payments(monkeypatch, tmp_path):
    """The team's module registered beside the sandbox's, its credential in the environment; the file
    its payments service keeps, to count effects from outside Warden."""
    ledger = tmp_path / "payments.jsonl"
    monkeypatch.setenv("TEAM_PAYMENTS_KEY", CANARY)
    monkeypatch.setenv("TEAM_PAYMENTS_EXPECTED_KEY", CANARY)
    monkeypatch.setenv("TEAM_PAYMENTS_FILE", str(ledger))
    before = dict(TOOLS)
    tools_load(["tools.sandbox_tools", "tests.tools.team_tools"])
    yield ledger
    TOOLS.clear()
    TOOLS.update(before)


def effects(ledger) -> list[dict]:
    return [json.loads(line) for line in ledger.read_text().splitlines()] if ledger.exists() else []


def _hold_run(card: str, *, then_fail: bool = False, attempts: int = 1) -> Run:
    wf = scripted_workflow(
        f"pay-{card}-{then_fail}",
        [
            {"tool": "payments.hold", "arguments": {"card": card, "amount_cents": 1250}},
            {"final": {"hold": "{last[hold_id]}"}},
        ],
        tools=["payments.hold"],
        # then_fail: the order step after the hold fails for good, so the hold is to be undone
        output_schema={"type": "object", "required": ["order"]} if then_fail else None,
        max_attempts=attempts,
    )
    return finished(run_start(workflow=wf.slug))


def test_a_teams_tool_is_gated_journaled_and_undone_by_the_tool_it_names(demo_tx, worker, payments, caplog):
    caplog.set_level(logging.DEBUG)
    run = _hold_run("card_4242", then_fail=True)
    assert run.status == Run.Status.NEEDS_ATTENTION, run.status_reason
    [held] = effects(payments)  # the service saw the call once, with the run's key and the right credential
    op = ToolOperation.objects.get(run=run, tool="payments.hold")
    assert (op.status, op.idempotency_key, op.external_id) == (OS.COMMITTED, held["key"], held["answer"]["hold_id"])
    assert op.verdict["decision"] and op.tool_class == "idempotent_write" and op.reversibility == "reversible"

    run_compensate(run_id=run.id, reason="the order was cancelled")
    wait_for(lambda: Run.objects.get(id=run.id).status == Run.Status.COMPENSATED, message="the compensation")
    release = effects(payments)[1]
    assert release["op"] == "release" and release["answer"]["hold_id"] == held["answer"]["hold_id"]
    assert ToolOperation.objects.get(run=run, tool="payments.release").status == OS.COMMITTED

    # The credential reached the service (it checks it) and nothing else: no row, no log line.
    for model in apps.get_models():
        assert CANARY not in json.dumps(list(model._default_manager.values()), default=str), model.__name__
    assert CANARY not in caplog.text


def test_a_lost_answer_is_reconciled_by_the_tools_own_lookup_and_not_sent_again(demo_tx, worker, payments):
    run = _hold_run("card_lostanswer")
    assert run.status == Run.Status.COMPLETED, run.status_reason
    assert len(effects(payments)) == 1  # made once; the timeout did not make the broker call again
    op = ToolOperation.objects.get(run=run, tool="payments.hold")
    assert op.status == OS.COMMITTED and "reconciled" in op.status_reason


def calls(ledger) -> list[str]:
    path = ledger.with_name(ledger.name + ".calls")
    return path.read_text().split() if path.exists() else []


def test_a_call_past_its_deadline_is_cut_off_and_reconciled_not_sent_blindly(demo_tx, worker, payments):
    """An idempotent write: cut off at 1 s, not found yet, called again with the same key; the service
    kept one hold, and the second call's answer (or the lookup) is the receipt."""
    run = _hold_run("card_slow", attempts=3)
    assert run.status == Run.Status.COMPLETED, run.status_reason
    op = ToolOperation.objects.get(run=run, tool="payments.hold")
    assert op.status == OS.COMMITTED and op.attempts >= 2
    assert len(calls(payments)) >= 2 and set(calls(payments)) == {op.idempotency_key}  # same key each time
    time.sleep(team_tools.SLOW_SECONDS)  # the calls cut off land in the meantime
    assert [e["op"] for e in effects(payments)] == ["hold"]  # one hold, however many calls


def test_a_non_idempotent_call_cut_off_goes_to_a_person_and_is_never_sent_again(demo_tx, worker, payments):
    # Irreversible: the project lets it leave unattended (the cut-off is the subject here).
    ApprovalPolicy.objects.create(name="notes", effect="waive", project=default_project(), tool="payments.notify")
    wf = scripted_workflow(
        "notify-slow",
        [{"tool": "payments.notify", "arguments": {"to": "a@x.example", "text": "slow"}}, {"final": {}}],
        tools=["payments.notify"],
    )
    run = finished(run_start(workflow=wf.slug))
    assert run.status == Run.Status.NEEDS_ATTENTION
    op = ToolOperation.objects.get(run=run, tool="payments.notify")
    assert op.status == OS.AMBIGUOUS and "cut off" in op.status_reason
    wait_for(lambda: len(effects(payments)) == 1, message="the late message to land")
    assert len(calls(payments)) == 1  # it landed late, once; the broker did not call again


def test_a_missing_credential_refuses_the_call_and_sends_nothing(demo_tx, worker, payments, monkeypatch):
    monkeypatch.delenv("TEAM_PAYMENTS_KEY")
    run = _hold_run("card_4242")
    assert run.status == Run.Status.NEEDS_ATTENTION
    assert "TEAM_PAYMENTS_KEY is not set" in run.status_reason
    assert effects(payments) == []


BAD = {
    "an unknown side-effect class": (
        "tool_class='sometimes_write', reversibility=''",
        "unknown side-effect class 'sometimes_write'",
    ),
    "an undo naming a missing tool": (
        "tool_class=ToolClass.IDEMPOTENT_WRITE, reversibility=Reversibility.REVERSIBLE,"
        " undo=Undo('refunds.cancel', lambda a, r: {})",
        "its undo names the tool 'refunds.cancel', which is not registered",
    ),
    "a secret that is not set": (
        "tool_class=ToolClass.READ_ONLY, secrets=['NO_SUCH_WARDEN_SECRET']",
        "the secret NO_SUCH_WARDEN_SECRET is not set",
    ),
    "one of Warden's own settings as a secret": (
        "tool_class=ToolClass.READ_ONLY, secrets=['DATABASE_URL']",
        "the secret DATABASE_URL is one of Warden's own settings: it can never be named",
    ),
    "a write that does not say whether it can be undone": (
        "tool_class=ToolClass.NON_IDEMPOTENT_WRITE",
        "a write must say whether it is reversible or irreversible",
    ),
    "a stand-in for replays its result could not be": (
        "tool_class=ToolClass.IDEMPOTENT_WRITE, reversibility=Reversibility.REVERSIBLE, replay_result={'y': 'many'}",
        "its replay_result is not a result it could answer (y)",
    ),
    "a stand-in for replays on a read": (
        "tool_class=ToolClass.READ_ONLY, replay_result={'y': 1}",
        "a read has no replay_result: a replay answers reads from the original run's ledger",
    ),
    "a write a replay could send again": (
        "tool_class=ToolClass.IDEMPOTENT_WRITE, reversibility=Reversibility.REVERSIBLE, repeatable=True",
        "a write is never repeatable: only a read may be sent again by a replay",
    ),
    "an external id its result does not have": (
        "tool_class=ToolClass.READ_ONLY, external_id='refund_id'",
        "external_id names 'refund_id', which its result does not have",
    ),
}


def _module(name: str, declaration: str):
    """A tool module as a team would write it, with one declaration in it."""
    module = types.ModuleType(name)
    sys.modules[name] = module
    exec(
        "from tools.kit import *\n"
        "class A(ToolArguments):\n    x: int = 1\n"
        "class R(ToolResult):\n    y: int = 0\n"
        f"@tool('refunds.create', arguments=A, result=R, {declaration})\n"
        "def create(arguments, *, key, secrets, deadline):\n    return {'y': 1}\n",
        module.__dict__,
    )
    return name


@pytest.mark.parametrize("case", sorted(BAD))
def test_a_bad_declaration_stops_the_start_with_its_reason_and_registers_nothing(case):
    declaration, reason = BAD[case]
    name = _module(f"team_bad_{uuid.uuid4().hex[:8]}", declaration)
    before = dict(TOOLS)
    try:
        with pytest.raises(ImproperlyConfigured) as raised:
            tools_load(["tools.sandbox_tools", name])
    finally:
        sys.modules.pop(name, None)
    assert f"refunds.create ({name}): {reason}" in str(raised.value)
    assert TOOLS == before  # not even the good modules of the same load


def test_a_tool_module_that_cannot_be_imported_is_named():
    before = dict(TOOLS)
    with pytest.raises(ImproperlyConfigured, match="tool module team.no_such_module: cannot be imported"):
        tools_load(["tools.sandbox_tools", "team.no_such_module"])
    assert TOOLS == before


@pytest.mark.processes
def test_a_worker_process_registers_the_modules_its_setting_names(demo_tx, processes, tmp_path):
    """Discovery from the setting, in a real worker process: the test process never registered them."""
    assert "payments.hold" not in TOOLS
    ledger = tmp_path / "payments.jsonl"
    wf = scripted_workflow(
        "pay-process",
        [{"tool": "payments.hold", "arguments": {"card": "card_1", "amount_cents": 5}}, {"final": {}}],
        tools=["payments.hold"],
    )
    run = run_start(workflow=wf.slug)
    processes.worker(
        WARDEN_TOOL_MODULES="tests.tools.team_tools",
        TEAM_PAYMENTS_KEY=CANARY,
        TEAM_PAYMENTS_EXPECTED_KEY=CANARY,
        TEAM_PAYMENTS_FILE=str(ledger),
    )
    wait_for(lambda: Run.objects.get(id=run.id).is_terminal, timeout=60, message="the run in the worker process")
    run.refresh_from_db()
    assert run.status == Run.Status.COMPLETED, run.status_reason
    assert [e["op"] for e in effects(ledger)] == ["hold"]


def test_an_installed_apps_warden_tools_module_is_found_without_a_setting(monkeypatch):
    """Django's autodiscovery idiom: an app with a ``warden_tools`` module brings its tools."""
    import types

    from tests.tools import discovered_app
    from tools import apps as tools_apps

    installed = list(tools_apps.apps.get_app_configs())
    extra = types.SimpleNamespace(name="tests.tools.discovered_app", module=discovered_app)
    monkeypatch.setattr(tools_apps.apps, "get_app_configs", lambda: [*installed, extra])
    found = tools_apps.discovered_modules()
    assert found == ["tests.tools.discovered_app.warden_tools"]
    before = dict(TOOLS)
    try:
        tools_load(["tools.sandbox_tools", *found])
        assert TOOLS["inventory.stock"].module == "tests.tools.discovered_app.warden_tools"
    finally:
        TOOLS.clear()
        TOOLS.update(before)
