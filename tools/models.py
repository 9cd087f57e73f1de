"""Sandbox external systems: each call that reaches one is a row, so tests and operators can count
effects (and duplicates by idempotency key) from outside the engine."""

from django.db import models


class SandboxCall(models.Model):
    system = models.CharField(max_length=32, db_index=True)  # deployments, crm, tickets, email
    operation = models.CharField(max_length=32)
    tool = models.CharField(max_length=64)
    idempotency_key = models.CharField(max_length=200, db_index=True)
    is_effect = models.BooleanField(default=False, help_text="Changed the outside world (not a read)")
    arguments = models.JSONField(default=dict)
    result = models.JSONField(default=dict)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["id"]

    def __str__(self) -> str:
        return f"{self.tool} {self.idempotency_key}"
