"""What Warden exchanges with other systems: the integration API's idempotency keys, the webhooks it
posts, and the OpenTelemetry traces it takes in and sends out.

The tables keep the names they had when these models were the engine's (``runs_…``): the move to this
app changed no table, and raw SQL that names them keeps working.
"""

from django.db import models


class IdempotencyKey(models.Model):
    """A write to the integration API made with an ``Idempotency-Key`` header (Stripe's semantics): the
    first response is kept and replayed for the same key and body. Scoped to the caller's token."""

    class Status(models.TextChoices):
        IN_FLIGHT = "in_flight"
        DONE = "done"

    scope = models.CharField(max_length=64, help_text="SHA-256 of the caller's credentials")
    key = models.CharField(max_length=255)
    fingerprint = models.CharField(max_length=64, help_text="SHA-256 of method, path and body")
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.IN_FLIGHT)
    response_status = models.PositiveSmallIntegerField(null=True, blank=True)
    response_body = models.TextField(blank=True)
    response_type = models.CharField(max_length=100, blank=True)
    created_at = models.DateTimeField(auto_now_add=True, db_index=True)
    locked_at = models.DateTimeField(help_text="When the request holding it started (or took it over)")

    class Meta:
        db_table = "runs_idempotencykey"
        ordering = ["-id"]
        constraints = [models.UniqueConstraint(fields=["scope", "key"], name="idempotency_key_unique_per_caller")]

    def __str__(self) -> str:
        return f"{self.key} ({self.status})"


class WebhookEndpoint(models.Model):
    """Where Warden tells another system what happened (configured in the admin)."""

    EVENTS = ("run.finished", "run.needs_attention", "approval.requested", "approval.decided", "operation.ambiguous")

    url = models.URLField(max_length=500)
    secret = models.CharField(max_length=200, help_text="Shared secret of the HMAC-SHA256 signature")
    project = models.ForeignKey(
        "tenancy.Project", null=True, blank=True, on_delete=models.CASCADE, help_text="Empty: every project"
    )
    events = models.JSONField(default=list, blank=True, help_text=f"Empty: all of {', '.join(EVENTS)}")
    active = models.BooleanField(default=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        db_table = "runs_webhookendpoint"

    def __str__(self) -> str:
        return self.url


class WebhookDelivery(models.Model):
    """One event for one endpoint: written in the transaction that decided the event, sent after commit,
    retried with backoff, kept as the delivery log."""

    class Status(models.TextChoices):
        PENDING = "pending"
        SENDING = "sending"
        DELIVERED = "delivered"
        FAILED = "failed"

    endpoint = models.ForeignKey(WebhookEndpoint, on_delete=models.CASCADE, related_name="deliveries")
    event = models.CharField(max_length=40)
    payload = models.JSONField()
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.PENDING)
    attempts = models.PositiveIntegerField(default=0)
    next_attempt_at = models.DateTimeField(db_index=True)
    claimed_at = models.DateTimeField(null=True, blank=True)
    last_status_code = models.PositiveSmallIntegerField(null=True, blank=True)
    last_error = models.TextField(blank=True)
    delivered_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        db_table = "runs_webhookdelivery"
        ordering = ["-id"]
        indexes = [models.Index(fields=["status", "next_attempt_at"])]

    def __str__(self) -> str:
        return f"{self.event} → {self.endpoint_id} ({self.status})"


class OtlpTrace(models.Model):
    """An OpenTelemetry trace sent to Warden (integrations/otlp_ingest.py), and the external run it became."""

    project = models.ForeignKey("tenancy.Project", on_delete=models.CASCADE, related_name="+")
    trace_id = models.CharField(max_length=32)
    run = models.ForeignKey("runs.Run", on_delete=models.CASCADE, related_name="otlp_traces")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        db_table = "runs_otlptrace"
        constraints = [models.UniqueConstraint(fields=["project", "trace_id"], name="one_run_per_otlp_trace")]

    def __str__(self) -> str:
        return f"trace {self.trace_id} → run {self.run_id}"


class OtlpExportCursor(models.Model):
    """How far the live OTLP export has gone (integrations/otlp.py): spans after ``last_span_id`` that have
    closed, and older ones that closed after ``since``, go out in the next pass. One row."""

    last_span_id = models.BigIntegerField(default=0)
    since = models.DateTimeField()

    class Meta:
        db_table = "runs_otlpexportcursor"

    def __str__(self) -> str:
        return f"exported through span {self.last_span_id}, and what closed until {self.since}"
