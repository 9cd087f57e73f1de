"""Reference evaluations: suites of cases, their passes and results, and reviewers' annotations on runs.

The models moved here from the engine (runs) keep their tables (Meta.db_table): the move copied no row
(migrations 0001 here and runs 0026 change Django's state only)."""

from django.conf import settings
from django.db import models


class EvalSuite(models.Model):
    """Reference evaluations: tasks an operator re-runs after changing a prompt, a tool or a model, and
    compares version against version (evals/suites.py)."""

    slug = models.SlugField(max_length=64, unique=True)
    name = models.CharField(max_length=200)
    description = models.TextField(blank=True)
    project = models.ForeignKey("tenancy.Project", on_delete=models.PROTECT, related_name="eval_suites")
    rerun_on = models.JSONField(
        default=list,
        blank=True,
        help_text='Run the suite again when a new version of one of these is saved: ["agent:verifier-agent", '
        '"workflow:deploy-review", "policy:refunds over $100"]',
    )
    quarantine = models.ManyToManyField(
        "EvalCase",
        blank=True,
        related_name="quarantined_in",
        help_text="Known failures: cases of this suite whose failure does not fail run_evals (named on its page)",
    )

    class Meta:
        db_table = "runs_evalsuite"  # the table it had in runs: moved without copying a row
        ordering = ["slug"]

    def __str__(self) -> str:
        return self.slug


class EvalCase(models.Model):
    suite = models.ForeignKey(EvalSuite, on_delete=models.CASCADE, related_name="cases")
    name = models.CharField(max_length=200)
    workflow = models.ForeignKey("agents.Workflow", on_delete=models.PROTECT, related_name="+")
    baseline_workflow = models.ForeignKey(
        "agents.Workflow",
        null=True,
        blank=True,
        on_delete=models.PROTECT,
        related_name="+",
        help_text="A single-agent workflow doing the same task: the baseline a multi-agent workflow must beat",
    )
    goal = models.TextField(blank=True)
    input = models.JSONField(default=dict, blank=True)
    checks = models.JSONField(
        default=list,
        blank=True,
        help_text='[{"status": "completed"}, {"artifact": "verify", "contains": "APPROVE"}, {"max_cost_usd": 0.01}, '
        '{"max_steps": 20}, {"artifact": "verify", "schema": {…}}, {"artifact": "risk", "path": "score", "equals": 3}, '
        '{"artifact": "risk", "path": "score", "approx": 0.3, "tolerance": 0.05}, {"tool_called": "crm.read"}, '
        '{"tool_not_called": "email.send"}, {"no_unapproved_irreversible": true}, '
        '{"judge": {"agent": "judge-agent", "artifact": "verify", "rubric": "…", "min_score": 0.7}} '
        "(docs/evaluations.md)",
    )
    from_run = models.ForeignKey(
        "runs.Run",
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="+",
        help_text="The annotated run it came from",
    )

    class Meta:
        db_table = "runs_evalcase"  # the table it had in runs: moved without copying a row
        ordering = ["suite", "id"]

    def __str__(self) -> str:
        return self.name


class EvalRun(models.Model):
    """One pass of a suite, with the agents as they are or as a model version changes them."""

    suite = models.ForeignKey(EvalSuite, on_delete=models.CASCADE, related_name="eval_runs")
    version = models.ForeignKey("agents.ModelVersion", null=True, blank=True, on_delete=models.PROTECT)
    baseline = models.BooleanField(default=False, help_text="The cases ran on their single-agent baseline workflows")
    started_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL)
    trigger = models.CharField(
        max_length=200, blank=True, help_text="What started it: the page, the API, run_evals, or a new version"
    )
    created_at = models.DateTimeField(auto_now_add=True)
    accepted = models.BooleanField(
        default=False, help_text="run_evals exited 0 on it: the baseline later passes are compared with by default"
    )

    class Meta:
        db_table = "runs_evalrun"  # the table it had in runs: moved without copying a row
        ordering = ["-id"]

    @property
    def label(self) -> str:
        agents = self.version.slug if self.version_id else "current agents"
        return f"single-agent baseline ({agents})" if self.baseline else agents


class EvalResult(models.Model):
    eval_run = models.ForeignKey(EvalRun, on_delete=models.CASCADE, related_name="results")
    case = models.ForeignKey(EvalCase, on_delete=models.CASCADE, related_name="+")
    run = models.ForeignKey("runs.Run", on_delete=models.PROTECT, related_name="+")
    passed = models.BooleanField(null=True, help_text="Empty until the run has finished and its judges have graded")
    failures = models.JSONField(default=list, blank=True)
    # The judge checks' grades: [{"artifact", "score", "reasoning", "cost_micros", "model", "passed"}]. Model
    # output, so data only: escaped wherever it is shown.
    grades = models.JSONField(default=list, blank=True)
    judge_cost_micros = models.BigIntegerField(default=0, help_text="What the judges' model calls cost")

    class Meta:
        db_table = "runs_evalresult"  # the table it had in runs: moved without copying a row
        ordering = ["eval_run", "case"]
        constraints = [models.UniqueConstraint(fields=["eval_run", "case"], name="one_result_per_case")]


class Annotation(models.Model):
    """A reviewer's score or comment on a run, or on one of its tasks, spans or artifacts (evals/)."""

    class Target(models.TextChoices):
        RUN = "run"
        TASK = "task"
        SPAN = "span"
        ARTIFACT = "artifact"

    run = models.ForeignKey("runs.Run", on_delete=models.CASCADE, related_name="annotations")
    target = models.CharField(max_length=16, choices=Target.choices, default=Target.RUN)
    target_id = models.BigIntegerField(null=True, blank=True, help_text="The task, span or artifact; empty: the run")
    score = models.FloatField(null=True, blank=True, help_text="0 (bad) to 1 (good)")
    comment = models.TextField(blank=True)
    author = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, on_delete=models.SET_NULL, related_name="+")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        db_table = "runs_annotation"  # the table it had in runs: moved without copying a row
        ordering = ["run", "id"]
        constraints = [
            models.CheckConstraint(
                condition=models.Q(score__isnull=True) | models.Q(score__gte=0, score__lte=1),
                name="annotation_score_0_1",
            )
        ]

    def __str__(self) -> str:
        return f"{self.target} {self.target_id or self.run_id} of run {self.run_id}"
