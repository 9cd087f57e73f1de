"""Forking a run from a task's step: a new run that inherits the journal up to that step and the receipts of
every committed effect, so that nothing which happened is done again; and the preview read before it.

What the fork takes from its source (the rule, written once here):

- **The forked task**: its journal steps 1..N-1, replayed; steps N.. run afresh in the next journal epoch,
  under the fork's own keys (the run id is in every key).
- **The tasks that depend on it**, directly or not: they start over, with an empty journal (their input
  changes), also in the next epoch.
- **Every other task, as it stands**: a completed one stays completed with its artifacts and journal and never
  runs; one that had not completed keeps its whole journal and goes on from its last step, as a plain retry.
- **The receipts of every committed write** of those tasks, copied into the fork's ledger
  (``ToolOperation.inherited_from``). A step that is replayed never reaches the broker; a step run afresh
  that asks for the same call (same tool, same arguments) at the same step is answered by the receipt
  (tools/broker.py ``earlier_receipt``), as a retry from a step is. The fork never compensates them: the
  run that made an effect undoes it.

Not carried: the blackboard, proposals that were never executed, approval requests, and the usage figures
(the fork counts what it spends). The source must be settled (runs/refusals.py ``run_fork_refusal``).
"""

from django.conf import settings
from django.utils import timezone

from agents.models import Workflow
from core.errors import InvalidInput, NotFound
from tenancy.audit import audited
from tools.broker import idempotency_key
from tools.installation import run_key_prefix
from tools.ledger import operations_inherit
from tools.models import SealedArguments, ToolOperation
from tools.transitions import UNKNOWN_OUTCOME

from ..models import Artifact, Payload, Run, Span, Task
from ..refusals import run_fork_refusal
from ..selectors import run_workflow_settings
from .outbox import outbox_add
from .runs import EXECUTE

OS = ToolOperation.Status
# A task's fields the fork copies as they are: what it is asked and what it may spend.
_TASK_FIELDS = ("key", "agent_id", "agent_version_id", "objective", "depends_on", "allowed_tools", "output_schema",
                "depth", "plan_version", "max_attempts", "max_steps", "max_tokens", "max_tool_calls",
                "max_cost_micros", "max_seconds")  # fmt: skip


def _downstream(tasks: list[Task], key: str) -> set[str]:
    """The keys of the tasks that depend on ``key``, directly or through others."""
    found, frontier = set(), {key}
    while frontier:
        frontier = {t.key for t in tasks if t.key not in found and frontier & set(t.depends_on)}
        found |= frontier
    return found


def _last_steps(task_ids) -> dict[int, int]:
    rows = Span.objects.filter(task_id__in=list(task_ids), step__isnull=False).values_list("task_id", "step")
    last: dict[int, int] = {}
    for task_id, step in rows:
        last[task_id] = max(step, last.get(task_id, 0))
    return last


class _Plan:
    """What the fork does with each task of the source: read once, used by the preview and the fork."""

    def __init__(self, run: Run, task_key: str, step: int):
        self.run, self.step = run, step
        self.tasks = list(run.tasks.select_related("agent").order_by("id"))
        self.task = next((t for t in self.tasks if t.key == task_key), None)
        self.last = _last_steps(t.id for t in self.tasks)
        current = [t for t in self.tasks if t.plan_version >= run.plan_version or t.status == Task.Status.COMPLETED]
        self.rewound = {task_key} | _downstream(current, task_key) if self.task else set()
        self.writes = list(
            ToolOperation.objects.filter(
                run_id=run.id, kind=ToolOperation.Kind.ACTION, status=OS.COMMITTED, task__isnull=False
            )
            .exclude(tool_class=ToolOperation.ToolClass.READ_ONLY)
            .select_related("task")
            .order_by("id")
        )
        self.refusal = run_fork_refusal(
            run,
            self.task,
            task_key=task_key,
            step=step,
            last=self.last.get(self.task.id, 0) if self.task else 0,
            running=[t.key for t in self.tasks if t.status == Task.Status.RUNNING],
            unresolved=list(ToolOperation.objects.filter(run_id=run.id, status__in=UNKNOWN_OUTCOME)),
            external=run_workflow_settings(run).planner == Workflow.Planner.EXTERNAL,
        )

    def fate(self, task: Task) -> str:
        """forked, starts_over, completed, continues, or stays (a task of a plan that was replaced)."""
        if task.key == self.task.key:
            return "forked"
        if task.key in self.rewound:
            return "starts_over"
        if task.status == Task.Status.COMPLETED:
            return "completed"
        if task.plan_version < self.run.plan_version:
            return "stays"
        return "continues"

    def replayed_until(self, task: Task) -> int:
        """The last journal step of ``task`` the fork keeps (0: none)."""
        fate = self.fate(task)
        if fate == "forked":
            return self.step - 1
        if fate in ("starts_over", "stays"):
            return 0
        return self.last.get(task.id, 0)


def run_fork_preview(*, run_id: int, task_key: str, step: int, strict: bool = False) -> dict:
    """What forking run ``run_id`` at ``task_key``'s step ``step`` would do, changing nothing: each task's
    fate, the journal steps replayed, the calls the new run would make anew (as the source made them: a
    model asked again may ask otherwise) and the committed effects it inherits, not to be repeated — and, if
    the fork would be refused now, why. ``strict``: a refusal of the input itself (an unknown task, a step
    out of range) is raised rather than reported."""
    run = Run.objects.select_related("workflow").filter(id=run_id).first()
    if run is None:
        raise NotFound(f"run {run_id} does not exist")
    plan = _Plan(run, task_key, step)
    if strict and isinstance(plan.refusal, InvalidInput):
        raise plan.refusal
    preview = {"run_id": run.id, "task": task_key, "step": step, "refusal": str(plan.refusal or "")}
    if plan.task is None:
        return {**preview, "tasks": [], "replayed": [], "new_calls": [], "inherited_effects": []}
    journal = Span.objects.filter(task_id=plan.task.id, step__isnull=False, step__lt=step).order_by("step")
    fates = {t.id: plan.fate(t) for t in plan.tasks}
    kept = {t.id: plan.replayed_until(t) for t in plan.tasks}
    answering = {(op.task_id, op.step): op.id for op in plan.writes}  # the latest write of a step answers it
    inherited = [
        {
            "task": op.task.key,
            "step": op.step,
            "tool": op.tool,
            "reversibility": op.reversibility,
            "idempotency_key": op.idempotency_key,
            "operation": op.id,
            "replayed": op.step is not None and op.step <= kept[op.task_id],
            "answers_again": op.step is not None
            and op.step > kept[op.task_id]
            and answering[op.task_id, op.step] == op.id,
        }
        for op in plan.writes
        if fates[op.task_id] != "stays"
    ]
    return {
        **preview,
        "tasks": [
            {"key": t.key, "status": t.status, "fate": fates[t.id], "replayed_until": kept[t.id]} for t in plan.tasks
        ],
        "replayed": [{"step": s.step, "kind": s.kind, "name": s.name} for s in journal],
        "new_calls": _new_calls(plan, fates, kept, answering),
        "inherited_effects": inherited,
    }


def _new_calls(plan: _Plan, fates: dict, kept: dict, answering: dict) -> list[dict]:
    """The source's calls at the steps the fork runs again that its receipts will not answer: reads, writes
    that did not commit, and those of tasks that go on from their last step. One per step, the latest."""
    ops = (
        ToolOperation.objects.filter(run_id=plan.run.id, kind=ToolOperation.Kind.ACTION, task__isnull=False)
        .select_related("task")
        .order_by("id")
    )
    latest = {}
    for op in ops:
        if fates[op.task_id] in ("completed", "stays") or op.step is None or op.step <= kept[op.task_id]:
            continue
        latest[op.task_id, op.step] = op
    calls = []
    for (task_id, step), op in sorted(latest.items(), key=lambda item: (item[1].task_id, item[0][1])):
        if (task_id, step) in answering:
            continue  # its receipt answers the same call
        calls.append(
            {"task": op.task.key, "step": step, "tool": op.tool, "status_in_source": op.status, "operation": op.id}
        )
    return calls


def run_fork(
    *, run_id: int, task_key: str, step: int, reason: str = "", actor=None, via: str = "", request=None
) -> Run:
    """A new run forked from run ``run_id`` at task ``task_key``'s step ``step``, by the rule above; its
    ready tasks are sent to the workers. Refused, changing nothing, by ``run_fork_refusal``. Audited on the
    source run (``actor``, ``via``), with the new run, the steps replayed and the receipts inherited."""
    now = timezone.now()
    who = {"actor": actor, "via": via, "request": request}
    detail = {"task": task_key, "step": step, "reason": reason[:1000]}
    with audited("run_fork", **who, target=f"run {run_id}", run_id=run_id, detail=detail) as act:
        source = Run.objects.select_for_update().select_related("workflow").filter(id=run_id).first()
        if source is None:
            raise NotFound(f"run {run_id} does not exist")
        act.update(project_id=source.project_id)
        plan = _Plan(source, task_key, step)
        if plan.refusal is not None:
            raise plan.refusal
        fork = _fork_run(source, plan, actor=actor, now=now)
        tasks = _fork_tasks(fork, plan, now=now)
        _fork_journal(fork, plan, tasks, now=now)
        inherited = _fork_ledger(fork, plan, tasks)
        _fork_span(fork, plan, reason=reason, now=now)
        for task in tasks.values():
            if task.status == Task.Status.READY:
                outbox_add(actor=EXECUTE, kwargs={"run_id": fork.id, "task_id": task.id})
        act["detail"] = {
            **act["detail"],
            "fork": fork.id,
            "replayed_until": step - 1,
            "inherited_operations": [op.inherited_from_id for op in inherited],
        }
    return fork


def _fork_run(source: Run, plan: _Plan, *, actor, now) -> Run:
    deadline = None
    if source.deadline and source.started_at:  # as long as the source had, from now
        deadline = now + (source.deadline - source.started_at)
    fork = Run.objects.create(
        workflow_id=source.workflow_id,
        project_id=source.project_id,
        goal=source.goal,
        input=source.input,
        versions=source.versions,
        workflow_version_id=source.workflow_version_id,  # the fork goes on as its source started
        status=Run.Status.RUNNING,
        plan_version=source.plan_version,
        max_steps=source.max_steps,
        max_tokens=source.max_tokens,
        max_tool_calls=source.max_tool_calls,
        max_cost_micros=source.max_cost_micros,
        deadline=deadline,
        started_at=now,
        started_by=actor if getattr(actor, "pk", None) else None,
        code_version=settings.WARDEN["CODE_VERSION"],
        forked_from=source,
        forked_task=plan.task.key,
        forked_step=plan.step,
    )
    Span.objects.create(
        run=fork, kind=Span.Kind.RUN, name=f"run {source.workflow.slug}", status=Span.Status.RUNNING, started_at=now
    )
    return fork


def _fork_tasks(fork: Run, plan: _Plan, *, now) -> dict[int, Task]:
    """The fork's tasks, by the source task's id: created, then linked to their dependents."""
    completed = {t.key for t in plan.tasks if plan.fate(t) == "completed"}
    rows = []
    for src in plan.tasks:
        fate = plan.fate(src)
        kept = fate in ("completed", "stays")
        waiting = 0 if kept else len([d for d in src.depends_on if d not in completed])
        # A new row's first status, as tasks_create gives one: the source's for a task kept as it stands.
        first = src.status if kept else Task.Status.PENDING if waiting else Task.Status.READY
        task = Task(run=fork, status=first, **{name: getattr(src, name) for name in _TASK_FIELDS})
        task.journal_epoch = src.journal_epoch + 1 if fate in ("forked", "starts_over") else src.journal_epoch
        if kept:
            task.attempts = src.attempts
            task.started_at, task.finished_at = src.started_at, src.finished_at
            task.status_reason = f"inherited from run {plan.run.id}"
        else:
            # A task with a journal to replay is claimed as a later attempt (a first claim starts blank).
            task.attempts = 0 if fate == "starts_over" else src.attempts
            task.max_attempts = max(src.max_attempts, task.attempts + 1)
            task.pending_deps = waiting
            task.ready_at = None if waiting else now
            task.started_at = src.started_at if task.attempts else None
        rows.append(task)
    created = Task.objects.bulk_create(rows)
    by_key = {t.key: t for t in created}
    for task in created:
        for dep in task.depends_on:
            if dep in by_key:
                by_key[dep].dependents = [*by_key[dep].dependents, task.id]
    Task.objects.bulk_update([t for t in created if t.dependents], ["dependents"])
    return {src.id: new for src, new in zip(plan.tasks, created, strict=True)}


def _fork_journal(fork: Run, plan: _Plan, tasks: dict[int, Task], *, now) -> None:
    """Each task's kept journal steps (under a task span of its own), its sealed secrets and, for a
    completed task, its artifacts."""
    root = Span.objects.filter(run=fork, kind=Span.Kind.RUN).values_list("id", flat=True).get()
    for src in plan.tasks:
        task, until = tasks[src.id], plan.replayed_until(src)
        if task.attempts == 0:
            continue  # claimed fresh: the first claim opens its task span
        done = task.status in Task.TERMINAL
        parent = Span.objects.create(
            run=fork,
            task=task,
            parent_id=root,
            kind=Span.Kind.TASK,
            name=f"task {task.key}",
            status=Span.Status.OK if task.status == Task.Status.COMPLETED else Span.Status.RUNNING,
            started_at=src.started_at or now,
            ended_at=(src.finished_at or now) if done else None,
            attributes={"agent": task.agent_id, "inherited_from": {"run": plan.run.id, "task": src.id}},
        )
        journal = Span.objects.filter(task_id=src.id, step__isnull=False, step__lte=until).select_related("payload")
        Span.objects.bulk_create([_copy_step(span, fork, task, parent.id) for span in journal.order_by("step")])
        sealed = SealedArguments.objects.filter(task_id=src.id, step__lte=until + 1)
        SealedArguments.objects.bulk_create([SealedArguments(task=task, step=s.step, values=s.values) for s in sealed])
        if task.status == Task.Status.COMPLETED:
            Artifact.objects.bulk_create(
                [
                    Artifact(
                        run=fork,
                        task=task,
                        key=a.key,
                        schema=a.schema,
                        content=a.content,
                        provenance={**a.provenance, "inherited_from": {"run": plan.run.id, "artifact": a.id}},
                        verification=a.verification,
                        version=a.version,
                    )
                    for a in Artifact.objects.filter(task_id=src.id).order_by("version")
                ]
            )


def _copy_step(span: Span, fork: Run, task: Task, parent_id: int) -> Span:
    """A journal entry as the fork replays it; its cost was the source's, so it counts nothing here."""
    payload = None
    if span.payload_id is not None:  # a payload of its own: the source's may be pruned with the source
        payload = Payload.objects.create(body=span.payload.body, size=span.payload.size)
    return Span(
        run=fork,
        task=task,
        parent_id=parent_id,
        kind=span.kind,
        name=span.name,
        status=span.status,
        attempt=span.attempt,
        step=span.step,
        started_at=span.started_at,
        ended_at=span.ended_at,
        attributes={**(span.attributes or {}), "inherited_from": {"run": span.run_id, "span": span.id}},
        body=span.body,
        payload=payload,
    )


def _fork_ledger(fork: Run, plan: _Plan, tasks: dict[int, Task]) -> list[ToolOperation]:
    """The committed writes, as receipts under the fork's keys (same task, step and epoch suffix)."""
    old, new = run_key_prefix(plan.run.id), run_key_prefix(fork.id)

    def key_of(op: ToolOperation) -> str:
        if op.idempotency_key.startswith(old):
            return new + op.idempotency_key.removeprefix(old)
        return f"{idempotency_key(run_id=fork.id, task_key=op.task.key, step=op.step or 0)}:op{op.id}"

    sources = [op for op in plan.writes if op.task_id in tasks and plan.fate(op.task) != "stays"]
    return operations_inherit(
        sources=sources, run_id=fork.id, task_ids={k: v.id for k, v in tasks.items()}, key_of=key_of
    )


def _fork_span(fork: Run, plan: _Plan, *, reason: str, now) -> None:
    """The trace's record of where the fork came from (and, on the source, where it went)."""
    attributes = {"run": plan.run.id, "task": plan.task.key, "step": plan.step, "reason": reason[:2000]}
    Span.objects.create(
        run=fork,
        kind=Span.Kind.RECOVERY,
        name=f"forked from run {plan.run.id} at {plan.task.key} step {plan.step}",
        started_at=now,
        ended_at=now,
        attributes=attributes,
    )
