"""Approvals: the reviewer's side of a request (policy.models): the notifications sent about it, its decision
links, the pages about opened breakers, and the questions agents ask people."""

from django.conf import settings
from django.db import models

from policy.models import ApprovalRequest
from tenancy.models import Project


class Notification(models.Model):
    """One message about one request on one channel: recorded in the deciding transaction, sent after,
    at most once (a sender claims it; the sweeper sends what a crash left)."""

    class Kind(models.TextChoices):
        NEW = "new"
        REMINDER = "reminder"
        ESCALATION = "escalation"

    request = models.ForeignKey(ApprovalRequest, on_delete=models.CASCADE, related_name="notifications")
    channel = models.CharField(max_length=16)  # email, webhook
    kind = models.CharField(max_length=16, choices=Kind.choices)
    created_at = models.DateTimeField(auto_now_add=True)
    claimed_at = models.DateTimeField(null=True, blank=True)
    sent_at = models.DateTimeField(null=True, blank=True)
    error = models.TextField(blank=True)

    class Meta:
        ordering = ["id"]
        constraints = [
            models.UniqueConstraint(fields=["request", "channel", "kind"], name="notification_once_per_request")
        ]


class BreakerNotification(models.Model):
    """One page about one opening of a circuit breaker on one channel (approvals/breaker_pages.py): written
    when it opens, sent by a worker after commit, at most once (a sender claims it, as a Notification)."""

    breaker = models.CharField(max_length=300, help_text="tool:NAME, provider:NAME, or tool:PROJECT_ID/NAME")
    kind = models.CharField(max_length=16)  # tool, provider
    name = models.CharField(max_length=200)
    # A project's own tool's breaker pages its admins; none: the deployment's, paged to the superusers.
    project = models.ForeignKey(Project, null=True, blank=True, on_delete=models.CASCADE, related_name="+")
    opened_at = models.DateTimeField(help_text="Which opening: a breaker pages once per opening")
    channel = models.CharField(max_length=16)  # email, webhook
    created_at = models.DateTimeField(auto_now_add=True)
    claimed_at = models.DateTimeField(null=True, blank=True)
    sent_at = models.DateTimeField(null=True, blank=True)
    error = models.TextField(blank=True)

    class Meta:
        ordering = ["id"]
        constraints = [
            models.UniqueConstraint(
                fields=["breaker", "opened_at", "channel"], name="breaker_notification_once_per_opening"
            )
        ]


class DecisionLink(models.Model):
    """A signed one-time link to a request's card, sent in its notifications (approvals/links.py): it
    opens the card after login and decides once, bound to the arguments the message described."""

    nonce = models.CharField(max_length=64, unique=True)
    request = models.ForeignKey(ApprovalRequest, on_delete=models.CASCADE, related_name="links")
    arguments_hash = models.CharField(max_length=64, help_text="What the message showed; a decision quotes it")
    created_at = models.DateTimeField(auto_now_add=True)
    used_at = models.DateTimeField(null=True, blank=True)
    used_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )

    class Meta:
        ordering = ["-id"]

    def __str__(self) -> str:
        return f"link to request {self.request_id}" + (" (used)" if self.used_at else "")


class Question(models.Model):
    """A question an agent asked a person (the built-in tool human.ask). Its task waits parked, without a
    worker, until someone answers, the question expires or the run moves on; the answer is the receipt of
    the call's ledger row, so a resumed or retried attempt reads it back and never asks twice."""

    class Status(models.TextChoices):
        PENDING = "pending"
        ANSWERED = "answered"
        EXPIRED = "expired"  # nobody answered in time: what the run's policy says (on_timeout) happens
        WITHDRAWN = "withdrawn"  # its run moved on (cancelled, compensated) before anyone answered

    class OnTimeout(models.TextChoices):
        TELL_AGENT = "tell_agent", "The agent is told nobody answered, and goes on without it"
        FAIL_TASK = "fail_task", "The task fails (the run needs attention)"

    run = models.ForeignKey("runs.Run", on_delete=models.CASCADE, related_name="questions")
    task = models.ForeignKey("runs.Task", on_delete=models.CASCADE, related_name="+")
    step = models.PositiveIntegerField(help_text="Journal step of the tool call")
    operation = models.OneToOneField(
        "tools.ToolOperation", null=True, blank=True, on_delete=models.SET_NULL, related_name="question"
    )
    text = models.TextField()
    choices = models.JSONField(default=list, blank=True, help_text="Empty: a free-text answer")
    on_timeout = models.CharField(max_length=16, choices=OnTimeout.choices, default=OnTimeout.TELL_AGENT)
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.PENDING, db_index=True)
    answer = models.TextField(blank=True)
    answered_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    answered_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    expires_at = models.DateTimeField(null=True, blank=True, db_index=True)

    class Meta:
        ordering = ["-id"]

    def __str__(self) -> str:
        return f"question {self.pk} ({self.status})"
