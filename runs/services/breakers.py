"""The tasks a circuit breaker parked, and how they get going again.

A breaker (core/circuit.py) that refuses a task's call parks it: the task fails with the breaker's reason
and its run needs attention. The tasks go on when the breaker closes:

- by itself: after its open period it is half-open and the next call is its probe. When nothing calls the
  tool (its callers are parked), the sweeper makes that call by retrying one parked task; a probe that
  succeeds closes the breaker (announced on core.bus), and every other task it parked is retried, by a
  worker (an outbox message), or by the sweeper should that message be lost. Audited as the system's.
- by hand, from the inbox (dashboard/inbox.py): the person's own retries, of what they may operate.
"""

import logging
import time

from django.conf import settings
from django.db import transaction

from agents.gateway import BREAKER as MODEL_BREAKER
from core.circuit import CLOSED, HALF_OPEN, Breaker, BreakerRef
from core.errors import WardenError
from tenancy.models import Project
from tools.broker import BREAKER as TOOL_BREAKER

from ..selectors import ParkedTask, breakers_parked
from .outbox import outbox_add
from .runs import task_retry

log = logging.getLogger("warden.breakers")
BREAKERS: dict[str, Breaker] = {"tool": TOOL_BREAKER, "provider": MODEL_BREAKER}
RESUME = "resume_parked_tasks"  # the actor (runs/actors.py)
SWEEP_EVERY_SECONDS = 5.0  # the pass reads every failed task's reason: not on every sweep
_last_sweep = [0.0]


def breaker_label(ref: BreakerRef) -> str:
    """How a breaker is named to people: "the tool payments.get_charge of project payments"."""
    if ref.project_id is None:
        return f"the {ref.what} {ref.name}"
    slug = Project.objects.filter(id=ref.project_id).values_list("slug", flat=True).first()
    return f"the {ref.what} {ref.name} of project {slug or ref.project_id}"


def breaker_resume_parked(
    *, breaker: BreakerRef, reason: str, actor=None, via: str = "", request=None, project_ids=None
) -> list[int]:
    """Retry each task ``breaker`` parked (of the runs of ``project_ids`` only, when given), each retry
    audited as ``actor``'s (or the system's, ``via="system"``). Returns the tasks retried; one whose run
    moved on meanwhile is left as it is."""
    retried = []
    for parked in breakers_parked(breaker=breaker, project_ids=project_ids).get(breaker, []):
        if _retry(parked, breaker=breaker, reason=reason, actor=actor, via=via, request=request):
            retried.append(parked.task_id)
    return retried


def _retry(parked: ParkedTask, *, breaker: BreakerRef, reason: str, actor, via: str, request) -> bool:
    detail = {"breaker": f"{breaker.what}:{breaker.key}"}
    try:
        task_retry(task_id=parked.task_id, reason=reason, actor=actor, via=via, request=request, detail=detail)
    except WardenError as exc:
        log.info("task %s not resumed after %s: %s", parked.task_id, reason, exc)
        return False
    return True


def breaker_closed_heard(breaker: BreakerRef) -> None:
    """core.bus: a breaker closed by itself. Its tasks are retried by a worker, not by the caller whose
    call closed it (that call's step is under way)."""
    with transaction.atomic():
        outbox_add(actor=RESUME, kwargs={"what": breaker.what, "name": breaker.name, "project_id": breaker.project_id})


def breaker_resume_after_close(*, what: str, name: str, project_id: int | None) -> list[int]:
    """The actor's part: while the breaker is still closed, every task it parked is retried."""
    breaker = BREAKERS.get(what)
    if breaker is None or breaker.state(name, project_id=project_id).state != CLOSED:
        return []  # it opened again meanwhile: its tasks stay parked until the next close
    ref = breaker.ref(name, project_id)
    reason = f"{breaker_label(ref)}: its breaker closed by itself (a call succeeded)"
    return breaker_resume_parked(breaker=ref, reason=reason, via="system")


def breakers_sweep(now) -> dict:
    """The sweeper's pass, every few seconds: a half-open breaker whose tasks are all parked gets its
    probe (one parked task retried, once per open period); a closed breaker's parked tasks are retried (a
    lost message of the close, or a breaker whose state the cache lost)."""
    if time.monotonic() - _last_sweep[0] < max(SWEEP_EVERY_SECONDS, settings.WARDEN["SWEEP_INTERVAL_SECONDS"]):
        return {}
    _last_sweep[0] = time.monotonic()
    probed = resumed = 0
    for ref, tasks in breakers_parked().items():
        breaker = BREAKERS[ref.what]
        state = breaker.state(ref.name, project_id=ref.project_id).state
        if state == HALF_OPEN and breaker.probe_due(ref.name, project_id=ref.project_id):
            reason = f"{breaker_label(ref)}: a probe of its half-open breaker, after its open period"
            probed += any(_retry(t, breaker=ref, reason=reason, actor=None, via="system", request=None) for t in tasks)
        elif state == CLOSED:
            reason = f"{breaker_label(ref)}: its breaker is closed"
            resumed += len(breaker_resume_parked(breaker=ref, reason=reason, via="system"))
    return {"breaker_probes": probed, "breaker_tasks_resumed": resumed}
