"""Everything waiting for a person, across the projects they can see: the "needs you" inbox.

One list for the page (/inbox/), the API (GET /api/v1/inbox) and the counts in the nav. Each kind is
listed only to those who may act on it: approvals to people who may decide them (not the run's starter),
ambiguous operations, runs needing attention and blackboard entries to operators, breakers to those who
operate where they act (a project's own tool's to that project's operators, the deployment's to operators
of any project), rule changes to the other admins of their project. Reads only: a breaker is closed by
dashboard/inbox.py, a question answered by approvals.questions.
"""

import logging
from dataclasses import dataclass, fields
from datetime import datetime

from django.db.models import QuerySet
from django.urls import reverse

from approvals.governance import change_requests_pending
from approvals.services import decider_refusal
from policy.models import ApprovalRequest
from runs.models import BlackboardEntry, Run
from runs.selectors.breakers import breakers_visible
from tenancy.access import project_ids
from tenancy.models import Project
from tools.models import ToolOperation

from .questions import pending_questions, question_card

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
        if decider_refusal(r, run=r.run, user=user) is None
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
    return [
        Item("breaker", row.id, row.title, row.detail, row.since, row.close_url, row.project)
        for row in breakers_visible(user, project)
    ]


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
