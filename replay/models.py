"""A replay: chosen runs of one project run again on a candidate, in replay mode (runs.Run.Mode.REPLAY), so
that their differences can be read (replay/services.py)."""

from django.conf import settings
from django.db import models


class Replay(models.Model):
    project = models.ForeignKey("tenancy.Project", on_delete=models.CASCADE, related_name="replays")
    # What is tried: {"agent": slug, "version": number} or {"agent": slug, "edits": {...}} (the version a
    # draft's edits made is in candidate_version).
    candidate = models.JSONField(default=dict)
    candidate_version = models.ForeignKey(
        "agents.AgentVersion", null=True, on_delete=models.PROTECT, related_name="+", db_index=False
    )
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+", db_index=False
    )
    created_at = models.DateTimeField(auto_now_add=True)
    note = models.TextField(blank=True)
    # Reads its originals did not make go to the system when safe to repeat (runs.Run.live_reads).
    live_reads = models.BooleanField(default=False)
    # The evaluation suite whose cases' runs were chosen: each pair is graded by its case's checks.
    suite = models.ForeignKey(
        "evals.EvalSuite", null=True, blank=True, on_delete=models.SET_NULL, related_name="+", db_index=False
    )

    class Meta:
        ordering = ["-id"]

    def __str__(self) -> str:
        return f"replay {self.id} of {self.candidate.get('agent', '?')}"


class ReplayRun(models.Model):
    """One original run and its replay."""

    replay = models.ForeignKey(Replay, on_delete=models.CASCADE, related_name="pairs")
    original = models.ForeignKey("runs.Run", null=True, on_delete=models.SET_NULL, related_name="+")
    run = models.ForeignKey("runs.Run", on_delete=models.CASCADE, related_name="+")
    # A suite's replay: the replay run's grades by its case's judges (evals/judge.py), once it has settled
    # ([] when the case has none); None until then.
    grades = models.JSONField(null=True, blank=True)

    class Meta:
        ordering = ["id"]
        constraints = [models.UniqueConstraint(fields=["replay", "original"], name="one_replay_per_original")]

    def __str__(self) -> str:
        return f"run {self.run_id} replays {self.original_id}"


class Shadow(models.Model):
    """A candidate following a workflow's live traffic in one project: each run of it started while the shadow
    is on starts a twin in shadow mode (runs.Run.Mode.SHADOW), whose pairs are ``replay``'s."""

    project = models.ForeignKey("tenancy.Project", on_delete=models.CASCADE, related_name="shadows")
    workflow = models.ForeignKey("agents.Workflow", on_delete=models.CASCADE, related_name="+")
    # The candidate and the pairs: a replay of its own, which the twins are added to as they start.
    replay = models.OneToOneField(Replay, on_delete=models.CASCADE, related_name="shadow")
    on = models.BooleanField(default=True)
    switched_on_at = models.DateTimeField(auto_now_add=True)
    switched_off_at = models.DateTimeField(null=True, blank=True)
    switched_off_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+", db_index=False
    )
    # Live runs whose twin never started: the workers had no spare time for it within the start's limit.
    skipped = models.PositiveIntegerField(default=0)

    class Meta:
        ordering = ["-id"]
        constraints = [
            models.UniqueConstraint(
                fields=["project", "workflow"], condition=models.Q(on=True), name="one_shadow_on_per_workflow"
            )
        ]

    def __str__(self) -> str:
        return f"shadow {self.id} of {self.replay.candidate.get('agent', '?')} on workflow {self.workflow_id}"
