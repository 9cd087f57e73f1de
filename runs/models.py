"""The durable run: a task DAG, its trace (spans, which also hold the step journal) and its artifacts."""

from django.conf import settings
from django.db import models

from core import links


class Run(models.Model):
    class Status(models.TextChoices):
        PENDING = "pending"
        RUNNING = "running"
        WAITING_FOR_APPROVAL = "waiting_for_approval"
        NEEDS_ATTENTION = "needs_attention"
        CANCELLING = "cancelling"
        COMPENSATING = "compensating"
        COMPLETED = "completed"
        FAILED = "failed"
        CANCELLED = "cancelled"
        COMPENSATED = "compensated"

    TERMINAL = frozenset({Status.COMPLETED, Status.FAILED, Status.CANCELLED, Status.COMPENSATED})

    # workflow, project, started_by and status are indexed together with id (Meta), not on their own.
    workflow = models.ForeignKey("agents.Workflow", on_delete=models.PROTECT, related_name="runs", db_index=False)
    project = models.ForeignKey("tenancy.Project", on_delete=models.PROTECT, related_name="runs", db_index=False)
    goal = models.TextField()
    input = models.JSONField(default=dict, blank=True)
    status = models.CharField(max_length=32, choices=Status.choices, default=Status.PENDING)
    status_reason = models.TextField(blank=True)
    plan_version = models.PositiveIntegerField(default=1)
    # Budget (None: unlimited) and usage; usage changes in the transaction of the step it counts.
    max_steps = models.PositiveIntegerField(null=True, blank=True)
    max_tokens = models.PositiveBigIntegerField(null=True, blank=True)
    max_tool_calls = models.PositiveIntegerField(null=True, blank=True)
    max_cost_micros = models.PositiveBigIntegerField(null=True, blank=True, help_text="USD × 10⁶")
    deadline = models.DateTimeField(null=True, blank=True)
    steps_used = models.PositiveIntegerField(default=0)
    tokens_used = models.PositiveBigIntegerField(default=0)
    tool_calls_used = models.PositiveIntegerField(default=0)
    cost_micros = models.PositiveBigIntegerField(default=0)
    started_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+", db_index=False
    )
    code_version = models.CharField(max_length=64)
    # What the run started with and keeps to its end: {"workflow": {"id", "version"}, "agents": {slug:
    # {"id", "version"}}, "policies": [{"id", "name", "digest"}]} (agents/versions.py).
    versions = models.JSONField(default=dict, blank=True)
    # The workflow as the run started with it: its plan, tool policies, re-plans, plan approval and
    # compensation are read from here to the run's end (runs/selectors.py, run_workflow_settings), never
    # from the workflow's row, which later edits change.
    workflow_version = models.ForeignKey(
        "agents.WorkflowVersion", null=True, blank=True, on_delete=models.PROTECT, related_name="runs"
    )
    created_at = models.DateTimeField(auto_now_add=True, db_index=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    cancel_requested_at = models.DateTimeField(null=True, blank=True)
    held_back = models.PositiveIntegerField(
        default=0, help_text="Ready tasks held back by the concurrency cap, to send when a slot frees"
    )
    # The supervisor's executor of proposals and compensations holds this lease while it works.
    ops_lease_owner = models.CharField(max_length=128, blank=True)
    ops_lease_expires_at = models.DateTimeField(null=True, blank=True)
    # Incremented by every claim of that lease: a frozen executor's token no longer matches (saga/executor.py).
    ops_lease_token = models.PositiveBigIntegerField(default=0)
    pruned_at = models.DateTimeField(
        null=True, blank=True, help_text="When retention emptied its span bodies and payloads"
    )
    # A fork (runs/services/fork.py) starts from a task's step of another run and inherits its journal
    # and the receipts of its committed effects; these say from where.
    forked_from = models.ForeignKey(
        "self", null=True, blank=True, on_delete=models.SET_NULL, related_name="forks", db_index=False
    )
    forked_task = models.CharField(max_length=64, blank=True, help_text="The task of forked_from it was forked at")
    forked_step = models.PositiveIntegerField(null=True, blank=True, help_text="…and the journal step")

    class Mode(models.TextChoices):
        LIVE = "live"
        # A what-if run (replay/): its tool calls never leave; they are answered from replay_of's ledger,
        # or recorded as what would have been called. Set at its creation, never changed: a replay whose
        # original is deleted stays a replay.
        REPLAY = "replay"
        # A replay that follows a live run as it goes (replay/, shadows): its calls wait for the live run's
        # ledger until that run settles, and are answered as a replay's are.
        SHADOW = "shadow"

    mode = models.CharField(max_length=8, choices=Mode.choices, default=Mode.LIVE, editable=False)
    replay_of = models.ForeignKey(
        "self", null=True, blank=True, on_delete=models.SET_NULL, related_name="replays", db_index=False,
        editable=False, help_text="The run whose ledger a replay's calls are answered from",
    )  # fmt: skip
    # A replay's reads its original did not make go to the system when the tool says they are safe to send
    # again (ToolSpec.repeatable); otherwise they are answered "not recorded". Set at creation.
    live_reads = models.BooleanField(default=False, editable=False)

    class Meta:
        ordering = ["-id"]
        indexes = [
            models.Index(fields=["status", "cancel_requested_at"]),
            # Runs retention has still to look at, oldest first: the hourly prune reads a few index entries,
            # not every finished run. Neither column changes during a step (HOT).
            models.Index(fields=["finished_at"], condition=models.Q(pruned_at__isnull=True), name="run_prune_due"),
            # The runs list, newest first by one filter: (column, id) yields a page's ids from the index
            # alone, however old the matching runs are. They replace the columns' own indexes, and none
            # of these columns changes during a step, so a step's update stays HOT.
            models.Index(fields=["status", "id"], name="run_list_status"),
            models.Index(fields=["project", "id"], name="run_list_project"),
            models.Index(fields=["workflow", "id"], name="run_list_workflow"),
            models.Index(fields=["started_by", "id"], name="run_list_starter"),
        ]

    def __str__(self) -> str:
        return f"run {self.pk} ({self.workflow_id}, {self.status})"

    def get_absolute_url(self) -> str:
        """The run's dashboard page (the admin's "View on site")."""
        return links.run_path(self.pk)

    @property
    def is_terminal(self) -> bool:
        return self.status in self.TERMINAL

    @property
    def cost_usd(self) -> float:
        return self.cost_micros / 1_000_000

    @property
    def max_cost_usd(self) -> float | None:
        return None if self.max_cost_micros is None else self.max_cost_micros / 1_000_000


class Task(models.Model):
    class Status(models.TextChoices):
        PENDING = "pending"  # waiting for dependencies
        READY = "ready"  # dependencies done, a message is on its way
        RUNNING = "running"  # leased by a worker
        RETRY_WAIT = "retry_wait"  # backing off before the next attempt
        WAITING_FOR_APPROVAL = "waiting_for_approval"
        COMPLETED = "completed"
        FAILED = "failed"
        CANCELLED = "cancelled"
        SUPERSEDED = "superseded"  # not started when a re-plan replaced the plan it belonged to

    TERMINAL = frozenset({Status.COMPLETED, Status.FAILED, Status.CANCELLED, Status.SUPERSEDED})

    class FailureClass(models.TextChoices):
        TRANSIENT = "transient"
        VALIDATION = "validation"
        POLICY = "policy"
        BUDGET = "budget"
        LOOP = "loop"
        CRASH = "crash"
        AMBIGUOUS = "ambiguous"
        PROVIDER = "provider"  # the model provider is failing (its breaker is open): a human looks
        BREAKER = "breaker"  # a tool is failing (its breaker is open): parked until a person closes it
        PERMANENT = "permanent"

    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="tasks")
    key = models.SlugField(max_length=64)
    agent = models.ForeignKey("agents.Agent", on_delete=models.PROTECT, related_name="tasks")
    # The version of the agent the run started with (agents/versions.py); empty for an external agent's
    # task and for tasks created before versions were recorded (they read the agent as it is).
    agent_version = models.ForeignKey(
        "agents.AgentVersion", null=True, blank=True, on_delete=models.PROTECT, related_name="+"
    )
    objective = models.TextField()
    depends_on = models.JSONField(default=list, blank=True)
    # Derived from depends_on when the tasks are created, so completing a task touches only its dependents.
    dependents = models.JSONField(default=list, blank=True, help_text="Ids of the tasks that depend on this one")
    pending_deps = models.PositiveIntegerField(default=0, help_text="Dependencies not completed yet")
    allowed_tools = models.JSONField(default=list, blank=True)
    output_schema = models.JSONField(default=dict, blank=True)
    depth = models.PositiveSmallIntegerField(default=0)
    plan_version = models.PositiveIntegerField(default=1)
    status = models.CharField(max_length=32, choices=Status.choices, default=Status.PENDING, db_index=True)
    status_reason = models.TextField(blank=True)
    failure_class = models.CharField(max_length=16, choices=FailureClass.choices, blank=True)
    attempts = models.PositiveIntegerField(default=0)
    max_attempts = models.PositiveIntegerField(default=3)
    recoveries = models.PositiveIntegerField(default=0, help_text="Leases that expired under this task")
    # Lease: every claim increments the fencing token; a write of an attempt is a compare-and-set on it.
    lease_owner = models.CharField(max_length=128, blank=True)
    lease_expires_at = models.DateTimeField(null=True, blank=True)
    heartbeat_at = models.DateTimeField(null=True, blank=True)
    fencing_token = models.PositiveBigIntegerField(default=0)
    # When the task became ready (the sweeper re-drives one whose message was lost) or may retry.
    ready_at = models.DateTimeField(null=True, blank=True)
    not_before = models.DateTimeField(null=True, blank=True)
    continuing = models.BooleanField(default=False, help_text="Next claim continues the same attempt")
    # A retry from step N takes steps N.. out of the journal and starts a new epoch: the steps executed
    # again carry new idempotency keys (…:<task>:<step>:e<epoch>), so they really happen again.
    journal_epoch = models.PositiveIntegerField(
        default=0, help_text="Retries from an earlier step so far; part of the idempotency keys of later calls"
    )
    max_steps = models.PositiveIntegerField(null=True, blank=True)
    max_tokens = models.PositiveBigIntegerField(null=True, blank=True)
    max_tool_calls = models.PositiveIntegerField(null=True, blank=True)
    max_cost_micros = models.PositiveBigIntegerField(null=True, blank=True)
    max_seconds = models.PositiveIntegerField(null=True, blank=True, help_text="Wall-clock limit from its first start")
    steps_used = models.PositiveIntegerField(default=0)
    tokens_used = models.PositiveBigIntegerField(default=0)
    tool_calls_used = models.PositiveIntegerField(default=0)
    cost_micros = models.PositiveBigIntegerField(default=0)
    # The worst case of the model call in flight, held against the task's and the run's budgets until the
    # call's real figures are counted (runs/services/budget.py); counted only while the task is running.
    tokens_reserved = models.PositiveBigIntegerField(default=0)
    cost_reserved_micros = models.PositiveBigIntegerField(default=0)
    created_at = models.DateTimeField(auto_now_add=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["id"]
        constraints = [models.UniqueConstraint(fields=["run", "key"], name="task_key_unique_in_run")]
        indexes = [
            models.Index(fields=["status", "lease_expires_at"]),
            models.Index(fields=["status", "ready_at"]),
        ]

    def __str__(self) -> str:
        return f"{self.key} ({self.status})"

    @property
    def is_terminal(self) -> bool:
        return self.status in self.TERMINAL


class Payload(models.Model):
    """A large span body, kept out of the span table and loaded on demand."""

    body = models.JSONField()
    size = models.PositiveIntegerField()
    created_at = models.DateTimeField(auto_now_add=True)


class Span(models.Model):
    """The append-only trace. Spans with a ``step`` number are also the task's step journal:
    each holds the model response or tool result that a re-executed attempt replays."""

    class Kind(models.TextChoices):
        RUN = "run"
        TASK = "task"
        ATTEMPT = "attempt"
        MODEL_CALL = "model_call"
        TOOL_CALL = "tool_call"
        APPROVAL_WAIT = "approval_wait"
        RECOVERY = "recovery"
        COMPENSATION = "compensation"
        PLAN = "plan"

    class Status(models.TextChoices):
        RUNNING = "running"
        OK = "ok"
        ERROR = "error"
        QUARANTINED = "quarantined"

    # The attribute that marks an ingested span whose parent has not been received yet
    # (integrations/otlp_ingest.py); the trace page flags it.
    ORPHAN = "otlp_orphan"

    # No index of its own: the (run, kind) index serves lookups by run.
    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="spans", db_index=False)
    task = models.ForeignKey(
        Task, null=True, blank=True, on_delete=models.CASCADE, related_name="spans", db_index=False
    )
    # Spans go with their run (run and task cascade); the tree is built from a run's spans at once, so
    # parent needs neither an index nor a constraint, which keeps the journal's insert lean.
    parent = models.ForeignKey(
        "self",
        null=True,
        blank=True,
        on_delete=models.DO_NOTHING,
        related_name="children",
        db_index=False,
        db_constraint=False,
    )
    kind = models.CharField(max_length=16, choices=Kind.choices)
    name = models.CharField(max_length=200)
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.OK)
    attempt = models.PositiveIntegerField(null=True, blank=True)
    step = models.PositiveIntegerField(null=True, blank=True)
    fencing_token = models.PositiveBigIntegerField(null=True, blank=True)
    started_at = models.DateTimeField()
    ended_at = models.DateTimeField(null=True, blank=True)
    tokens_in = models.PositiveIntegerField(default=0)
    tokens_out = models.PositiveIntegerField(default=0)
    cost_micros = models.PositiveBigIntegerField(default=0)
    attributes = models.JSONField(default=dict, blank=True)
    body = models.JSONField(null=True, blank=True, help_text="Journaled response or result (small ones)")
    payload = models.ForeignKey(
        Payload, null=True, blank=True, on_delete=models.SET_NULL, related_name="+", db_index=False
    )

    class Meta:
        ordering = ["id"]
        constraints = [
            # One journal entry per step of a task: a second writer of the same step fails loudly.
            models.UniqueConstraint(
                fields=["task", "step"], condition=models.Q(step__isnull=False), name="span_one_journal_entry_per_step"
            )
        ]
        indexes = [models.Index(fields=["run", "kind"]), models.Index(fields=["task", "kind"])]

    def __str__(self) -> str:
        return f"{self.kind} {self.name}"

    @property
    def duration_ms(self) -> float | None:
        if self.ended_at is None:
            return None
        return (self.ended_at - self.started_at).total_seconds() * 1000


class Artifact(models.Model):
    class Verification(models.TextChoices):
        UNVERIFIED = "unverified"
        VERIFIED = "verified"
        REJECTED = "rejected"

    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="artifacts")
    task = models.ForeignKey(Task, on_delete=models.CASCADE, related_name="artifacts")
    key = models.SlugField(max_length=64)
    schema = models.JSONField(default=dict, blank=True)
    content = models.JSONField()
    provenance = models.JSONField(default=dict, blank=True)
    verification = models.CharField(max_length=16, choices=Verification.choices, default=Verification.UNVERIFIED)
    version = models.PositiveIntegerField(default=1)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["id"]
        constraints = [models.UniqueConstraint(fields=["task", "version"], name="artifact_version_unique")]

    def __str__(self) -> str:
        return f"artifact {self.key} v{self.version}"


class QuarantinedResult(models.Model):
    """A result that arrived too late to apply: cancelled run, expired lease or superseded plan."""

    class Reason(models.TextChoices):
        LEASE_LOST = "lease_lost"
        RUN_CANCELLED = "run_cancelled"
        PLAN_SUPERSEDED = "plan_superseded"

    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="quarantined")
    task = models.ForeignKey(Task, on_delete=models.CASCADE, related_name="quarantined")
    reason = models.CharField(max_length=32, choices=Reason.choices)
    fencing_token = models.PositiveBigIntegerField()
    plan_version = models.PositiveIntegerField()
    step = models.PositiveIntegerField(null=True, blank=True)
    body = models.JSONField(null=True, blank=True)
    worker = models.CharField(max_length=128, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-id"]


class Outbox(models.Model):
    """A message to send after commit. Written in the transaction that decided to send it; deleted once
    the broker has it. What a crash left here is re-sent by the recovery sweeper."""

    actor = models.CharField(max_length=64)
    kwargs = models.JSONField(default=dict)
    delay_ms = models.PositiveIntegerField(default=0)
    created_at = models.DateTimeField(auto_now_add=True, db_index=True)

    class Meta:
        ordering = ["id"]


class FaultFiring(models.Model):
    """Records that a drill fault fired, so a fault meant to happen once survives the crash it causes."""

    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="fault_firings")
    task_key = models.SlugField(max_length=64)
    point = models.CharField(max_length=32)
    mode = models.CharField(max_length=32)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["run", "task_key", "point", "mode"], name="fault_fires_once")]


class BlackboardEntry(models.Model):
    """Durable knowledge a run's tasks share (runs/blackboard.py): typed, versioned by compare-and-set,
    with its author, the artifacts it rests on, a verification status and an optional expiry. Tasks'
    prompts carry only verified, unexpired entries."""

    class Kind(models.TextChoices):
        TEXT = "text"
        NUMBER = "number"
        FLAG = "flag"
        RECORD = "record"  # a JSON object
        LIST = "list"

    class Verification(models.TextChoices):
        UNVERIFIED = "unverified"
        VERIFIED = "verified"
        REJECTED = "rejected"

    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="blackboard")
    key = models.CharField(max_length=100)
    version = models.PositiveIntegerField()
    kind = models.CharField(max_length=16, choices=Kind.choices)
    value = models.JSONField()
    author_task = models.ForeignKey(Task, null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    author_step = models.PositiveIntegerField(null=True, blank=True)
    sources = models.JSONField(default=list, blank=True, help_text="Ids of the artifacts it rests on")
    verification = models.CharField(max_length=16, choices=Verification.choices, default=Verification.UNVERIFIED)
    verified_by = models.CharField(max_length=100, blank=True)
    note = models.CharField(max_length=1000, blank=True)
    expires_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["run", "key", "version"]
        constraints = [models.UniqueConstraint(fields=["run", "key", "version"], name="one_blackboard_version")]

    def __str__(self) -> str:
        return f"{self.key} v{self.version}"


class WorkerProcess(models.Model):
    """A process that runs attempts and the recovery sweeper (a ``rundramatiq`` worker, or the embedded
    server), stamped by its sweeper (runs/workers.py). Its tasks are those whose ``lease_owner`` starts
    with ``name`` (host:pid). Not stamped for a lease's time: gone."""

    class Kind(models.TextChoices):
        WORKER = "worker"
        EMBEDDED = "embedded"

    name = models.CharField(max_length=128, unique=True)
    host = models.CharField(max_length=100)
    pid = models.PositiveIntegerField()
    kind = models.CharField(max_length=16, choices=Kind.choices, default=Kind.WORKER)
    threads = models.PositiveIntegerField(default=0)
    started_at = models.DateTimeField()
    beat_at = models.DateTimeField(db_index=True)
    swept_at = models.DateTimeField(null=True, blank=True)
    stopped_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["host", "pid"]

    def __str__(self) -> str:
        return self.name
