"""The circuit breakers a person may see, for the inbox, the workers page and the breaker's close action:
open, half-open, or closed with tasks it parked still waiting."""

from dataclasses import dataclass
from datetime import UTC, datetime

from django.urls import reverse
from django.utils import timezone

from core.circuit import CLOSED, HALF_OPEN, OPEN, BreakerRef
from core.errors import NotFound
from runs.services.breakers import BREAKERS
from tenancy.access import project_ids
from tenancy.models import Project

from . import breakers_parked


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


def breaker_seen(user, *, what: str, name: str, project: str) -> BreakerRow:
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
