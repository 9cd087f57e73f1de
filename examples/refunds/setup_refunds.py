"""Declares the refunds example in Warden (examples/refunds/README.md): two HTTP tools on the local
payments service, the ticketing MCP server, an agent, a workflow, and the approval policy that holds
every refund for a reviewer.

    .venv/bin/python -m examples.refunds.setup_refunds [--payments-url http://127.0.0.1:8701]

It uses the same checks as the admin (a bad declaration stops it with the reason) and may be run again:
it updates what it declared before."""

import argparse
import os

CHARGE_SCHEMA = {
    "type": "object",
    "properties": {"charge_id": {"type": "string", "pattern": "^ch_[0-9]+$"}},
    "required": ["charge_id"],
    "additionalProperties": False,
}
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
# A scripted agent, so that the example needs no model provider: read the charge, open a ticket, refund,
# 25.00. Point the agent at a real provider in the admin to let a model decide instead.
SCRIPT = [
    {"tool": "payments.get_charge", "arguments": {"charge_id": "{input[charge_id]}"}},
    {"tool": "helpdesk.create_ticket", "arguments": {"title": "Refund {input[charge_id]}", "body": "{input[why]}"}},
    {
        "tool": "payments.refund",
        "arguments": {"charge_id": "{input[charge_id]}", "amount_cents": 2500, "reason": "{input[why]}"},
    },
    {"final": {"refund": "{last}"}},
]
TOOLS = ["payments.get_charge", "payments.refund", "helpdesk.create_ticket", "helpdesk.add_comment"]


class SetupFailed(Exception):
    pass


def _http_tool(project, payments_url: str, **fields):
    from tools.http_tools import http_tool_problems
    from tools.models import HttpTool

    row = HttpTool.objects.filter(project=project, name=fields["name"]).first() or HttpTool(project=project)
    for name, value in fields.items():
        setattr(row, name, value.replace("{base}", payments_url) if isinstance(value, str) else value)
    problems = http_tool_problems(row)
    if problems:
        raise SetupFailed(f"{row.name}: " + "; ".join(f"{f}: {m}" for f, m in problems))
    row.save()
    return row


def _mcp_server(project, command: str):
    from tools.mcp_tools import McpRefused, McpUnreachable, mcp_listing_problems, mcp_server_list, mcp_tools_store
    from tools.models import McpServer

    server = McpServer.objects.filter(project=project, name="helpdesk").first() or McpServer(project=project)
    server.name, server.transport, server.command, server.timeout_seconds = "helpdesk", "stdio", command, 30
    try:
        listed = mcp_server_list(server=server, user=None)  # checked, listed and audited as the admin does
    except McpRefused as exc:
        raise SetupFailed(f"helpdesk: {exc}") from None
    except McpUnreachable as exc:
        raise SetupFailed(f"helpdesk: {exc}") from None
    problems = mcp_listing_problems(server, listed)
    if problems:
        raise SetupFailed("helpdesk: " + "; ".join(f"{f}: {m}" for f, m in problems))
    server.save()
    mcp_tools_store(server, listed)
    return server


def refunds_setup(*, payments_url: str, mcp_command: str = "refunds-tickets", project=None) -> dict:
    """Declare everything; returns the names of what it declared."""
    from agents.models import Agent, Workflow
    from policy.models import ApprovalPolicy
    from tenancy.access import default_project
    from tools.models import ToolClassification

    project = project or default_project()
    _http_tool(project, payments_url, name="payments.get_charge", method="GET", url="{base}/v1/charges/{charge_id}",
               arguments_schema=CHARGE_SCHEMA, tool_class="read_only", reversibility="",
               headers={"Authorization": "Bearer {secret:PAYMENTS_API_KEY}"},
               description="A card charge: its amount and how much was refunded")  # fmt: skip
    _http_tool(project, payments_url, name="payments.refund", method="POST",
               url="{base}/v1/charges/{charge_id}/refunds", arguments_schema=REFUND_SCHEMA,
               tool_class="non_idempotent_write", reversibility="irreversible",
               headers={"Authorization": "Bearer {secret:PAYMENTS_API_KEY}"},
               idempotency_header="Idempotency-Key", lookup_url="{base}/v1/refunds/by-key/{key}",
               external_id="refund_id", description="Refund part or all of a card charge")  # fmt: skip
    _mcp_server(project, mcp_command)
    # The MCP server's tools are unclassified until the project confirms a class (their annotations are
    # only the server's suggestion). Opening a ticket is an irreversible write, which waits for a person
    # by default: the project says here that tickets open unattended, so that only the refund waits.
    for tool, tool_class in (("helpdesk.create_ticket", "non_idempotent_write"), ("helpdesk.search_tickets",
                                                                                  "read_only")):  # fmt: skip
        reversibility = "" if tool_class == "read_only" else "irreversible"
        ToolClassification.objects.update_or_create(
            project=project, tool=tool, defaults={"tool_class": tool_class, "reversibility": reversibility}
        )
    ApprovalPolicy.objects.update_or_create(
        name="tickets open without a reviewer",
        project=project,
        defaults={"effect": "waive", "tool": "helpdesk.create_ticket"},
    )
    agent, _ = Agent.objects.update_or_create(
        slug="refund-agent",
        defaults={"name": "Refund agent", "allowed_tools": TOOLS, "script": SCRIPT, "provider": "scripted",
                  "instructions": "Check the charge, open a ticket, then refund what the customer asked for."},
    )  # fmt: skip
    Workflow.objects.update_or_create(
        slug="refund-request",
        defaults={"name": "Refund request", "project": project,
                  "tasks": [{"key": "refund", "agent": agent.slug, "objective": "Refund the charge in the input"}]},
    )  # fmt: skip
    ApprovalPolicy.objects.update_or_create(
        name="every refund waits for a reviewer", defaults={"tool": "payments.refund"}
    )
    return {"tools": TOOLS, "agent": agent.slug, "workflow": "refund-request"}


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--payments-url", default="http://127.0.0.1:8701")
    parser.add_argument("--mcp-command", default="refunds-tickets")
    options = parser.parse_args()
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings.base")
    import django

    django.setup()
    try:
        declared = refunds_setup(payments_url=options.payments_url, mcp_command=options.mcp_command)
    except SetupFailed as exc:
        raise SystemExit(f"the refunds example cannot be declared: {exc}") from None
    print(f"declared {', '.join(declared['tools'])}; start the workflow {declared['workflow']!r}")
