"""Access: API tokens (projects, roles and approvals build on this app)."""

from django.conf import settings
from django.db import models


class ApiToken(models.Model):
    """A bearer token, stored as its SHA-256; the secret is shown once, when created."""

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="api_tokens")
    name = models.CharField(max_length=100, blank=True)
    prefix = models.CharField(max_length=12, help_text="First characters, to recognise a token")
    token_hash = models.CharField(max_length=64, unique=True)
    created_at = models.DateTimeField(auto_now_add=True)
    last_used_at = models.DateTimeField(null=True, blank=True)
    expires_at = models.DateTimeField(null=True, blank=True)
    revoked_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-id"]

    def __str__(self) -> str:
        return f"{self.prefix}… ({self.user})"


class ApprovalRequest(models.Model):
    """A human decision the engine waits for: one tool operation, a bundle of proposals, or the
    corrections of a compensation. (Policies, the reviewer queue and separation of duties build on it.)"""

    class Kind(models.TextChoices):
        OPERATION = "operation", "One tool call"
        BUNDLE = "bundle", "Proposed operations, executed together"
        CORRECTION = "correction", "Correction actions of a compensation"

    class Status(models.TextChoices):
        PENDING = "pending"
        APPROVED = "approved"
        REJECTED = "rejected"
        WITHDRAWN = "withdrawn"  # its run moved on (compensated, cancelled) before anyone decided

    run = models.ForeignKey("runs.Run", on_delete=models.CASCADE, related_name="approvals")
    task = models.ForeignKey("runs.Task", null=True, blank=True, on_delete=models.CASCADE, related_name="+")
    kind = models.CharField(max_length=16, choices=Kind.choices)
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.PENDING, db_index=True)
    summary = models.TextField(help_text="What will happen if approved (arguments redacted)")
    requested_at = models.DateTimeField(auto_now_add=True)
    decided_at = models.DateTimeField(null=True, blank=True)
    decided_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    note = models.TextField(blank=True)

    class Meta:
        ordering = ["-id"]

    def __str__(self) -> str:
        return f"approval {self.pk} ({self.kind}, {self.status})"
