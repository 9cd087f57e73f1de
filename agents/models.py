"""The registry: agents (instructions, model, tools, output schema) and workflows (how a run is planned)."""

from django.core.validators import MinValueValidator
from django.db import models


class Agent(models.Model):
    class Provider(models.TextChoices):
        SCRIPTED = "scripted"
        OPENAI = "openai", "OpenAI-compatible (OpenAI, vLLM, Ollama, LM Studio…)"
        ANTHROPIC = "anthropic", "Anthropic (messages API)"
        EXTERNAL = "external"  # runs elsewhere; reports its steps through the API

    slug = models.SlugField(max_length=64, unique=True)
    name = models.CharField(max_length=200)
    instructions = models.TextField(blank=True)
    provider = models.CharField(max_length=32, choices=Provider.choices, default=Provider.SCRIPTED)
    model = models.CharField(max_length=100, default="scripted-1")
    allowed_tools = models.JSONField(default=list, blank=True, help_text="Tool names; trusted configuration")
    output_schema = models.JSONField(default=dict, blank=True, help_text="JSON Schema of the final output")
    script = models.JSONField(
        default=list, blank=True, help_text="Scripted provider: the model's turns, in order (see docs/agents.md)"
    )
    fallback_provider = models.CharField(
        max_length=32, choices=Provider.choices, blank=True, help_text="Used while the provider's breaker is open"
    )
    fallback_model = models.CharField(max_length=100, blank=True)
    routing = models.JSONField(
        default=dict,
        blank=True,
        help_text='Simple steps to a cheaper model: {"max_prompt_chars": 2000, "model": "gpt-4.1-mini"} '
        '(optionally "provider"); a step whose prompt is that short goes there',
    )
    cache_seconds = models.PositiveIntegerField(
        default=0,
        help_text="Real providers: reuse the answer to an identical request (same model, messages and tools) for "
        "this long; 0: never. Only for an agent whose answers may repeat (temperature 0, no hidden state).",
    )
    max_attempts = models.PositiveIntegerField(default=3)
    max_steps = models.PositiveIntegerField(null=True, blank=True)
    is_planner = models.BooleanField(default=False, help_text="Its output is a task plan")
    # Its own OpenAI-compatible endpoint (docs/agents.md, "Providers"): only the key's name is stored.
    base_url = models.URLField(
        max_length=500,
        blank=True,
        help_text="OpenAI-compatible providers: this agent's endpoint (e.g. http://10.0.0.5:8000/v1); empty: the "
        "deployment's (WARDEN_OPENAI_BASE_URL)",
    )
    api_key_secret = models.CharField(
        max_length=128,
        blank=True,
        help_text="The name of the endpoint's key, a secret granted to the project below (WARDEN_SECRET_GRANTS); "
        "empty: the deployment's key, sent only to the deployment's endpoint",
    )
    project = models.ForeignKey(
        "tenancy.Project",
        null=True,
        blank=True,
        on_delete=models.PROTECT,
        related_name="+",
        help_text="Whose secret the key is: only this project's runs may call the endpoint with it",
    )
    send_max_tokens = models.BooleanField(
        default=False,
        help_text="The endpoint takes max_tokens, not max_completion_tokens (older vLLM, Ollama, some proxies)",
    )

    class Meta:
        ordering = ["slug"]

    def __str__(self) -> str:
        return self.slug

    @property
    def endpoint(self) -> dict:
        """What the OpenAI-compatible provider needs of this agent beyond the deployment's settings."""
        return {
            "base_url": self.base_url,
            "api_key_secret": self.api_key_secret,
            "project_id": self.project_id,
            "send_max_tokens": self.send_max_tokens,
        }


class ModelVersion(models.Model):
    """A named set of changes to agents (model, provider, instructions or script), trusted configuration
    edited in the admin. A run whose input names it (``model_version``) runs its agents so changed:
    how reference evaluations compare a prompt, a model or a script before it replaces the current one."""

    slug = models.SlugField(max_length=64, unique=True)
    name = models.CharField(max_length=200, blank=True)
    overrides = models.JSONField(
        default=dict,
        blank=True,
        help_text='Per agent slug: {"incident-worker": {"model": "gpt-4.1-mini", "instructions": "…"}}; '
        "keys: provider, model, instructions, script",
    )

    OVERRIDABLE = ("provider", "model", "instructions", "script")

    class Meta:
        ordering = ["slug"]

    def __str__(self) -> str:
        return self.slug


class ModelPrice(models.Model):
    """The price table the gateway charges model calls by. USD per million tokens is also micro-dollars
    per token, the unit budgets count in. Seeded and refreshed from the genai-prices package
    (agents/prices.py); a price an admin sets wins and no refresh overwrites it."""

    class Source(models.TextChoices):
        PACKAGE = "package", "genai-prices (refreshed by refresh_model_prices)"
        ADMIN = "admin", "set by an admin (never overwritten)"

    provider = models.CharField(max_length=32, choices=Agent.Provider.choices)
    model = models.CharField(max_length=100)
    input_usd_per_mtok = models.DecimalField(max_digits=14, decimal_places=6, validators=[MinValueValidator(0)])
    output_usd_per_mtok = models.DecimalField(max_digits=14, decimal_places=6, validators=[MinValueValidator(0)])
    # Rows that existed before the package was read were typed by an admin: they stay theirs.
    source = models.CharField(max_length=16, choices=Source.choices, default=Source.ADMIN)
    source_version = models.CharField(max_length=32, blank=True, help_text="The package's version it came from")
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["provider", "model"]
        constraints = [models.UniqueConstraint(fields=["provider", "model"], name="one_price_per_model")]

    def __str__(self) -> str:
        return f"{self.provider}/{self.model}"


class Workflow(models.Model):
    class Planner(models.TextChoices):
        STATIC = "static", "static task list"
        AGENT = "agent", "planner agent"
        EXTERNAL = "external", "an agent running elsewhere (it reports through the API)"

    slug = models.SlugField(max_length=64, unique=True)
    name = models.CharField(max_length=200)
    description = models.TextField(blank=True)
    default_goal = models.TextField(blank=True)
    planner = models.CharField(max_length=16, choices=Planner.choices, default=Planner.STATIC)
    planner_agent = models.ForeignKey(Agent, null=True, blank=True, on_delete=models.PROTECT, related_name="+")
    agents = models.JSONField(
        default=list,
        blank=True,
        help_text="Trusted: the agents (slugs) a planner agent may assign tasks to; it may assign no other",
    )
    tasks = models.JSONField(default=list, blank=True, help_text="Static plan: [{key, agent, objective, depends_on}]")
    default_budget = models.JSONField(default=dict, blank=True)
    max_tasks = models.PositiveIntegerField(null=True, blank=True)
    max_concurrent_tasks = models.PositiveIntegerField(null=True, blank=True)
    project = models.ForeignKey(
        "tenancy.Project",
        null=True,
        blank=True,
        on_delete=models.PROTECT,
        related_name="workflows",
        help_text="Runs start in this project; empty: shared, runs start in the default project or the one asked for",
    )
    tool_policies = models.JSONField(
        default=dict,
        blank=True,
        help_text='Per tool, trusted: {"email.send": {"approval": "always"}} makes each call wait for a reviewer',
    )
    max_replans = models.PositiveSmallIntegerField(
        default=0,
        help_text="With a planner agent: how often a task's quality failure (invalid output, a loop, a permanent "
        "error) sends the run back to the planner, with the world as it now is, before a human is asked",
    )
    compensate_on_failure = models.BooleanField(
        default=False, help_text="After a task fails for good, undo the run's committed effects without waiting"
    )
    approve_plans = models.BooleanField(
        default=False,
        help_text="With a planner agent: each plan (and re-plan) waits for a reviewer's approval before any of "
        "its tasks starts; a rejection's comment goes to the planner, which plans again",
    )
    # The projects whose runs of this workflow start a shadow twin (replay.models.Shadow holds what each
    # tries): read with the workflow at a run's start, so a start that is not shadowed pays nothing, and a
    # shadow switched off is off for the next start. Kept by replay/shadows.py only; not configuration, so
    # not versioned.
    shadowed_in = models.JSONField(default=list, blank=True, editable=False)

    class Meta:
        ordering = ["slug"]

    def __str__(self) -> str:
        return self.slug


class _Version(models.Model):
    """A snapshot of configuration (agents/versions.py): its number, what it was, and its digest."""

    number = models.PositiveIntegerField()
    config = models.JSONField()
    digest = models.CharField(max_length=64)
    created_at = models.DateTimeField(auto_now_add=True)
    # A candidate tried in a replay (replay/), never the owner's current version: it takes a number (so
    # runs can name it) but is never the "latest" a run starts on.
    draft = models.BooleanField(default=False, editable=False)

    class Meta:
        abstract = True


class AgentVersion(_Version):
    """What an agent was, as a run used it: made when a changed agent is saved or a run starts with it.
    Runs keep the version they started with to their end."""

    agent = models.ForeignKey(Agent, on_delete=models.CASCADE, related_name="versions")

    class Meta:
        ordering = ["agent", "-number"]
        constraints = [models.UniqueConstraint(fields=["agent", "number"], name="one_agent_version_number")]

    def __str__(self) -> str:
        return f"{self.agent.slug} v{self.number}{' (draft)' if self.draft else ''}"


class WorkflowVersion(_Version):
    """What a workflow was (its plan, planner, agents, budget) when a run started with it."""

    workflow = models.ForeignKey(Workflow, on_delete=models.CASCADE, related_name="versions")

    class Meta:
        ordering = ["workflow", "-number"]
        constraints = [models.UniqueConstraint(fields=["workflow", "number"], name="one_workflow_version_number")]

    def __str__(self) -> str:
        return f"{self.workflow.slug} v{self.number}"
