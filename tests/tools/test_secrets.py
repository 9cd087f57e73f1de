"""A canary secret in a tool's secret argument (``tickets.create``'s ``api_key``) reaches the ticket tracker
and nothing else: not the spans or payloads, the ledger, the sandbox's call log, approval summaries, logs,
API responses or admin pages. Only ``SealedArguments`` holds it, so that a retried, resumed or supervised
call can still hand the real value to the system."""

import dataclasses
import json
import logging
import threading
import uuid

import pytest
from django.apps import apps
from django.urls import reverse

from policy.models import ApprovalRequest
from runs.models import Payload, Run, Span, Task
from runs.services import run_start
from tenancy.tokens import api_token_create
from tests.conftest import decide
from tests.runs.test_engine import finished, scripted_workflow
from tests.tools.test_ledger import stopped
from tools.installation import run_key_prefix
from tools.models import SandboxCall, SandboxTicket, SealedArguments, ToolOperation
from tools.registry import REDACTED, TOOLS

# Unique per session, so a hit can only come from this test's call.
CANARY = f"canary-{uuid.uuid4().hex}"
ARGUMENTS = {"customer_id": "c1", "title": "t", "api_key": CANARY}
# Where the canary may live: the sealed values, and the scripted agent's script (and the agent's version
# that keeps it), which stands for the model's own output (a real model's output is not stored anywhere
# but the journal).
ALLOWED = {SealedArguments, apps.get_model("agents", "Agent"), apps.get_model("agents", "AgentVersion")}


@pytest.fixture
def tracker_keys(monkeypatch):
    """The api_key values the ticket tracker received: redaction must not starve the system itself."""
    seen, lock = [], threading.Lock()
    spec = TOOLS["tickets.create"]
    execute = spec.execute

    def recording(arguments, **kwargs):
        with lock:
            seen.append(arguments.get("api_key"))
        return execute(arguments, **kwargs)

    monkeypatch.setitem(TOOLS, "tickets.create", dataclasses.replace(spec, execute=recording))
    return seen


@pytest.fixture
def logs(caplog):
    caplog.set_level(logging.DEBUG)
    caplog.set_level(logging.DEBUG, logger="warden")
    return caplog


def _rows(model) -> str:
    return json.dumps(list(model._default_manager.values()), default=str)


def _secret_workflow(path: str):
    wf = scripted_workflow(
        f"secret-{path}",
        [{"tool": "tickets.create", "arguments": ARGUMENTS}, {"final": {"outcome": "{last[status]}"}}],
        tools=["tickets.create"],
    )
    if path == "gated":
        wf.tool_policies = {"tickets.create": {"approval": "always"}}
        wf.save()
    return wf


def _run(path: str, operator) -> Run:
    """Drive the run along one of the paths a secret argument takes to the tracker."""
    wf = _secret_workflow(path)
    run_input = {
        "direct": {},
        # The first call fails before the tracker changes anything; the retry replays the journal, whose
        # tool call is redacted, so the broker must unseal it.
        "retried": {"faults": [{"task": "only", "call": 1, "mode": "transient"}]},
        # The supervisor executes the proposal after approval, from the (redacted) ledger row.
        "proposed": {"propose_tools": ["tickets.create"]},
        "gated": {},  # the task parks; after approval it resumes from the journal
    }[path]
    run = run_start(workflow=wf.slug, input=run_input)
    if path in ("proposed", "gated"):
        run = stopped(run, {Run.Status.WAITING_FOR_APPROVAL, Run.Status.NEEDS_ATTENTION, Run.Status.COMPLETED})
        assert run.status == Run.Status.WAITING_FOR_APPROVAL, run.status_reason
        decide(request_id=ApprovalRequest.objects.get(run=run, parent=None).id, user=operator, approve=True)
    return finished(run)


@pytest.mark.parametrize("path", ["direct", "retried", "proposed", "gated"])
def test_a_secret_argument_reaches_the_tracker_and_nothing_else(
    demo_tx, worker, operator, django_user_model, client, logs, tracker_keys, path
):
    run = _run(path, operator)
    assert run.status == Run.Status.COMPLETED, run.status_reason

    # The call worked, once, and the tracker was given the real credential every time it was called.
    ticket = SandboxTicket.objects.get(idempotency_key__startswith=f"{run_key_prefix(run.id)}only:")
    assert (ticket.customer_id, ticket.title) == ("c1", "t")
    assert tracker_keys and set(tracker_keys) == {CANARY}, tracker_keys
    assert len(tracker_keys) == (2 if path == "retried" else 1)
    assert SealedArguments.objects.get().values == {"api_key": CANARY}  # the secret did flow through

    op = ToolOperation.objects.get(run=run, tool="tickets.create")
    assert op.status == ToolOperation.Status.COMMITTED
    # sealed under the step the broker and the saga unseal with: the tool call's, as on the ledger row
    assert SealedArguments.objects.get().step == op.step

    # Every surface is searched before anything is asserted, so a failure names all the leaks at once.
    leaks = []

    # No stored row, in any column of any table, holds the canary: spans and payloads, the ledger, the
    # sandbox's call log, approval summaries, and every other table too.
    assert {Span, Payload, ToolOperation, SandboxCall, ApprovalRequest} <= set(apps.get_models())
    leaks += [f"table {m._meta.label}" for m in apps.get_models() if m not in ALLOWED and CANARY in _rows(m)]

    # Nor any log record (message, arguments or traceback).
    assert logs.records, "no log records were captured: the check would prove nothing"
    if CANARY in logs.text or any(CANARY in r.getMessage() or CANARY in repr(r.__dict__) for r in logs.records):
        leaks.append("logs")

    # Nor any API response.
    admin = django_user_model.objects.create_superuser(username="root", password="root-pass-123", email="r@x.y")
    bearer = {"HTTP_AUTHORIZATION": f"Bearer {api_token_create(user=admin)[1]}"}
    for url in [
        f"/runs/{run.id}",
        f"/runs/{run.id}/operations",
        f"/runs/{run.id}/compensation",
        f"/approvals?status=approved&run={run.id}",
        "/sandbox/effects",
    ]:
        response = client.get(f"/api/v1{url}", **bearer)
        assert response.status_code == 200, (url, response.content)
        if CANARY in response.content.decode():
            leaks.append(f"API {url}")

    # Nor any admin page: the lists and every row's page.
    client.force_login(admin)
    pages = []
    for model, rows in [
        (Span, Span.objects.filter(run=run)),
        (Payload, Payload.objects.all()),
        (ToolOperation, ToolOperation.objects.filter(run=run)),
        (SandboxCall, SandboxCall.objects.all()),
        (SealedArguments, SealedArguments.objects.all()),
        (ApprovalRequest, ApprovalRequest.objects.filter(run=run)),
        (Run, Run.objects.filter(id=run.id)),
        (Task, Task.objects.filter(run=run)),
    ]:
        meta = model._meta
        pages.append(reverse(f"admin:{meta.app_label}_{meta.model_name}_changelist"))
        pages += [
            reverse(f"admin:{meta.app_label}_{meta.model_name}_change", args=[pk])
            for pk in rows.values_list("pk", flat=True)
        ]
    for url in pages:
        page = client.get(url)
        assert page.status_code == 200, url
        if CANARY in page.content.decode():
            leaks.append(f"admin {url}")

    assert not leaks, f"the canary leaked to: {leaks}"

    # Where the arguments are shown, the secret field is there, as the marker.
    assert op.arguments == {**ARGUMENTS, "api_key": REDACTED}
    assert SandboxCall.objects.get(tool="tickets.create", is_effect=True).arguments["api_key"] == REDACTED
    journal = Span.objects.get(run=run, kind=Span.Kind.MODEL_CALL, step=1)
    assert journal.body["tool_call"]["arguments"]["api_key"] == REDACTED
    operations = client.get(f"/api/v1/runs/{run.id}/operations", **bearer).json()
    assert [o["arguments"]["api_key"] for o in operations if o["tool"] == "tickets.create"] == [REDACTED]
    if path in ("proposed", "gated"):
        summary = ApprovalRequest.objects.get(run=run, parent=None).summary
        assert "tickets.create" in summary and REDACTED in summary, summary
    # The sealed values' own admin page says which fields are secret, and nothing more.
    sealed = client.get(reverse("admin:tools_sealedarguments_change", args=[SealedArguments.objects.get().pk]))
    assert "api_key" in sealed.content.decode()
