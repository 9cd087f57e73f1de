"""The demo workflows of docs/scenarios.md: deploy-review (A) and incident-fanout (B), on scripted agents; and
ask-a-human, whose agent asks a person a question (human.ask) and reports the answer."""

from django.db import transaction

from .models import Agent, Workflow

SUMMARY_SCHEMA = {
    "type": "object",
    "required": ["summary"],
    "properties": {"summary": {"type": "string", "minLength": 1}},
}

WORKER_TURNS = [
    {"say": "Reading the customer's record.", "tool": "crm.read", "arguments": {"customer_id": "cust-{task}"}},
    {
        "say": "Opening a ticket.",
        "tool": "tickets.create",
        "arguments": {"customer_id": "cust-{task}", "title": "Incident follow-up for {last[name]}"},
    },
    {
        "say": "Recording the ticket on the customer.",
        "tool": "crm.update",
        "arguments": {"customer_id": "cust-{task}", "fields": {"incident_ticket": "{last[ticket_id]}"}},
    },
    {
        "say": "E-mailing the customer.",
        "tool": "email.send",
        "arguments": {
            "to": "{task}@customers.example",
            "subject": "About today's incident",
            "body": "We are on it; your ticket is open and we will write again when it is resolved.",
        },
    },
    {"final": {"summary": "{task}: ticket opened, record updated, customer e-mail {last[status]}"}},
]

AGENTS = [
    {
        "slug": "inventory-agent",
        "name": "Inventory",
        "allowed_tools": ["deployments.read"],
        "instructions": "Report what is deployed for the service.",
        "output_schema": SUMMARY_SCHEMA,
        "max_attempts": 2,
        "script": [
            {"say": "Reading the deployment.", "tool": "deployments.read", "arguments": {"service": "checkout"}},
            {"final": {"summary": "Deployment {last[service]}@{last[version]}: {last[pods]} pods in {last[region]}"}},
        ],
    },
    {
        "slug": "risk-agent",
        "name": "Risk review",
        "allowed_tools": [],
        "output_schema": SUMMARY_SCHEMA,
        "instructions": "Assess the deployment's risk.",
        "max_attempts": 2,
        "script": [
            {
                "fail": "transient",
                "on_attempts": [1],
                "message": "model timeout",
                "final": {"summary": "Risk review: backward-compatible schema; tested rollback available"},
            },
        ],
    },
    {
        "slug": "verifier-agent",
        "name": "Verifier",
        "allowed_tools": [],
        "max_attempts": 1,
        "instructions": "Give a verdict from the inventory and the risk review.",
        "output_schema": {
            "type": "object",
            "required": ["verdict", "decision"],
            "properties": {"verdict": {"type": "string"}, "decision": {"enum": ["approve", "reject"]}},
        },
        "script": [
            {"final": {"decision": "approve", "verdict": "APPROVE — {deps[inventory][summary]}; {deps[risk][summary]}"}}
        ],
    },
    {
        "slug": "incident-supervisor",
        "name": "Incident supervisor",
        "is_planner": True,
        "max_attempts": 2,
        "instructions": "Split the incident into one task per affected customer, then a summary.",
        "script": [
            {
                "final": {
                    "tasks": [
                        *(
                            {
                                "key": f"worker-{n}",
                                "agent": "incident-worker",
                                "objective": f"Handle the incident for customer {n}: read, ticket, update, e-mail",
                            }
                            for n in range(1, 6)
                        ),
                        {
                            "key": "summary",
                            "agent": "incident-summarizer",
                            "objective": "Summarise what the workers did",
                            "depends_on": [f"worker-{n}" for n in range(1, 6)],
                        },
                    ]
                }
            }
        ],
    },
    {
        "slug": "incident-worker",
        "name": "Incident worker",
        "max_attempts": 3,
        "output_schema": SUMMARY_SCHEMA,
        "allowed_tools": ["crm.read", "tickets.create", "crm.update", "email.send"],
        "instructions": "Handle the incident for one customer.",
        "script": WORKER_TURNS,
    },
    {
        "slug": "incident-summarizer",
        "name": "Incident summary",
        "max_attempts": 2,
        "output_schema": SUMMARY_SCHEMA,
        "instructions": "Summarise the workers' artifacts for the incident channel.",
        "script": [
            {
                "final": {
                    "summary": "Incident handled: " + "; ".join(f"{{deps[worker-{n}][summary]}}" for n in range(1, 6))
                }
            }
        ],
    },
    {
        "slug": "release-asker",
        "name": "Release asker",
        "max_attempts": 2,
        "output_schema": SUMMARY_SCHEMA,
        "allowed_tools": ["human.ask"],
        "instructions": "Ask a person which release window to use, then report it.",
        "script": [
            {
                "say": "I need a person to pick the release window.",
                "tool": "human.ask",
                "arguments": {
                    "question": "Which release window should the checkout deployment use?",
                    "choices": ["tonight", "tomorrow morning", "next week"],
                },
            },
            {"final": {"summary": "Release window chosen by a person: {last[answer]}"}},
        ],
    },
]

WORKFLOWS = [
    {
        "slug": "deploy-review",
        "name": "Deploy review",
        "default_goal": "Assess the checkout deployment",
        "description": "Inventory and risk in parallel, then a verifier's verdict (drill A: resume after a crash).",
        "planner": Workflow.Planner.STATIC,
        "tasks": [
            {"key": "inventory", "agent": "inventory-agent", "objective": "Read the checkout deployment"},
            {"key": "risk", "agent": "risk-agent", "objective": "Review the deployment's risk"},
            {
                "key": "verify",
                "agent": "verifier-agent",
                "objective": "Give the verdict",
                "depends_on": ["inventory", "risk"],
            },
        ],
        "default_budget": {"max_steps": 50, "max_tokens": 20_000, "max_cost_usd": 1.0},
    },
    {
        "slug": "incident-fanout",
        "name": "Incident fan-out",
        "default_goal": "Handle the checkout incident for the affected customers",
        "description": "A supervisor fans out to five workers with side-effecting tools, then summarises (drill B).",
        "planner": Workflow.Planner.AGENT,
        "planner_agent": "incident-supervisor",
        "agents": ["incident-worker", "incident-summarizer"],
        "max_concurrent_tasks": 5,
        "default_budget": {"max_steps": 200, "max_tokens": 200_000, "max_cost_usd": 5.0},
    },
    {
        "slug": "external-agent",
        "name": "External agent",
        "description": "A run of an agent that runs elsewhere (examples/external_agent.py): it reports its steps "
        "and sends each side effect through the ledger; refunds wait for a reviewer.",
        "default_goal": "Refund the customer's duplicate charge",
        "planner": Workflow.Planner.EXTERNAL,
        "tool_policies": {"payments.refund": {"approval": "always"}},
        "default_budget": {"max_steps": 100, "max_tokens": 100_000, "max_cost_usd": 2.0},
    },
    {
        "slug": "ask-a-human",
        "name": "Ask a human",
        "default_goal": "Pick the checkout release window",
        "description": "An agent asks a person a question with choices (human.ask), waits without a worker, and "
        "reports the answer; unanswered after a day, the agent is told so.",
        "planner": Workflow.Planner.STATIC,
        "tasks": [{"key": "ask", "agent": "release-asker", "objective": "Ask which release window to use"}],
        "tool_policies": {"human.ask": {"on_timeout": "tell_agent", "expires_after": 24 * 3600}},
        "default_budget": {"max_steps": 20, "max_tokens": 20_000, "max_cost_usd": 1.0},
    },
]


@transaction.atomic
def load_demo_workflows() -> None:
    """Create or update the demo agents and workflows (idempotent)."""
    for spec in AGENTS:
        Agent.objects.update_or_create(slug=spec["slug"], defaults={k: v for k, v in spec.items() if k != "slug"})
    for spec in WORKFLOWS:
        values = {k: v for k, v in spec.items() if k != "slug"}
        if "planner_agent" in values:
            values["planner_agent"] = Agent.objects.get(slug=values["planner_agent"])
        Workflow.objects.update_or_create(slug=spec["slug"], defaults=values)
