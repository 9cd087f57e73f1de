"""HTTP tools declared in the admin, called against a real payments service on 127.0.0.1
(examples/refunds/payments_service.py): checked on save, gated and approved like any tool, given their
credential by name (never shown), sent with the run's idempotency key, reconciled by their lookup when
the answer is lost or late, undone by the tool they name, and nobody else's project's."""

import html
import http.server
import json
import logging
import uuid

import pytest
from django.apps import apps
from django.test import override_settings

from agents.providers import tool_functions
from examples.refunds import payments_service
from examples.refunds.payments_service import PaymentsService
from policy.models import ApprovalPolicy, ApprovalRequest
from runs.models import Run
from runs.services import run_start
from saga.compensation import run_compensate
from tenancy.access import default_project, membership_grant
from tenancy.models import Project
from tests.conftest import decide, wait_for
from tests.local_http import serve
from tests.runs.test_engine import finished, scripted_workflow
from tools.catalog import tool_spec
from tools.http_tools import http_tool_problems, http_tool_spec
from tools.models import HttpTool, ToolOperation

OS = ToolOperation.Status
CANARY = f"pay-{uuid.uuid4().hex}"
REFUND_SCHEMA = {
    "type": "object",
    "properties": {
        "charge_id": {"type": "string", "pattern": "^ch_[0-9]+$"},
        "amount_cents": {"type": "integer", "minimum": 1},
        "reason": {"type": "string", "maxLength": 200},
    },
    "required": ["charge_id", "amount_cents"],
    "additionalProperties": False,
}


@pytest.fixture
def payments(monkeypatch, settings):
    monkeypatch.setenv("PAYMENTS_API_KEY", CANARY)
    # The deployment grants the key to the project whose tools name it (docs/tools.md, "Secrets").
    settings.WARDEN = {**settings.WARDEN, "SECRET_GRANTS": {"PAYMENTS_API_KEY": ["default"]}}
    service = PaymentsService(api_key=CANARY).start()
    yield service
    service.stop()


def declared(service, project=None, **fields) -> dict:
    """The refund's fields as a project admin declares it."""
    return {
        "project": project or default_project(),
        "name": "payments.refund",
        "description": "Refund part or all of a card charge",
        "method": "POST",
        "url": service.url + "/v1/charges/{charge_id}/refunds",
        "arguments_schema": REFUND_SCHEMA,
        "tool_class": "non_idempotent_write",
        "reversibility": "irreversible",
        "headers": {"Authorization": "Bearer {secret:PAYMENTS_API_KEY}"},
        "idempotency_header": "Idempotency-Key",
        "lookup_url": service.url + "/v1/refunds/by-key/{key}",
        "external_id": "refund_id",
        **fields,
    }


def declare(service, project=None, **fields) -> HttpTool:
    """The refund as a project admin declares it (checked as the admin checks it)."""
    row = HttpTool(**declared(service, project, **fields))
    assert http_tool_problems(row) == []
    row.save()
    return row


def waive(tool: str, project=None) -> ApprovalPolicy:
    """The project's explicit word that this irreversible tool's calls leave without a reviewer."""
    return ApprovalPolicy.objects.create(
        name=f"{tool} unattended", effect="waive", project=project or default_project(), tool=tool
    )


def refund_run(reason: str, *, slug: str | None = None, then_fail: bool = False, tools=("payments.refund",)):
    wf = scripted_workflow(
        slug or f"refund-{reason}-{uuid.uuid4().hex[:6]}",
        [
            {"tool": "payments.refund", "arguments": {"charge_id": "ch_1001", "amount_cents": 2500, "reason": reason}},
            {"final": {"answer": "{last}"}},
        ],
        tools=list(tools),
        output_schema={"type": "object", "required": ["order"]} if then_fail else None,
        max_attempts=3,
    )
    return wf


def no_canary_anywhere(caplog) -> None:
    for model in apps.get_models():
        assert CANARY not in json.dumps(list(model._default_manager.values()), default=str), model.__name__
    assert CANARY not in caplog.text


# --- declarations -----------------------------------------------------------------------------------


def admin_form(service) -> dict:
    """The refund as the admin's add form posts it."""
    return {
        "project": default_project().id,
        "name": "payments.refund",
        "method": "POST",
        "url": service.url + "/v1/charges/{charge_id}/refunds",
        "arguments_schema": json.dumps(REFUND_SCHEMA),
        "tool_class": "non_idempotent_write",
        "reversibility": "irreversible",
        "headers": json.dumps({"Authorization": "Bearer {secret:PAYMENTS_API_KEY}"}),
        "idempotency_header": "Idempotency-Key",
        "undo": "{}",
        "timeout_seconds": "5",
        "enabled": "on",
    }


BAD = [
    ({"tool_class": "sometimes_write"}, "tool_class", "Select a valid choice"),
    ({"undo": {"tool": "payments.unrefund", "arguments": {}}}, "undo", "not registered"),
    ({"url": "http://10.1.2.3/v1/charges/{charge_id}/refunds"}, "url", "host must be one this deployment allows"),
    ({"url": "http://{charge_id}.example/refunds"}, "url", "only in the path or the query"),
    # Set or not, a secret the project was not granted reads the same (no oracle of the environment).
    (
        {"headers": {"Authorization": "Bearer {secret:NOT_SET_ANYWHERE}"}},
        "headers",
        "the secret NOT_SET_ANYWHERE is not granted to project default",
    ),
    (
        {"headers": {"Authorization": "Bearer {secret:DJANGO_SECRET_KEY}"}},
        "headers",
        "DJANGO_SECRET_KEY is one of Warden's own settings",
    ),
    ({"headers": {"Host": "payments-admin.internal"}}, "headers", "Host: a header Warden sets itself"),
    ({"idempotency_header": "Content-Length"}, "idempotency_header", "Content-Length: a header Warden sets itself"),
    ({"headers": {"X-Charge": "{charge_id}"}}, "headers", "only {secret:NAME} placeholders"),
    ({"arguments_schema": {"type": "object", "properties": {"x": {"type": "nope"}}}}, "arguments_schema", "valid"),
    ({"name": "Refund!"}, "name", "system.operation"),
    ({"reversibility": ""}, "reversibility", "reversible or irreversible"),
    ({"idempotency_header": "", "tool_class": "idempotent_write", "method": "PUT"}, "idempotency_header", "deduplic"),
    # A class below what the method says is refused (issue 25, finding 6): a POST is never a read.
    ({"tool_class": "read_only", "reversibility": ""}, "tool_class", "a POST request is at least a non idempotent"),
    ({"tool_class": "idempotent_write"}, "tool_class", "a POST request is at least a non idempotent write"),
    ({"method": "PATCH", "tool_class": "idempotent_write"}, "tool_class", "a PATCH request is at least"),
    ({"method": "DELETE", "tool_class": "read_only", "reversibility": ""}, "tool_class", "a DELETE request is"),
    ({"reversibility": "reversible"}, "reversibility", "names the tool that undoes it"),
    ({"name": "email.send"}, "name", "registry"),
    # A write's example answer is a replay's stand-in (docs/replay.md): an object, and never a read's.
    ({"example_answer": "[1, 2]"}, "example_answer", "an object, as the service's answer is"),
    (
        {"method": "GET", "tool_class": "read_only", "reversibility": "", "example_answer": {"id": "x"}},
        "example_answer",
        "a read has none",
    ),
    ({"repeatable": "on"}, "repeatable", "only a read (GET or HEAD, read only) may be sent again"),
]


@pytest.mark.parametrize("change,field,message", BAD, ids=[b[1] + ":" + b[2][:20] for b in BAD])
def test_a_bad_declaration_gets_a_clear_error_in_the_admin_and_saves_nothing(
    admin_client, payments, change, field, message
):
    data = admin_form(payments)
    data.update({k: json.dumps(v) if isinstance(v, dict) else v for k, v in change.items()})
    response = admin_client.post("/admin/tools/httptool/add/", data)
    assert response.status_code == 200  # the form again, with the reason
    assert message in html.unescape(response.content.decode()), response.content.decode()[:3000]
    assert not HttpTool.objects.exists()


NULL = [
    ("undo", "null", "an object, or {} for none"),
    ("undo", "[]", "an object, or {} for none"),
    ("headers", "null", "an object, or {} for none"),
    ("arguments_schema", "null", "This field is required."),
]


@pytest.mark.parametrize("field,posted,message", NULL, ids=[f"{n[0]}={n[1]}" for n in NULL])
def test_a_json_field_left_null_is_a_form_error_on_that_field_and_saves_nothing(
    admin_client, payments, field, posted, message
):
    response = admin_client.post("/admin/tools/httptool/add/", {**admin_form(payments), field: posted})
    assert response.status_code == 200  # the form again, the reason under the field
    assert response.context["adminform"].form.errors == {field: [message]}
    assert not HttpTool.objects.exists()
    assert not apps.get_model("tenancy", "AuditEvent").objects.filter(action="admin:add").exists()


def test_undo_null_is_refused_by_the_declarations_check_too(db, payments):
    """The check a script runs (examples/refunds/setup_refunds.py) says what the form says."""
    assert ("undo", "an object, or {} for none") in http_tool_problems(HttpTool(**{**declared(payments), "undo": None}))


def test_a_good_declaration_saves_from_the_admin_and_is_audited(admin_client, payments):
    data = admin_form(payments)
    response = admin_client.post("/admin/tools/httptool/add/", data)
    assert response.status_code == 302, response.content.decode()[:2000]
    spec = tool_spec("payments.refund", default_project().id)
    assert spec.kind == "http" and spec.secrets == ("PAYMENTS_API_KEY",) and spec.is_write
    assert CANARY not in json.dumps(list(HttpTool.objects.values()), default=str)  # named, never stored
    assert apps.get_model("tenancy", "AuditEvent").objects.filter(action="admin:add").exists()


# --- calls ------------------------------------------------------------------------------------------


def test_an_irreversible_refund_waits_for_a_reviewer_and_goes_out_once_with_key_and_credential(
    demo_tx, worker, payments, django_user_model, caplog
):
    caplog.set_level(logging.DEBUG)
    declare(payments)
    ApprovalPolicy.objects.create(name="refunds", tool="payments.refund")
    reviewer = django_user_model.objects.create_user(username="rita", password="x-pass-123456")
    membership_grant(user=reviewer, project=default_project(), role="reviewer")
    run = run_start(workflow=refund_run("damaged").slug)
    wait_for(lambda: ApprovalRequest.objects.filter(run=run).exists(), message="the refund's approval request")
    assert payments.effects == []  # nothing left before the yes
    decide(request_id=ApprovalRequest.objects.get(run=run).id, user=reviewer, approve=True)
    run = finished(run)
    assert run.status == Run.Status.COMPLETED, run.status_reason
    [refund] = payments.effects
    op = ToolOperation.objects.get(run=run, tool="payments.refund")
    assert (op.status, op.external_id, refund["key"]) == (OS.COMMITTED, refund["refund_id"], op.idempotency_key)
    assert op.approval_id and op.verdict["classified_by"] == "http"
    no_canary_anywhere(caplog)  # the service checked the credential; nothing of Warden's holds it


def test_a_lost_answer_is_reconciled_by_the_lookup_and_not_sent_again(demo_tx, worker, payments):
    declare(payments)
    waive("payments.refund")
    run = finished(run_start(workflow=refund_run("lost").slug))
    assert run.status == Run.Status.COMPLETED, run.status_reason
    assert len(payments.effects) == 1
    op = ToolOperation.objects.get(run=run, tool="payments.refund")
    assert op.status == OS.COMMITTED and "reconciled" in op.status_reason
    assert op.result["refund_id"] == payments.effects[0]["refund_id"]


def test_a_call_past_its_deadline_is_cut_off_and_reconciled_by_key(demo_tx, worker, payments):
    declare(payments, timeout_seconds=1)
    waive("payments.refund")
    run = finished(run_start(workflow=refund_run("slow").slug), timeout=40)
    assert run.status == Run.Status.COMPLETED, run.status_reason
    wait_for(lambda: len(payments.requests) >= 2, message="the lookup")
    assert len(payments.effects) == 1  # cut off at 1 s and found by its key: never refunded twice
    op = ToolOperation.objects.get(run=run, tool="payments.refund")
    assert op.status == OS.COMMITTED and "reconciled" in op.status_reason
    assert {r["key"] for r in payments.requests if r["method"] == "POST"} == {op.idempotency_key}


def test_a_reversible_http_write_is_undone_by_the_http_tool_it_names(demo_tx, worker, payments):
    void = {"type": "object", "properties": {"refund_id": {"type": "string"}}, "required": ["refund_id"]}
    declare(payments, name="payments.void", url=payments.url + "/v1/refunds/{refund_id}/void",
            arguments_schema=void, lookup_url="", idempotency_header="", tool_class="non_idempotent_write",
            reversibility="irreversible", external_id="")  # fmt: skip
    declare(
        payments,
        reversibility="reversible",
        undo={"tool": "payments.void", "arguments": {"refund_id": "result.refund_id"}},
    )
    run = finished(run_start(workflow=refund_run("pending", then_fail=True).slug))
    assert run.status == Run.Status.NEEDS_ATTENTION, run.status_reason  # its output was invalid: undo the refund
    run_compensate(run_id=run.id, reason="the order stands")
    wait_for(lambda: Run.objects.get(id=run.id).status == Run.Status.COMPENSATED, message="the compensation")
    assert [e["effect"] for e in payments.effects] == ["refund", "void"]
    assert payments.effects[1]["refund_id"] == payments.effects[0]["refund_id"]


def test_a_service_that_echoes_its_credential_does_not_show_it(demo_tx, worker, payments, caplog, client):
    caplog.set_level(logging.DEBUG)
    declare(payments)
    waive("payments.refund")
    run = finished(run_start(workflow=refund_run("echo").slug))
    assert run.status == Run.Status.COMPLETED, run.status_reason
    op = ToolOperation.objects.get(run=run, tool="payments.refund")
    assert op.result["debug"]["authorization"] == "Bearer [secret]"
    no_canary_anywhere(caplog)


def test_another_projects_run_finds_no_such_tool(demo_tx, worker, payments):
    declare(payments)
    other = Project.objects.create(slug="elsewhere", name="Elsewhere")
    wf = refund_run("damaged")
    wf.project = other
    wf.save()
    run = finished(run_start(workflow=wf.slug))
    assert payments.requests == [] and not ToolOperation.objects.filter(run=run).exists()
    assert run.project_id == other.id


def test_a_host_no_longer_allowed_is_refused_at_the_call(demo_tx, worker, payments):
    declare(payments)
    waive("payments.refund")
    with override_settings(WARDEN={**__import__("django.conf").conf.settings.WARDEN, "HTTP_TOOL_HOSTS": ["x.invalid"]}):
        run = finished(run_start(workflow=refund_run("damaged").slug))
    assert payments.requests == []
    op = ToolOperation.objects.get(run=run, tool="payments.refund")
    assert op.status == OS.FAILED and "no longer allowed" in op.status_reason


def test_bad_arguments_from_the_model_are_refused_with_the_field_and_call_nothing(demo_tx, worker, payments):
    declare(payments)
    wf = scripted_workflow(
        "refund-bad-args",
        [
            {"tool": "payments.refund", "arguments": {"charge_id": "nope", "amount_cents": -5, "extra": 1}},
            {"final": {"error": "{last}"}},
        ],
        tools=["payments.refund"],
    )
    run = finished(run_start(workflow=wf.slug))
    assert payments.requests == [] and not ToolOperation.objects.filter(run=run).exists()
    assert payments_service.CHARGES  # the service is untouched


def test_a_tool_without_a_description_is_described_to_the_model_by_its_name_only(payments, db):
    row = declare(payments, description="")
    [function] = tool_functions([row.name], row.project_id)
    assert function["function"]["description"] == "payments.refund"
    assert payments.url not in json.dumps(function) and "POST" not in json.dumps(function)


def test_a_cookie_one_call_was_given_is_never_sent_with_another():
    """HTTP tools share one client per process (tools/http_tools.py): a cookie a service sets must not ride
    along with the next call, which may be another project's tool calling the same host."""
    seen = []

    class Service(http.server.BaseHTTPRequestHandler):
        def do_POST(self):  # noqa: N802
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            seen.append(self.headers.get("Cookie"))
            self.send_response(200)
            self.send_header("Set-Cookie", "session=project-a-secret; Path=/")
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", "2")
            self.end_headers()
            self.wfile.write(b"{}")

        def log_message(self, *args):
            pass

    httpd, url = serve(Service)
    try:
        for project_id in (1, 2):
            row = HttpTool(name="crm.note", method="POST", url=f"{url}/note", project_id=project_id,
                           tool_class="idempotent_write", reversibility="irreversible", headers={})  # fmt: skip
            http_tool_spec(row).execute({"text": "hi"}, key=f"k{project_id}", deadline=5, secrets={})
    finally:
        httpd.shutdown()
    assert seen == [None, None]
