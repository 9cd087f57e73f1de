"""The side-effect ledger, and the sandbox external systems the demo, the drills and the tests call.

The sandbox systems live in their own tables, as another service's database would: Warden reaches them
only through the tool functions in ``tools.sandbox``. ``SandboxCall`` logs every request that reached
one, so effects (and duplicates by idempotency key) can be counted from outside the engine.
"""

from django.conf import settings
from django.db import models

from .failures import ON_REFUSAL_AS_AGENT, ON_REFUSAL_FAIL, ON_REFUSAL_MODEL


class OnRefusal(models.TextChoices):
    """What a tool's refusal (an HTTP 4xx, an MCP error result) becomes (docs/tools.md, "Refusals")."""

    AS_AGENT = ON_REFUSAL_AS_AGENT, "as the agent: a model-driven agent's model is told, a scripted task fails"
    MODEL = ON_REFUSAL_MODEL, "the model is told, as the tool's result, and may correct its call"
    FAIL = ON_REFUSAL_FAIL, "the task fails"


class ToolOperation(models.Model):
    """One tool call, from its intent (committed before the call) to its receipt, reconciliation or
    compensation. Keyed by a stable idempotency key: a retry of the same step finds this row again."""

    class Status(models.TextChoices):
        PROPOSED = "proposed"  # propose mode: waits for the supervisor's bundled execution
        AWAITING_APPROVAL = "awaiting_approval"
        APPROVED = "approved"  # may be executed
        REJECTED = "rejected"
        EXECUTING = "executing"  # intent committed; the call may be under way
        COMMITTED = "committed"
        REFUSED = "refused"  # the system said no and changed nothing; the model was told (on_refusal)
        FAILED = "failed"
        AMBIGUOUS = "ambiguous"  # the call may or may not have taken effect; reconciliation decides
        COMPENSATING = "compensating"
        COMPENSATED = "compensated"
        COMPENSATION_FAILED = "compensation_failed"

    TERMINAL = frozenset(
        {
            Status.REJECTED,
            Status.COMMITTED,
            Status.REFUSED,
            Status.FAILED,
            Status.COMPENSATED,
            Status.COMPENSATION_FAILED,
        }
    )

    class Kind(models.TextChoices):
        ACTION = "action"  # asked for by an agent
        COMPENSATION = "compensation"  # undoes a reversible action
        CORRECTION = "correction"  # follows an irreversible action (a correction e-mail)

    class ToolClass(models.TextChoices):
        READ_ONLY = "read_only"
        IDEMPOTENT_WRITE = "idempotent_write"
        NON_IDEMPOTENT_WRITE = "non_idempotent_write"

    class Reversibility(models.TextChoices):
        NONE = "", "not a write"
        REVERSIBLE = "reversible"
        IRREVERSIBLE = "irreversible"

    run = models.ForeignKey("runs.Run", on_delete=models.CASCADE, related_name="operations")
    task = models.ForeignKey("runs.Task", null=True, blank=True, on_delete=models.CASCADE, related_name="operations")
    step = models.PositiveIntegerField(null=True, blank=True, help_text="Journal step of the task")
    call_number = models.PositiveIntegerField(null=True, blank=True, help_text="1-based tool call within the task")
    kind = models.CharField(max_length=16, choices=Kind.choices, default=Kind.ACTION)
    tool = models.CharField(max_length=64)
    idempotency_key = models.CharField(max_length=200, unique=True)
    arguments_hash = models.CharField(max_length=64, help_text="SHA-256 of the canonical arguments")
    arguments = models.JSONField(default=dict, blank=True, help_text="Secret fields are redacted")
    # When a reviewer approved edited arguments: what the agent asked for, kept beside what runs.
    original_arguments = models.JSONField(null=True, blank=True)
    original_hash = models.CharField(max_length=64, blank=True)
    tool_class = models.CharField(max_length=24, choices=ToolClass.choices)
    reversibility = models.CharField(max_length=16, choices=Reversibility.choices, blank=True)
    proposed = models.BooleanField(default=False, help_text="Made in propose mode; executed by the supervisor")
    status = models.CharField(max_length=24, choices=Status.choices, db_index=True)
    status_reason = models.TextField(blank=True)
    result = models.JSONField(null=True, blank=True)
    external_id = models.CharField(max_length=200, blank=True)
    attempts = models.PositiveIntegerField(default=0, help_text="Calls made to the external system")
    # The undo or correction planned with the intent: {"tool": ..., "arguments": {...}} (may quote the result).
    compensation = models.JSONField(null=True, blank=True)
    compensates = models.ForeignKey(
        "self", null=True, blank=True, on_delete=models.CASCADE, related_name="compensations"
    )
    order = models.PositiveIntegerField(default=0, help_text="Execution order among supervisor operations")
    # A receipt a fork carried over from the run that made the effect: never called, never compensated
    # by this run; it answers the same call at the same step of the task (tools/broker.py).
    inherited_from = models.ForeignKey(
        "self", null=True, blank=True, on_delete=models.SET_NULL, related_name="+", db_index=False
    )
    # Chosen at a retry from an earlier step: this committed effect happens again (after a reviewer's
    # approval) instead of its receipt answering the step.
    repeat_chosen = models.BooleanField(default=False)
    approval = models.ForeignKey(
        "policy.ApprovalRequest", null=True, blank=True, on_delete=models.SET_NULL, related_name="operations"
    )
    # The gate's verdict (tools/gate.py), taken before the intent was written: allow, or wait for approval
    # with its quorum, roles and expiry, and the policies and rule that produced it. No row without one:
    # the constraint below refuses an operation written past the gate.
    gate = models.CharField(max_length=16, choices=[("allow", "allow"), ("approval", "wait for approval")])
    # The declared tool's version the verdict was taken on (tools/catalog.py): a call whose declaration
    # changed since is judged again before it leaves. Empty for Warden's registry tools (code).
    declaration = models.CharField(max_length=64, blank=True)
    verdict = models.JSONField(default=dict, help_text="The gate's verdict: what it asks for and why")
    created_at = models.DateTimeField(auto_now_add=True)
    started_at = models.DateTimeField(null=True, blank=True)
    committed_at = models.DateTimeField(null=True, blank=True)
    ended_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["id"]
        indexes = [
            models.Index(fields=["run", "status"]),
            models.Index(fields=["run", "tool", "arguments_hash"]),
            # The saga's sweep, several times a second, asks for the few operations an executor may still
            # owe (saga/sweeps.py: redrive_operations): it reads these entries, not every row of the ledger.
            models.Index(
                fields=["run"],
                condition=models.Q(status__in=["approved", "executing", "ambiguous"]),
                name="tooloperation_owed",
            ),
        ]
        constraints = [
            models.CheckConstraint(condition=models.Q(gate__in=["allow", "approval"]), name="operation_has_a_verdict")
        ]

    def __str__(self) -> str:
        return f"{self.tool} {self.idempotency_key} ({self.status})"

    @property
    def is_write(self) -> bool:
        return self.tool_class != self.ToolClass.READ_ONLY


class ToolClassification(models.Model):
    """What a tool outside Warden's registry does, said by a project admin: an external agent's tool is
    treated as a non-idempotent, irreversible write (the most dangerous class) until one says otherwise.
    What an agent claims about its own tool can only make this stricter (tools/gate.py)."""

    class Approval(models.TextChoices):
        BY_POLICY = "", "as the approval policies say"
        ALWAYS = "always", "every call waits for a reviewer"
        REFUSE = "refuse", "never allowed"

    project = models.ForeignKey("tenancy.Project", on_delete=models.CASCADE, related_name="tool_classes")
    tool = models.CharField(max_length=64)
    tool_class = models.CharField(max_length=24, choices=ToolOperation.ToolClass.choices)
    reversibility = models.CharField(max_length=16, choices=ToolOperation.Reversibility.choices, blank=True)
    approval = models.CharField(max_length=16, choices=Approval.choices, blank=True, default=Approval.BY_POLICY)
    note = models.TextField(blank=True)
    classified_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, on_delete=models.SET_NULL, related_name="+")
    classified_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["project", "tool"]
        constraints = [models.UniqueConstraint(fields=["project", "tool"], name="one_classification_per_tool")]

    def __str__(self) -> str:
        return f"{self.tool} in {self.project}: {self.tool_class} {self.reversibility}".strip()


class HttpTool(models.Model):
    """A tool declared without code, in the admin: one HTTP request on a host the deployment allows
    (WARDEN_HTTP_TOOL_HOSTS). Secrets are named in header templates ({secret:NAME}) and read at call
    time, never stored here. Checked on save (tools/http_tools.py); docs/tools.md, "HTTP tools"."""

    class Method(models.TextChoices):
        GET = "GET"
        HEAD = "HEAD"
        POST = "POST"
        PUT = "PUT"
        PATCH = "PATCH"
        DELETE = "DELETE"

    project = models.ForeignKey("tenancy.Project", on_delete=models.CASCADE, related_name="http_tools")
    name = models.CharField(max_length=64, help_text="system.operation, e.g. payments.refund")
    description = models.TextField(blank=True, help_text="What the model is told the tool does")
    method = models.CharField(max_length=8, choices=Method.choices, default=Method.POST)
    url = models.CharField(
        max_length=1000,
        help_text="URL template; {argument} placeholders in the path or query only, e.g. "
        "https://payments.internal/v1/charges/{charge_id}/refunds",
    )
    arguments_schema = models.JSONField(
        default=dict, help_text="JSON Schema of the arguments (an object); those not in the URL go in the JSON body"
    )
    tool_class = models.CharField(
        max_length=24,
        choices=ToolOperation.ToolClass.choices,
        help_text="At least what the method says: GET and HEAD read, PUT and DELETE idempotent writes, POST and "
        "PATCH non-idempotent writes",
    )
    reversibility = models.CharField(
        max_length=16,
        choices=ToolOperation.Reversibility.choices,
        blank=True,
        help_text="A write is irreversible unless it names its undo",
    )
    headers = models.JSONField(
        default=dict, blank=True, help_text='{"Authorization": "Bearer {secret:PAYMENTS_API_KEY}"}: secrets by name'
    )
    idempotency_header = models.CharField(
        max_length=100, blank=True, help_text="The header the service deduplicates by (e.g. Idempotency-Key)"
    )
    lookup_url = models.CharField(
        max_length=1000,
        blank=True,
        help_text="GET by idempotency key ({key}), for reconciling a lost answer: 200 = done, with its answer; "
        "404 = not done",
    )
    undo = models.JSONField(
        default=dict,
        blank=True,
        help_text='{"tool": "payments.refund_void", "arguments": {"refund_id": "result.id"}}: values '
        '"arguments.x" or "result.y" come from the call; anything else is taken as it is',
    )
    external_id = models.CharField(max_length=100, blank=True, help_text="The answer's field naming what was made")
    example_answer = models.JSONField(
        null=True,
        blank=True,
        help_text="A write's example answer (an object): what a what-if replay's model is told when the "
        "candidate makes a write the original run did not (docs/replay.md); it is never sent",
    )
    repeatable = models.BooleanField(
        default=False,
        help_text="A read safe to send again: a what-if replay that allows live reads may send it (never a write)",
    )
    timeout_seconds = models.FloatField(default=10.0)
    rate_per_minute = models.PositiveIntegerField(null=True, blank=True)
    on_refusal = models.CharField(
        max_length=8,
        choices=OnRefusal.choices,
        blank=True,
        default=OnRefusal.AS_AGENT,
        help_text="What a 4xx answer becomes (401 and 407 always fail the task: the credential)",
    )
    enabled = models.BooleanField(default=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["project", "name"]
        constraints = [models.UniqueConstraint(fields=["project", "name"], name="one_http_tool_per_name")]

    def __str__(self) -> str:
        return f"{self.name} ({self.method} {self.url[:80]})"


class McpServer(models.Model):
    """An MCP server a project connects (docs/tools.md, "MCP tools"). Its tools are listed when it is
    saved; a stdio server runs a command the deployment names (WARDEN_MCP_COMMANDS), never one typed in
    here, and a streamable HTTP server must be on an allowed host."""

    class Transport(models.TextChoices):
        HTTP = "http", "streamable HTTP"
        STDIO = "stdio"

    project = models.ForeignKey("tenancy.Project", on_delete=models.CASCADE, related_name="mcp_servers")
    name = models.CharField(
        max_length=40, help_text="Lower case; its tools are named <name>.<tool>, e.g. tickets.create_ticket"
    )
    transport = models.CharField(max_length=8, choices=Transport.choices, default=Transport.HTTP)
    url = models.CharField(max_length=1000, blank=True, help_text="Streamable HTTP: the server's endpoint")
    command = models.CharField(max_length=100, blank=True, help_text="stdio: a command named in WARDEN_MCP_COMMANDS")
    headers = models.JSONField(default=dict, blank=True, help_text="HTTP headers; secrets by name ({secret:NAME})")
    secrets = models.JSONField(
        default=list, blank=True, help_text="stdio: names of secrets passed to the command's environment"
    )
    timeout_seconds = models.FloatField(default=30.0)
    on_refusal = models.CharField(
        max_length=8,
        choices=OnRefusal.choices,
        blank=True,
        default=OnRefusal.AS_AGENT,
        help_text="What a tool's error result (isError) becomes",
    )
    enabled = models.BooleanField(default=True)
    listed_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["project", "name"]
        constraints = [models.UniqueConstraint(fields=["project", "name"], name="one_mcp_server_per_name")]

    def __str__(self) -> str:
        return f"{self.name} ({self.transport})"


class McpTool(models.Model):
    """A tool an MCP server listed, as Warden calls it. Its class here is what the server's annotations
    suggest, and only that: the tool is unclassified (every call waits for a reviewer) until a project admin
    confirms a class (a ToolClassification of the same name; tools/catalog.py)."""

    server = models.ForeignKey(McpServer, on_delete=models.CASCADE, related_name="tools")
    name = models.CharField(max_length=64, help_text="Warden's name: <server>.<tool>")
    remote_name = models.CharField(max_length=200)
    description = models.TextField(blank=True)
    input_schema = models.JSONField(default=dict)
    annotations = models.JSONField(default=dict, blank=True)
    tool_class = models.CharField(
        "suggested class",
        max_length=24,
        choices=ToolOperation.ToolClass.choices,
        help_text="What the server's annotations suggest; a project admin confirms the class",
    )
    reversibility = models.CharField(
        "suggested reversibility", max_length=16, choices=ToolOperation.Reversibility.choices, blank=True
    )

    class Meta:
        ordering = ["server", "name"]
        constraints = [models.UniqueConstraint(fields=["server", "name"], name="one_mcp_tool_per_name")]

    def __str__(self) -> str:
        return self.name


class Installation(models.Model):
    """This installation's identity, generated once (migration 0007) and kept with the database. It
    prefixes every idempotency key, so a reset database or a second environment never sends the keys
    another one already sent to a shared external system (docs/tools.md, "Idempotency keys")."""

    key = models.CharField(max_length=32, unique=True)
    legacy_runs_through = models.BigIntegerField(
        default=0, help_text="Runs up to this id started before keys carried the installation: they keep their keys"
    )
    created_at = models.DateTimeField(auto_now_add=True)

    def __str__(self) -> str:
        return self.key


class SealedArguments(models.Model):
    """The real values of secret argument fields of one journaled tool call. Spans, the ledger, logs,
    pages and API responses hold only the redacted form; the broker alone reads this, to make the call."""

    task = models.ForeignKey("runs.Task", on_delete=models.CASCADE, related_name="+")
    step = models.PositiveIntegerField()
    values = models.JSONField(default=dict)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["task", "step"], name="sealed_arguments_task_step")]


class SandboxCall(models.Model):
    """Every request that reached a sandbox system; ``is_effect`` marks those that changed it."""

    system = models.CharField(max_length=32, db_index=True)  # deployments, crm, tickets, email, search
    operation = models.CharField(max_length=32)
    tool = models.CharField(max_length=64)
    idempotency_key = models.CharField(max_length=200, db_index=True)
    is_effect = models.BooleanField(default=False, help_text="Changed the outside world (not a read)")
    object_id = models.CharField(max_length=100, blank=True)
    arguments = models.JSONField(default=dict, help_text="Secret fields are stored as a hash")
    result = models.JSONField(default=dict)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["id"]

    def __str__(self) -> str:
        return f"{self.tool} {self.idempotency_key}"


class SandboxTicket(models.Model):
    """The ticket tracker. It honours idempotency keys, as Jira-like trackers with request ids do."""

    ticket_id = models.CharField(max_length=32, unique=True)
    idempotency_key = models.CharField(max_length=200, unique=True)
    customer_id = models.CharField(max_length=64)
    title = models.CharField(max_length=200)
    status = models.CharField(max_length=16, default="open")
    created_at = models.DateTimeField(auto_now_add=True)
    closed_at = models.DateTimeField(null=True, blank=True)
    close_key = models.CharField(max_length=200, blank=True)

    def __str__(self) -> str:
        return f"{self.ticket_id} ({self.status})"


class SandboxRecord(models.Model):
    """A CRM record."""

    customer_id = models.CharField(max_length=64, unique=True)
    name = models.CharField(max_length=200)
    tier = models.CharField(max_length=32, default="gold")
    fields = models.JSONField(default=dict, blank=True)
    version = models.PositiveIntegerField(default=1)

    def __str__(self) -> str:
        return self.customer_id


class SandboxRecordChange(models.Model):
    """A CRM update or restore, with the record's before-image; the key makes a repeat a no-op."""

    record = models.ForeignKey(SandboxRecord, on_delete=models.CASCADE, related_name="changes")
    idempotency_key = models.CharField(max_length=200, unique=True)
    kind = models.CharField(max_length=16)  # update, restore
    before = models.JSONField(default=dict)
    after = models.JSONField(default=dict)
    version = models.PositiveIntegerField()
    created_at = models.DateTimeField(auto_now_add=True)


class SandboxEmail(models.Model):
    """The e-mail service's sent folder. It does NOT enforce idempotency keys: a repeated send is a real
    duplicate. The key travels as a header, so the sent folder can be searched by it."""

    message_id = models.CharField(max_length=64, unique=True)
    idempotency_key = models.CharField(max_length=200, db_index=True)
    to = models.CharField(max_length=200)
    subject = models.CharField(max_length=200)
    body = models.TextField(blank=True)
    kind = models.CharField(max_length=16, default="message")  # message, correction
    in_reply_to = models.CharField(max_length=64, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)


class SandboxDeployment(models.Model):
    """The deployment inventory."""

    service = models.CharField(max_length=100, unique=True)
    version = models.CharField(max_length=32)
    pods = models.PositiveIntegerField(default=1)
    region = models.CharField(max_length=32)


class SandboxDocument(models.Model):
    """The search index: runbooks and past incidents."""

    title = models.CharField(max_length=200, unique=True)
    body = models.TextField()
