"""Bulk actions of the runs list: a preview of what an action would touch, then the action itself on
exactly the runs previewed, one run at a time through the same services as the API and the admin.

Each run is authorized on its own at the moment of acting (a role may differ between projects, or have
changed since the preview); a refusal or a domain error of one run is reported, never raised.
"""

from collections import Counter
from dataclasses import dataclass, field

from django.db.models import Count, F

from core.errors import Forbidden, NotFound, WardenError
from policy.models import ApprovalRequest
from runs.models import Run, Task
from runs.refusals import run_cancel_refusal, run_retry_failed_refusal, short
from runs.selectors import set_aside_by_replan
from runs.services import run_cancel, task_retry
from runs.transitions import TransitionNotAllowed
from saga.compensation import COMPENSABLE_FROM, compensation_plan, run_compensate, run_compensate_refusal
from tenancy.access import authorize, project_ids
from tools.human import ASK
from tools.models import ToolOperation
from tools.transitions import UNKNOWN_OUTCOME

MAX_RUNS = 500
ACTIONS = {
    "cancel": "Cancel",
    "retry": "Retry failed tasks",
    "compensate": "Compensate",
}
VERB = {"cancel": "cancelled", "retry": "retried", "compensate": "compensated"}


class Refused(WardenError):
    """The selection cannot be acted on as asked (too many runs, a filter that did not parse)."""

    code = "invalid_input"


@dataclass
class Preview:
    action: str
    eligible: list[int] = field(default_factory=list)
    will: list[tuple[int, str]] = field(default_factory=list)  # (how many, status) acted on
    skipped: list[tuple[int, str, str]] = field(default_factory=list)  # (how many, status, why)
    effects: list[tuple[int, str]] = field(default_factory=list)  # (how many, what)
    not_operable: int = 0  # eligible runs in projects where the user's role may not operate

    @property
    def verb(self) -> str:
        return VERB[self.action]


def _label(status: str) -> str:
    return Run.Status(status).label.lower()


def _why_not(action: str, run: Run, failed: list[Task], running: list[str], unresolved: list[int]) -> str:
    """Why ``action`` would not touch ``run`` ('' when it would): the services' own rules."""
    if action == "cancel":
        refused = run_cancel_refusal(run)
    elif action == "retry":
        refused = run_retry_failed_refusal(run, failed)
    else:
        refused = run_compensate_refusal(run, running=running, unresolved=unresolved)
    return "" if refused is None else short(refused, run)


def bulk_preview(*, user, action: str, run_ids: list[int]) -> Preview:
    """What ``action`` would do to the runs ``run_ids`` (already limited to what ``user`` may view)."""
    if len(run_ids) > MAX_RUNS:
        raise Refused(f"a bulk action acts on at most {MAX_RUNS} runs")
    runs = list(Run.objects.filter(id__in=run_ids).only("id", "status", "project_id", "plan_version").order_by("-id"))
    tasks: dict[int, Counter] = {run.id: Counter() for run in runs}
    for run_id, status, n in (
        # Failed tasks of a plan a re-plan replaced are not retried.
        Task.objects.filter(run_id__in=run_ids)
        .exclude(set_aside_by_replan(F("run__plan_version")))
        .values_list("run_id", "status")
        .annotate(n=Count("id"))
        .order_by()
    ):
        tasks[run_id][status] = n
    facts = _facts(action, runs)
    preview = Preview(action=action)
    will, skipped, plans = Counter(), Counter(), {}
    for run in runs:
        if action == "compensate" and run.status in COMPENSABLE_FROM:
            plans[run.id] = compensation_plan(run.id)
        why = _why_not(action, run, *facts.get(run.id, ([], [], [])))
        if why:
            skipped[(run.status, why)] += 1
        else:
            will[run.status] += 1
            preview.eligible.append(run.id)
    preview.will = [(n, _label(status)) for status, n in will.most_common()]
    preview.skipped = [(n, _label(status), why) for (status, why), n in skipped.most_common()]
    operable = project_ids(user, "operate")
    if operable is not None:
        by_id = {run.id: run for run in runs}
        preview.not_operable = sum(1 for i in preview.eligible if by_id[i].project_id not in operable)
    chosen = [tasks[i] for i in preview.eligible]
    if action == "cancel":
        approvals = ApprovalRequest.objects.filter(
            run_id__in=preview.eligible, status=ApprovalRequest.Status.PENDING, parent=None
        ).count()
        open_tasks = sum(n for c in chosen for status, n in c.items() if status not in Task.TERMINAL)
        running = sum(c[Task.Status.RUNNING] for c in chosen)
        preview.effects = [
            (approvals, "pending approval requests withdrawn"),
            (open_tasks, f"tasks stopped ({running} running, which stop at their next step)"),
        ]
    elif action == "retry":
        preview.effects = [(sum(c[Task.Status.FAILED] for c in chosen), "failed tasks retried")]
    else:
        chosen_plans = [plans[i] for i in preview.eligible]
        preview.effects = [
            (sum(len(p["undo"]) for p in chosen_plans), "committed effects undone"),
            (
                sum(len(p["correct"]) for p in chosen_plans),
                "irreversible effects to correct (each correction waits for a reviewer)",
            ),
            (sum(len(p["cannot_undo"]) for p in chosen_plans), "effects that cannot be undone (no undo planned)"),
        ]
    return preview


def _facts(action: str, runs: list[Run]) -> dict[int, tuple[list, list, list]]:
    """What the refusals read, per run: (failed tasks of its plan, running task keys, unresolved operation
    ids), each fetched in one statement for the whole selection."""
    facts = {run.id: ([], [], []) for run in runs}
    ids = [run.id for run in runs]
    if action == "retry":
        plan = {run.id: run.plan_version for run in runs}
        for task in Task.objects.filter(run_id__in=ids, status=Task.Status.FAILED).only(
            "id", "run_id", "key", "status", "plan_version"
        ):
            if task.plan_version == plan[task.run_id]:
                facts[task.run_id][0].append(task)
    elif action == "compensate":
        for run_id, key in Task.objects.filter(run_id__in=ids, status=Task.Status.RUNNING).values_list("run_id", "key"):
            facts[run_id][1].append(key)
        unknown = ToolOperation.objects.filter(
            run_id__in=ids, status__in=UNKNOWN_OUTCOME, kind=ToolOperation.Kind.ACTION
        )
        # as compensation_unresolved: a question waiting for its answer changed nothing
        for run_id, op_id in unknown.exclude(tool=ASK).values_list("run_id", "id"):
            facts[run_id][2].append(op_id)
    return facts


@dataclass
class Outcome:
    run_id: int
    result: str  # done / skipped / failed
    message: str


class _Skip(Exception):
    """This run has nothing for the action to do."""


def _act(*, user, action: str, run: Run, reason: str, request) -> str:
    """Do ``action`` to one run the user may operate; return what was done. Raises domain errors."""
    who = {"actor": user, "via": "page", "request": request, "detail": {"bulk": True}}
    if action == "cancel":
        run_cancel(run_id=run.id, reason=reason, **who)
        return "cancelled"
    if action == "compensate":
        run_compensate(run_id=run.id, reason=reason, **who)
        return "compensation started"
    failed = list(
        Task.objects.filter(run_id=run.id, status=Task.Status.FAILED, plan_version=run.plan_version).values_list(
            "id", flat=True
        )
    )
    if not failed:
        raise _Skip("no failed task")
    done = 0
    for task_id in failed:
        try:
            task_retry(task_id=task_id, reason=reason, **who)
        except (WardenError, TransitionNotAllowed) as exc:
            raise WardenError(f"{done} of {len(failed)} failed tasks retried, then: {exc}") from exc
        done += 1
    return f"{done} failed task{'s' if done != 1 else ''} retried"


def bulk_apply(*, user, action: str, run_ids: list[int], reason: str, request=None) -> list[Outcome]:
    """Do ``action`` to each run of ``run_ids`` (the ids previewed, not a filter evaluated again)."""
    if len(run_ids) > MAX_RUNS:
        raise Refused(f"a bulk action acts on at most {MAX_RUNS} runs")
    runs = Run.objects.only("id", "status", "project_id", "plan_version").in_bulk(run_ids)
    outcomes = []
    for run_id in run_ids:
        run = runs.get(run_id)
        try:
            if run is None:
                raise NotFound(f"run {run_id} does not exist")
            authorize(user, run.project_id, "operate", what=f"run {run_id}", request=request)
        except (NotFound, Forbidden) as exc:
            outcomes.append(Outcome(run_id, "skipped", str(exc)))
            continue
        try:
            done = _act(user=user, action=action, run=run, reason=reason, request=request)
            outcomes.append(Outcome(run_id, "done", done))
        except _Skip as exc:
            outcomes.append(Outcome(run_id, "skipped", str(exc)))
        except (WardenError, TransitionNotAllowed) as exc:
            outcomes.append(Outcome(run_id, "failed", str(exc)))
    return outcomes
