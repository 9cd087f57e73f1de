"""The demo's evaluation suite (setup_demo)."""

from django.db import transaction

from agents.demo import AGENTS
from agents.models import Agent, ModelVersion, Workflow
from tenancy.access import default_project

from .models import EvalCase, EvalSuite

# The demo's suite (setup_demo): three reference tasks on deploy-review, and a stricter verifier to compare.
STRICT_VERIFIER = {
    "verifier-agent": {
        "script": [
            {"say": "Looking again at the rollback plan, step by step, before any verdict is given. " * 4},
            {"final": {"decision": "reject", "verdict": "REJECT — no canary; {deps[risk][summary]}"}},
        ]
    }
}


@transaction.atomic
def demo_suite_load() -> EvalSuite:
    """Idempotent, like the demo workflows it uses (load those first)."""

    ModelVersion.objects.update_or_create(
        slug="strict-verifier",
        defaults={"name": "A stricter verifier (rejects without a canary)", "overrides": STRICT_VERIFIER},
    )
    suite, _ = EvalSuite.objects.update_or_create(
        slug="deploy-reviews",
        defaults={
            "name": "Deploy reviews",
            "project": default_project(),
            "description": "Does a change to the verifier still approve a safe deploy, in as few steps and as cheaply?",
        },
    )
    review = Workflow.objects.get(slug="deploy-review")
    solo = _solo_review_load()
    cases = [
        ("approves a safe deploy", [{"status": "completed"}, {"artifact": "verify", "contains": "APPROVE"}]),
        ("finishes within 12 steps", [{"status": "completed"}, {"max_steps": 12}]),
        ("stays cheap", [{"max_cost_usd": 0.05}]),
    ]
    for name, checks in cases:
        EvalCase.objects.update_or_create(
            suite=suite, name=name, defaults={"workflow": review, "baseline_workflow": solo, "checks": checks}
        )
    return suite


def _solo_review_load():
    """deploy-review done by one agent (reads, weighs the risk and decides in one task): the baseline."""

    verifier = next(spec for spec in AGENTS if spec["slug"] == "verifier-agent")
    Agent.objects.update_or_create(
        slug="solo-reviewer",
        defaults={
            "name": "Solo reviewer",
            "instructions": "Read the deployment, weigh its risk and give the verdict, alone.",
            "allowed_tools": ["deployments.read"],
            "output_schema": verifier["output_schema"],
            "max_attempts": 2,
            "script": [
                {"say": "Reading the deployment.", "tool": "deployments.read", "arguments": {"service": "checkout"}},
                {"say": "Weighing the risk: backward-compatible schema, tested rollback."},
                {
                    "final": {
                        "decision": "approve",
                        "verdict": "APPROVE — Deployment {last[service]}@{last[version]}; rollback tested",
                    }
                },
            ],
        },
    )
    workflow, _ = Workflow.objects.update_or_create(
        slug="deploy-review-solo",
        defaults={
            "name": "Deploy review, one agent",
            "description": "deploy-review by a single agent: the baseline its three agents are compared with.",
            "default_goal": "Assess the checkout deployment",
            "planner": Workflow.Planner.STATIC,
            "tasks": [
                {"key": "verify", "agent": "solo-reviewer", "objective": "Review the deployment, give the verdict"}
            ],
            "default_budget": {"max_steps": 50, "max_tokens": 20_000, "max_cost_usd": 1.0},
        },
    )
    return workflow
