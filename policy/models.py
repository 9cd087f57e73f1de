"""The rules of a decision: approval policies and waivers, allow rules, approval requests and the
reviewers' decisions on them. Below the broker and the engine, which create requests directly; the
approvals app above does the reviewer's work (deciding, questions, notifications, links, expiry).

The tables keep the names they had in the approvals app (``Meta.db_table``), with their rows."""

from django.conf import settings
from django.db import models

from core import bus
from tenancy.models import Project


class ApprovalRequest(models.Model):
    """A human decision the engine waits for: one tool operation, a bundle of proposals, or the
    corrections of a compensation. (Policies, the reviewer queue and separation of duties build on it.)"""

    class Kind(models.TextChoices):
        OPERATION = "operation", "One tool call"
        BUNDLE = "bundle", "Proposed operations, executed together"
        CORRECTION = "correction", "Correction actions of a compensation"
        PLAN = "plan", "A planner's plan, before its tasks start"

    class Status(models.TextChoices):
        PENDING = "pending"
        APPROVED = "approved"
        REJECTED = "rejected"
        WITHDRAWN = "withdrawn"  # its run moved on (compensated, cancelled) before anyone decided
        EXPIRED = "expired"  # nobody decided in time (its policy rejected it)

    run = models.ForeignKey("runs.Run", on_delete=models.CASCADE, related_name="approvals")
    task = models.ForeignKey("runs.Task", null=True, blank=True, on_delete=models.CASCADE, related_name="+")
    # A bundle (or a compensation's corrections) is a parent; each of its operations is an item of its
    # own, which can be decided alone. Deciding the parent decides every item still pending.
    parent = models.ForeignKey("self", null=True, blank=True, on_delete=models.CASCADE, related_name="items")
    kind = models.CharField(max_length=16, choices=Kind.choices)
    quorum = models.PositiveSmallIntegerField(default=1, help_text="Approvals from distinct reviewers needed")
    arguments_hash = models.CharField(
        max_length=64, blank=True, help_text="Hash of the exact arguments shown; a decision must quote it"
    )
    # The declared tool's version the call was judged on (tools/catalog.py): an approval stands for that
    # declaration only; a call whose tool was changed since waits for a new approval (policy/verdicts.py).
    declaration = models.CharField(max_length=64, blank=True)
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.PENDING, db_index=True)
    summary = models.TextField(help_text="What will happen if approved (arguments redacted)")
    requested_at = models.DateTimeField(auto_now_add=True)
    expires_at = models.DateTimeField(null=True, blank=True, db_index=True)
    reminded_at = models.DateTimeField(null=True, blank=True)
    escalated_at = models.DateTimeField(null=True, blank=True)
    # The strictest of every policy that matched, whichever rule set the expiry (the `policy` below).
    admins_only = models.BooleanField(default=False, help_text="A matching policy reserves the decision for admins")
    fail_on_reject = models.BooleanField(default=False, help_text="A matching policy fails the task on rejection")
    policy = models.ForeignKey(
        "ApprovalPolicy", null=True, blank=True, on_delete=models.SET_NULL, related_name="requests"
    )
    # Whose action asked for it (the run's starter, the operator who compensated): they may not decide it.
    requested_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    decided_at = models.DateTimeField(null=True, blank=True)
    decided_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    note = models.TextField(blank=True)
    # A plan request's plan as the planner gave it ({"tasks": [...]}), or as a reviewer edited it.
    plan = models.JSONField(null=True, blank=True)

    class Meta:
        db_table = "approvals_approvalrequest"  # the table it had in the approvals app, rows kept
        ordering = ["-id"]

    def __str__(self) -> str:
        return f"approval {self.pk} ({self.kind}, {self.status})"


class Decision(models.Model):
    """One reviewer's decision on one request, bound to the arguments hash they saw. One per reviewer."""

    class Verdict(models.TextChoices):
        APPROVE = "approve"
        REJECT = "reject"

    request = models.ForeignKey(ApprovalRequest, on_delete=models.CASCADE, related_name="decisions")
    reviewer = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="+")
    verdict = models.CharField(max_length=8, choices=Verdict.choices)
    comment = models.TextField(blank=True)
    arguments_hash = models.CharField(max_length=64, help_text="What the reviewer saw")
    edited_arguments = models.JSONField(null=True, blank=True, help_text="Approved with these arguments instead")
    at = models.DateTimeField(auto_now_add=True)

    class Meta:
        db_table = "approvals_decision"  # the table it had in the approvals app, rows kept
        ordering = ["id"]
        constraints = [models.UniqueConstraint(fields=["request", "reviewer"], name="decision_request_reviewer")]

    def __str__(self) -> str:
        return f"{self.reviewer} {self.verdict} request {self.request_id}"


class ApprovalPolicy(models.Model):
    """A rule editable in the admin: calls it matches wait for reviewers. Checked with the workflow's
    trusted tool policies; the strictest applies (any rule asking for approval gates the call).

    A *waiver* (effect "waive") is the one kind that loosens: an irreversible write waits for a reviewer
    of its project by default, and a project's waiver lets the calls it matches leave without one. It
    lifts that default only, never what another policy asks for; it belongs to one project and is made by
    its admins (with a second admin's yes: docs/access.md)."""

    class Effect(models.TextChoices):
        REQUIRE = "require", "Calls it matches wait for reviewers"
        WAIVE = "waive", "Irreversible calls it matches leave without a reviewer (a waiver)"

    class OnExpiry(models.TextChoices):
        REJECT = "reject"
        ESCALATE = "escalate"

    class OnReject(models.TextChoices):
        TELL_AGENT = "tell_agent", "The agent gets 'rejected by reviewer: <comment>'"
        FAIL_TASK = "fail_task", "The task fails (the run needs attention)"

    name = models.CharField(max_length=200)
    enabled = models.BooleanField(default=True)
    effect = models.CharField(
        max_length=8,
        choices=Effect.choices,
        default=Effect.REQUIRE,
        help_text="A waiver names its project; quorum, roles and expiry do not apply to it",
    )
    project = models.ForeignKey(Project, null=True, blank=True, on_delete=models.CASCADE, help_text="Empty: all")
    workflow = models.ForeignKey(
        "agents.Workflow", null=True, blank=True, on_delete=models.CASCADE, help_text="Empty: all"
    )
    tool = models.CharField(max_length=64, blank=True, help_text="Empty: every write tool")
    condition = models.JSONField(
        default=dict,
        blank=True,
        help_text='Optional, on an argument: {"field": "amount", "op": ">", "value": 100}',
    )
    quorum = models.PositiveSmallIntegerField(default=1)
    decided_by_role = models.CharField(
        max_length=16,
        choices=[("reviewer", "reviewers and admins"), ("admin", "project admins only")],
        default="reviewer",
        help_text="Who may decide what this policy gates",
    )
    expires_after_seconds = models.PositiveIntegerField(null=True, blank=True)
    remind_before_seconds = models.PositiveIntegerField(null=True, blank=True)
    on_expiry = models.CharField(max_length=16, choices=OnExpiry.choices, default=OnExpiry.REJECT)
    on_reject = models.CharField(max_length=16, choices=OnReject.choices, default=OnReject.TELL_AGENT)

    class Meta:
        db_table = "approvals_approvalpolicy"  # the table it had in the approvals app, rows kept
        ordering = ["id"]
        verbose_name_plural = "approval policies"
        constraints = [
            models.CheckConstraint(
                condition=~models.Q(effect="waive") | models.Q(project__isnull=False), name="a_waiver_names_a_project"
            )
        ]

    # What a run records of each policy in force at its start (policy/services.py, policies_in_force):
    # the gate holds the run to the stricter of these and the policy as it is now (policy/verdicts.py).
    RECORDED = (
        "enabled", "effect", "project_id", "workflow_id", "tool", "condition", "quorum", "decided_by_role",
        "expires_after_seconds", "remind_before_seconds", "on_expiry", "on_reject",
    )  # fmt: skip

    def save(self, *args, **kwargs):
        super().save(*args, **kwargs)
        # A policy has no numbered versions: each save is a new one, heard after commit (evaluations rerun).
        bus.announce(bus.PolicyChanged(policy_id=self.id))

    def __str__(self) -> str:
        return f"{self.name} (waiver)" if self.effect == self.Effect.WAIVE else self.name

    @classmethod
    def as_recorded(cls, entry: dict) -> "ApprovalPolicy | None":
        """The policy as a run recorded it at its start (unsaved; None for a record without settings)."""
        settings = entry.get("settings") if isinstance(entry, dict) else None
        if not isinstance(settings, dict):
            return None
        return cls(id=entry.get("id"), name=entry.get("name", ""), **{k: settings.get(k) for k in cls.RECORDED})

    def matches(self, *, tool: str, arguments: dict) -> bool:
        """Does this (requiring) policy gate the call? A condition it cannot evaluate gates it."""
        if not self.enabled or (self.tool and self.tool != tool):
            return False
        if not self.condition:
            return True
        return self._condition(arguments, unknown=True)

    def waives(self, *, tool: str, arguments: dict) -> bool:
        """Does this waiver cover the call? A condition it cannot evaluate covers nothing."""
        if not self.enabled or self.effect != self.Effect.WAIVE or (self.tool and self.tool != tool):
            return False
        return not self.condition or self._condition(arguments, unknown=False)

    def _condition(self, arguments: dict, *, unknown: bool) -> bool:
        """The condition on one argument; ``unknown``: the answer when it cannot be evaluated."""
        if not isinstance(self.condition, dict) or not isinstance(arguments, dict):
            return unknown
        field, op, value = (self.condition.get(k) for k in ("field", "op", "value"))
        actual = arguments.get(field)
        if actual is None:
            return False
        try:
            return {
                ">": lambda: actual > value,
                ">=": lambda: actual >= value,
                "<": lambda: actual < value,
                "<=": lambda: actual <= value,
                "==": lambda: actual == value,
                "!=": lambda: actual != value,
                "in": lambda: actual in value,
            }[op]()
        except (KeyError, TypeError):
            # Gates the call rather than waving it through; waives nothing.
            return unknown


class AllowRule(models.Model):
    """“Always allow this tool with these arguments for this agent / run / project”: a call it covers does
    not wait for a reviewer. Listed, revocable and audited; never covers an irreversible tool unless an
    admin said so explicitly."""

    project = models.ForeignKey(Project, on_delete=models.CASCADE, related_name="allow_rules")
    agent = models.ForeignKey("agents.Agent", null=True, blank=True, on_delete=models.CASCADE, help_text="Empty: any")
    run = models.ForeignKey("runs.Run", null=True, blank=True, on_delete=models.CASCADE, help_text="Empty: any")
    tool = models.CharField(max_length=64)
    arguments = models.JSONField(
        default=dict, blank=True, help_text="These arguments must have exactly these values; others may vary"
    )
    covers_irreversible = models.BooleanField(default=False, help_text="Only an admin may set this")
    note = models.TextField(blank=True)
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="+")
    created_at = models.DateTimeField(auto_now_add=True)
    expires_at = models.DateTimeField(null=True, help_text="Rules have a maximum lifetime (WARDEN_ALLOW_RULE_MAX_DAYS)")
    revoked_at = models.DateTimeField(null=True, blank=True)
    revoked_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.PROTECT, related_name="+"
    )

    class Meta:
        db_table = "approvals_allowrule"  # the table it had in the approvals app, rows kept
        ordering = ["-id"]

    def __str__(self) -> str:
        scope = f"run {self.run_id}" if self.run_id else f"agent {self.agent_id}" if self.agent_id else "project"
        return f"allow {self.tool} {self.arguments or ''} ({self.project}, {scope})"

    def covers(self, *, arguments: dict) -> bool:
        return all(arguments.get(k) == v for k, v in (self.arguments or {}).items())
