"""Everything waiting for a person, across the projects they can see: the "needs you" inbox.

One list for the page (/inbox/), the API (GET /api/v1/inbox) and the counts in the nav. Each kind is
listed only to those who may act on it: approvals to people who may decide them (not the run's starter),
ambiguous operations, runs needing attention and blackboard entries to operators, breakers to those who
operate where they act (a project's own tool's to that project's operators, the deployment's to operators
of any project), rule changes to the other admins of their project. Nothing here changes anything but
breaker_close.
"""

import logging
from dataclasses import dataclass, fields
from datetime import UTC, datetime

from django.db.models import QuerySet
from django.urls import reverse
from django.utils import timezone

from approvals.governance import change_requests_pending
from approvals.models import ApprovalRequest
from approvals.services import decider_refusal
from core.circuit import CLOSED, HALF_OPEN, OPEN, BreakerRef
from core.errors import Forbidden, NotFound
from runs.models import BlackboardEntry, Run
from runs.selectors import breakers_parked
from runs.services.breakers import BREAKERS, breaker_resume_parked
from tenancy.access import ACTIONS, project_ids, role_of
from tenancy.audit import audit
from tenancy.models import Project
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


# --- breakers ----------------------------------------------------------------------------------------------


@dataclass
class BreakerRow:
    """A breaker as a person may see it: open, half-open, or closed with tasks it parked still waiting."""

    ref: BreakerRef
    project: str  # the slug of the project whose own tool it is; "" for the deployment's
    state: str  # open, half_open, closed
    seconds_left: float
    parked: int  # tasks it parked, of the projects the person may operate
    since: datetime

    @property
    def id(self) -> str:
        return ":".join([self.ref.what, *([self.project] if self.project else []), self.ref.name])

    @property
    def label(self) -> str:
        return f"{self.ref.what} {self.ref.name}" + (f" of project {self.project}" if self.project else "")

    @property
    def close_url(self) -> str:
        args = [self.ref.what, *([self.project] if self.project else []), self.ref.name]
        return reverse("inbox-breaker-close-project" if self.project else "inbox-breaker-close", args=args)

    @property
    def title(self) -> str:
        if self.state == CLOSED:
            return f"The {self.label}: its breaker closed, the tasks it parked wait"
        return f"The {self.label} is failing: its breaker is {'open' if self.state == OPEN else 'half-open'}"

    @property
    def detail(self) -> str:
        parked = f"{self.parked} task{'' if self.parked == 1 else 's'} parked"
        if self.state == OPEN:
            return f"calls to it are refused for another {self.seconds_left:.0f}s; {parked}"
        if self.state == HALF_OPEN:
            return f"its open period is over: the next call probes it; {parked}"
        return f"{parked}: closing it here resumes them"


def breakers_visible(user, project: Project | None = None) -> list[BreakerRow]:
    """Open and half-open breakers, and closed ones whose parked tasks still wait, that ``user`` may see:
    a project's own tool's to the operators and admins of that project, the deployment's (registry tools,
    model providers) to whoever operates some project, counting only their projects' parked tasks.
    ``project``: its own breakers, and the deployment's that parked its tasks. Three queries (the person's
    projects, the parked tasks, the projects' slugs) and the shared cache."""
    operate = project_ids(user, "operate")
    if project is not None:
        operate = [project.id] if operate is None or project.id in operate else []
    if operate == []:
        return []
    parked = breakers_parked(project_ids=operate)
    states = {s.ref: s for breaker in BREAKERS.values() for s in breaker.open_now()}
    shown = set(parked) | {ref for ref in states if _may_see(ref, operate, project)}
    slugs = dict(Project.objects.filter(id__in={r.project_id for r in shown if r.project_id}).values_list("id", "slug"))
    rows = []
    for ref in shown:
        state = states.get(ref) or BREAKERS[ref.what].state(ref.name, project_id=ref.project_id)
        tasks = parked.get(ref, [])
        opened = datetime.fromtimestamp(state.opened_at, tz=UTC) if state.opened_at else None
        since = opened or (tasks[0].since if tasks else None) or timezone.now()
        rows.append(BreakerRow(ref, slugs.get(ref.project_id, ""), state.state, state.seconds_left, len(tasks), since))
    return sorted(rows, key=lambda r: (r.project, r.ref.what, r.ref.name))


def _may_see(ref: BreakerRef, operate: list[int] | None, project: Project | None) -> bool:
    """An open breaker that parked none of the person's tasks: a project's own to its operators; the
    deployment's to every operator, unless a project is chosen (then only if it parked its tasks)."""
    if ref.project_id is None:
        return project is None
    return operate is None or ref.project_id in operate


def breaker_close(*, user, what: str, name: str, project: str = "", request=None) -> list[int]:
    """Close a breaker by hand (the system behind it is back) and resume the tasks it parked, audited.
    A project's own tool's breaker (``project``: its slug) is closed by an admin of that project and
    resumes that project's tasks; the deployment's (a registry tool's, a provider's) by a superuser, and
    resumes every task it parked. One who may not see it is told it does not exist. Returns the tasks
    retried."""
    try:
        row = _breaker_seen(user, what, name, project)
    except NotFound as exc:  # recorded for the project's people (the refused never see the audit log there)
        pid = Project.objects.filter(slug=project).values_list("id", flat=True).first() if project else None
        audit(actor=user, action="breaker_close", outcome="denied", target=":".join([what, project, name] if project
              else [what, name]), project_id=pid, request=request, detail={"why": str(exc)})  # fmt: skip
        raise
    ref = row.ref
    if ref.project_id is None and not user.is_superuser:
        why = "the deployment's breakers are closed by a superuser (every project shares them)"
    elif ref.project_id is not None and role_of(user, ref.project_id) not in ACTIONS["administer"][0]:
        why = f"only an admin of project {row.project} may close its breakers"
    else:
        why = ""
    if why:
        audit(actor=user, action="breaker_close", outcome="denied", target=row.id, project_id=ref.project_id,
              request=request, detail={"why": why})  # fmt: skip
        raise Forbidden(why)
    BREAKERS[what].reset([name], project_id=ref.project_id)
    audit(actor=user, action="breaker_close", target=row.id, project_id=ref.project_id, request=request,
          detail={"state": row.state, "parked": row.parked})  # fmt: skip
    reason = f"the {row.label}'s breaker was closed"
    return breaker_resume_parked(breaker=ref, reason=reason, actor=user, request=request)


def _breaker_seen(user, what: str, name: str, project: str) -> BreakerRow:
    """The breaker as ``user`` sees it in the inbox, or NotFound (none such, nothing open nor parked, or
    not theirs to see: the same answer)."""
    if what not in BREAKERS:
        raise NotFound(f"there is no {what!r} breaker: a breaker is a tool's or a provider's")
    if project and what != "tool":
        raise NotFound(f"a {what}'s breaker is the deployment's, not a project's")
    found = Project.objects.filter(slug=project).first() if project else None
    if project and found is None:
        raise NotFound(f"no open breaker for the tool {name} of project {project}")
    ref = BreakerRef(what, name, found.id if found else None)
    for row in breakers_visible(user, found):
        if row.ref == ref:
            return row
    raise NotFound(f"no open breaker for the {what} {name}" + (f" of project {project}" if project else ""))
