"""Tenancy: projects, the people in them (memberships and their roles), API tokens and the audit log.
Every other app builds on these; this app imports none of them."""

from django.conf import settings
from django.db import models


class Project(models.Model):
    """A team's space: every run belongs to one, and people act on it through their role in it."""

    class Governance(models.TextChoices):
        FOUR_EYES = "four_eyes", "A change that loosens the rules needs a second admin's yes"
        SINGLE_ADMIN = "single_admin", "One admin's change applies at once (set by a superuser)"

    slug = models.SlugField(max_length=64, unique=True)
    name = models.CharField(max_length=200)
    # Who must agree before a change loosens the project's rules (tenancy/governance.py): only a superuser
    # may choose single-admin governance.
    governance = models.CharField(max_length=16, choices=Governance.choices, default=Governance.FOUR_EYES)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        db_table = "approvals_project"  # made by the approvals app, which held these models before
        ordering = ["slug"]

    def __str__(self) -> str:
        return self.slug


class ChangeRequest(models.Model):
    """A change that loosens a project's rules (a tool's class lowered, an HTTP tool's target or headers
    changed, an MCP server's address, an approval policy disabled or weakened, a waiver), made by one of
    its admins and waiting for another's yes. Nothing is changed until then (tenancy/governance.py; the
    decision applies it: approvals/governance.py)."""

    class Status(models.TextChoices):
        PENDING = "pending"
        APPLIED = "applied"
        REJECTED = "rejected"
        WITHDRAWN = "withdrawn"  # its author took it back
        STALE = "stale"  # the row changed (or went) since it was asked for: ask again

    class Action(models.TextChoices):
        CREATE = "create"
        CHANGE = "change"
        DELETE = "delete"

    project = models.ForeignKey(Project, on_delete=models.CASCADE, related_name="change_requests")
    subject = models.CharField(max_length=64, help_text="The model changed, e.g. tools.httptool")
    object_id = models.PositiveBigIntegerField(null=True, blank=True, help_text="Empty: a row to create")
    action = models.CharField(max_length=8, choices=Action.choices)
    label = models.CharField(max_length=200, help_text="What is changed, for people")
    before = models.JSONField(default=dict, blank=True, help_text="The fields it changes, as they are")
    after = models.JSONField(default=dict, blank=True, help_text="The fields it changes, as they would be")
    loosens = models.JSONField(default=list, blank=True, help_text="Why it needs a second admin")
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.PENDING, db_index=True)
    requested_by = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="+")
    requested_at = models.DateTimeField(auto_now_add=True)
    decided_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.PROTECT, related_name="+"
    )
    decided_at = models.DateTimeField(null=True, blank=True)
    note = models.TextField(blank=True)

    class Meta:
        ordering = ["-id"]

    def __str__(self) -> str:
        return f"change request {self.pk}: {self.action} {self.label} ({self.status})"


class Membership(models.Model):
    class Role(models.TextChoices):
        VIEWER = "viewer"  # sees runs, traces, the ledger
        OPERATOR = "operator"  # + starts, cancels, retries, resumes, compensates, resolves
        REVIEWER = "reviewer"  # + decides approval requests
        ADMIN = "admin"  # all of it

    project = models.ForeignKey(Project, on_delete=models.CASCADE, related_name="memberships")
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="memberships")
    role = models.CharField(max_length=16, choices=Role.choices)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        db_table = "approvals_membership"  # made by the approvals app, which held these models before
        ordering = ["project", "user"]
        constraints = [models.UniqueConstraint(fields=["project", "user"], name="membership_project_user")]

    def __str__(self) -> str:
        return f"{self.user} in {self.project} ({self.role})"


class ApiToken(models.Model):
    """A bearer token, stored as its SHA-256; the secret is shown once, when created. Its scopes bound what
    it may do on top of its user's roles; a token given to an agent never has ``approve``."""

    class Scope(models.TextChoices):
        READ = "read"
        RUN = "run"  # start runs
        OPERATE = "operate"  # cancel, retry, resume, compensate, resolve
        APPROVE = "approve"  # decide approval requests
        ADMIN = "admin"  # configure a project: classify tools (project admins)

    DEFAULT_SCOPES = ["read", "run", "operate"]

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="api_tokens")
    scopes = models.JSONField(default=list, blank=True, help_text="read, run, operate, approve, admin")
    for_agent = models.BooleanField(
        default=False, help_text="Used by an agent: can never decide approvals nor configure a project"
    )
    name = models.CharField(max_length=100, blank=True)
    prefix = models.CharField(max_length=12, help_text="First characters, to recognise a token")
    token_hash = models.CharField(max_length=64, unique=True)
    created_at = models.DateTimeField(auto_now_add=True)
    last_used_at = models.DateTimeField(null=True, blank=True)
    expires_at = models.DateTimeField(null=True, blank=True)
    revoked_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        db_table = "approvals_apitoken"  # made by the approvals app, which held these models before
        ordering = ["-id"]

    def __str__(self) -> str:
        return f"{self.prefix}… ({self.user})"


class AuditQuerySet(models.QuerySet):
    def update(self, **kwargs):
        raise PermissionError("the audit log is append-only")

    def delete(self):
        raise PermissionError("the audit log is append-only")


class AuditEvent(models.Model):
    """Append-only: who did or tried what, when, from where, and what they saw. The application cannot
    change or delete a row (the model refuses; on PostgreSQL a trigger refuses too)."""

    at = models.DateTimeField(auto_now_add=True, db_index=True)
    # No database constraints and no cascades: deleting a user, project or run never touches the log.
    actor = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        null=True,
        blank=True,
        on_delete=models.DO_NOTHING,
        db_constraint=False,
        related_name="+",
    )
    actor_label = models.CharField(max_length=150, blank=True, help_text="Username at the time, kept if the user goes")
    via = models.CharField(max_length=16, blank=True)  # api, admin, page, system
    action = models.CharField(max_length=64, db_index=True)
    outcome = models.CharField(max_length=16, default="done")  # done, denied, failed
    project = models.ForeignKey(
        Project, null=True, blank=True, on_delete=models.DO_NOTHING, db_constraint=False, related_name="+"
    )
    run = models.ForeignKey(
        "runs.Run", null=True, blank=True, on_delete=models.DO_NOTHING, db_constraint=False, related_name="audit_events"
    )
    target = models.CharField(max_length=200, blank=True)
    detail = models.JSONField(default=dict, blank=True)
    address = models.GenericIPAddressField(null=True, blank=True)

    objects = AuditQuerySet.as_manager()

    class Meta:
        db_table = "approvals_auditevent"  # made by the approvals app, which held these models before
        ordering = ["-id"]
        indexes = [models.Index(fields=["run", "id"], name="approvals_a_run_id_80a30e_idx")]

    def __str__(self) -> str:
        return (
            f"{self.at:%Y-%m-%d %H:%M:%S} {self.actor_label or 'system'} {self.action} {self.target} ({self.outcome})"
        )

    def save(self, *args, **kwargs):
        if self.pk is not None:
            raise PermissionError("the audit log is append-only")
        super().save(*args, **kwargs)

    def delete(self, *args, **kwargs):
        raise PermissionError("the audit log is append-only")
