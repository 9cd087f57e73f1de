"""Everything waiting for a person, across the projects they can see: the "needs you" inbox.

One list for the page (/inbox/), the API (GET /api/v1/inbox) and the counts in the nav. Each kind is
listed only to those who may act on it: approvals to people who may decide them (not the run's starter),
ambiguous operations, runs needing attention and blackboard entries to operators, open breakers (shared
by every project) to operators of any project, rule changes to the other admins of their project.
Nothing here changes anything.
"""

import logging
from dataclasses import dataclass, fields
from datetime import datetime

from django.db.models import QuerySet
from django.urls import reverse
from django.utils import timezone

from agents.gateway import BREAKER as MODEL_BREAKER
from approvals.governance import change_requests_pending
from approvals.models import ApprovalRequest
from approvals.services import decider_refusal
from core.errors import Forbidden, NotFound, WardenError
from runs.models import BlackboardEntry, Run, Task
from runs.services import task_retry
from tenancy.access import project_ids
from tenancy.audit import audit
from tenancy.models import Project
from tools.broker import BREAKER as TOOL_BREAKER
from tools.broker import breaker_reason
from tools.models import ToolOperation

from .views.questions import pending_questions, question_card

KINDS = {
    "approval": "Approvals to decide",
    "question": "Questions from agents",
    "operation": "Ambiguous operations to resolve",
    "run": "Runs needing attention",
    "breaker": "Open breakers",
    "blackboard": "Blackboard entries to verify",
    "change": "Rule changes to approve",
}
log = logging.getLogger("warden.inbox")
LIMIT = 200  # per kind: an inbox longer than this is an incident, and the counts still say how many


@dataclass
class Item:
    kind: str
    id: str
    title: str
    detail: str
    since: datetime | None
    url: str
    project: str = ""
    run_id: int | None = None
    card: dict | None = None  # a question's card context, for the page only

    def as_json(self) -> dict:
        data = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "card"}
        return {**data, "since": self.since.isoformat() if self.since else None}


def _rows(rows: QuerySet, user, action: str, project: Project | None, *, field: str = "run__project") -> QuerySet:
    """``rows`` of the projects where ``user`` may ``action`` (and of ``project`` alone, when one is chosen)."""
    allowed = project_ids(user, action)
    rows = rows if allowed is None else rows.filter(**{f"{field}_id__in": allowed})
    return rows if project is None else rows.filter(**{field: project})


def _item(kind: str, row, run: Run, title: str, detail: str, since, url: str) -> Item:
    return Item(kind, str(row.id), title, detail, since, url, run.project.slug, run.id)


def _approvals(user, project: Project | None) -> list[Item]:
    rows = _rows(ApprovalRequest.objects.filter(status="pending", parent=None), user, "decide", project)
    rows = rows.select_related("run__project", "run__workflow", "policy").order_by("requested_at", "id")
    return [
        _item(
            "approval",
            r,
            r.run,
            f"{r.get_kind_display()} in run {r.run_id} ({r.run.workflow.slug})",
            r.summary[:200],
            r.requested_at,
            f"{reverse('approvals-queue')}#request-{r.id}",
        )  # fmt: skip
        for r in rows[:LIMIT]
        # one who may not decide it sees it on the queue, with the reason, but it does not wait for them
        if not decider_refusal(r, run=r.run, user=user)
    ]


def _operations(user, project: Project | None) -> list[Item]:
    rows = _rows(ToolOperation.objects.filter(status=ToolOperation.Status.AMBIGUOUS), user, "operate", project)
    return [
        _item(
            "operation",
            op,
            op.run,
            f"{op.tool} in run {op.run_id} may or may not have happened",
            op.status_reason[:300] or op.idempotency_key,
            op.ended_at or op.started_at or op.created_at,
            reverse("runs:operation-resolve", args=[op.run_id, op.id]),
        )  # fmt: skip
        for op in rows.select_related("run__project").order_by("id")[:LIMIT]
    ]


def _runs(user, project: Project | None) -> list[Item]:
    rows = _rows(Run.objects.filter(status=Run.Status.NEEDS_ATTENTION), user, "operate", project, field="project")
    return [
        _item(
            "run",
            run,
            run,
            f"Run {run.id} ({run.workflow.slug}) needs attention",
            run.status_reason[:300],
            run.started_at or run.created_at,
            reverse("runs:detail", args=[run.id]),
        )  # fmt: skip
        for run in rows.select_related("project", "workflow").order_by("id")[:LIMIT]
    ]


def _blackboard(user, project: Project | None) -> list[Item]:
    unverified = BlackboardEntry.objects.filter(verification=BlackboardEntry.Verification.UNVERIFIED)
    rows = _rows(unverified.exclude(run__status__in=Run.TERMINAL), user, "operate", project)
    return [
        _item(
            "blackboard",
            e,
            e.run,
            f"{e.key} v{e.version} in run {e.run_id} is unverified",
            str(e.value)[:200],
            e.created_at,
            reverse("runs:blackboard-decide", args=[e.run_id, e.id]),
        )  # fmt: skip
        for e in rows.select_related("run__project").order_by("created_at", "id")[:LIMIT]
    ]


def _breakers(user, project: Project | None) -> list[Item]:
    if project is not None or project_ids(user, "operate") == []:
        return []  # breakers belong to no project
    now = timezone.now()
    items = []
    for what, breaker in (("tool", TOOL_BREAKER), ("provider", MODEL_BREAKER)):
        for name, left in breaker.open_now():
            items.append(
                Item(
                    "breaker",
                    f"{what}:{name}",
                    f"The {what} {name} is failing: its breaker is open",
                    f"calls to it are refused for another {left:.0f}s",
                    now,
                    reverse("inbox-breaker-close", args=[what, name]),
                )  # fmt: skip
            )
    return items


def _questions(user, project: Project | None) -> list[Item]:
    rows = _rows(pending_questions(user), user, "decide", project)
    items = []
    for q in rows[:LIMIT]:
        card = question_card(q, user)
        if card["refusal"]:
            continue
        item = _item("question", q, q.run, f"Run {q.run_id} ({q.run.workflow.slug}) asks: {q.text[:120]}",
                     q.text[:300], q.created_at, f"{reverse('inbox')}?kind=question#question-{q.id}")  # fmt: skip
        item.card = card  # answered in place on the inbox page
        items.append(item)
    return items


def _changes(user, project: Project | None) -> list[Item]:
    """Change requests of the projects ``user`` administers that they may decide (not their own)."""
    return [
        Item(
            "change",
            str(c.id),
            f"{c.requested_by} asks to {c.action} {c.label} in project {c.project.slug}",
            "; ".join(c.loosens)[:300],
            c.requested_at,
            f"{reverse('approvals-queue')}#change-{c.id}",
            c.project.slug,
        )
        for c in change_requests_pending(user, project=project).exclude(requested_by=user)[:LIMIT]
    ]


_SOURCES = {
    "approval": _approvals,
    "question": _questions,
    "operation": _operations,
    "run": _runs,
    "breaker": _breakers,
    "blackboard": _blackboard,
    "change": _changes,
}


def inbox_items(user, *, project: Project | None = None, kind: str = "") -> list[Item]:
    """What waits for ``user``, oldest first within each kind, kinds in the order of KINDS."""
    if not user.is_authenticated or not user.is_active:
        return []
    kinds = [kind] if kind else list(KINDS)
    return [item for k in kinds for item in _SOURCES[k](user, project)]


def inbox_counts(user) -> dict[str, int]:
    counts = dict.fromkeys(KINDS, 0)
    for item in inbox_items(user):
        counts[item.kind] += 1
    return counts


def breaker_close(*, user, what: str, name: str, request=None) -> None:
    """Close an open breaker by hand (the system behind it is back): audited. A breaker is shared by every
    project, so closing it is for project admins."""
    breaker = {"tool": TOOL_BREAKER, "provider": MODEL_BREAKER}.get(what)
    if breaker is None or not breaker.open_for(name):
        raise NotFound(f"no open breaker for the {what} {name}")
    if project_ids(user, "administer") == []:
        audit(actor=user, action="breaker_close", outcome="denied", target=f"{what}:{name}", request=request,
              detail={"why": "not a project admin"})  # fmt: skip
        raise Forbidden("only a project admin may close a breaker (it is shared by every project)")
    breaker.reset([name])
    audit(actor=user, action="breaker_close", target=f"{what}:{name}", request=request)
    _resume_parked(user, what, name, request)


def _resume_parked(user, what: str, name: str, request) -> None:
    """The tasks the open breaker parked get another attempt, and their runs go on (each retry audited)."""
    parked = Task.objects.filter(
        status=Task.Status.FAILED,
        failure_class__in=[Task.FailureClass.BREAKER, Task.FailureClass.PROVIDER],
        run__status=Run.Status.NEEDS_ATTENTION,
        status_reason__startswith=breaker_reason(what, name, 0).split(":")[0] + ":",
    ).values_list("id", flat=True)
    for task_id in list(parked):
        try:
            task_retry(task_id=task_id, reason=f"the {what} {name}'s breaker was closed", actor=user, request=request)
        except WardenError as exc:  # the run moved on meanwhile: nothing of the breaker's to resume
            log.info("task %s not resumed after the %s %s's breaker closed: %s", task_id, what, name, exc)
