"""Run-level services: start, cancel, resume, retry. The API, the admin and the actors all call these."""

import copy
import logging

from django.conf import settings
from django.db import transaction
from django.utils import timezone
from pydantic import ValidationError

from agents.models import Agent, AgentVersion, ModelVersion, Workflow, WorkflowVersion
from agents.planning import plan_validate, pydantic_errors
from agents.versions import WORKFLOW_FIELDS, agent_version, version_ref, with_latest_version, workflow_version
from core import bus, hooks, metrics
from core.errors import InvalidInput
from policy.services import approvals_withdraw, policies_in_force
from tenancy.access import default_project
from tenancy.audit import audit, audited
from tools.broker import operations_withdrawn

from ..models import Run, Span, Task
from ..refusals import run_cancel_refusal, run_resume_refusal, task_retry_refusal
from ..schemas import PLAN_OUTPUT_SCHEMA, BudgetIn, RunInputIn
from ..transitions import RUN, TASK
from . import sql
from .outbox import outbox_add

EXECUTE = "execute_task"
log = logging.getLogger("warden.runs")


def run_transition(*, run: Run, to: str, reason: str = "", now=None) -> Run:
    """Apply a run transition. Call inside transaction.atomic() with ``run`` locked (select_for_update)."""
    now = now or timezone.now()
    log.info("run %s: %s -> %s (%s)", run.id, run.status, to, reason)
    RUN.assign(run, to, status_reason=reason)  # checks the move; the statement below writes it
    bus.run_changed(run.id)
    changes = {"status": to, "status_reason": reason}
    if to in Run.TERMINAL:
        run.finished_at = changes["finished_at"] = now
    if to == Run.Status.CANCELLING:
        run.cancel_requested_at = changes["cancel_requested_at"] = now
    # Hand-written: a transition ends every run, and the ORM's save costs more than the rest of it.
    statement = f"UPDATE runs_run SET {', '.join(f'{column} = %s' for column in changes)} WHERE id = %s"
    params = [sql.ts(v) if column.endswith("_at") else v for column, v in changes.items()] + [run.id]
    if to in Run.TERMINAL:
        transaction.on_commit(metrics.RUNS_FINISHED.labels(to).inc)
        statement, params = sql.with_root_span_end(
            statement, params, run_id=run.id, now=now, ok=to == Run.Status.COMPLETED
        )
    sql.execute(statement, params)
    if to in Run.TERMINAL or to == Run.Status.NEEDS_ATTENTION:
        replay = run.mode != Run.Mode.LIVE
        bus.announce(bus.RunSettled(run_id=run.id, project_id=run.project_id, status=to, reason=reason, replay=replay))
    return run


def task_set_ready(*, task: Task, now) -> None:
    """Mark a task ready and send it to a worker. Call inside transaction.atomic()."""
    TASK.move(task, Task.Status.READY, ready_at=now, status_reason="")
    outbox_add(actor=EXECUTE, kwargs={"run_id": task.run_id, "task_id": task.id})


def _budget_fields(budget: BudgetIn, now) -> dict:
    return {
        "max_steps": budget.max_steps,
        "max_tokens": budget.max_tokens,
        "max_tool_calls": budget.max_tool_calls,
        "max_cost_micros": None if budget.max_cost_usd is None else round(budget.max_cost_usd * 1_000_000),
        "deadline": None
        if budget.deadline_seconds is None
        else now + timezone.timedelta(seconds=budget.deadline_seconds),
    }


def _pinned_agents(run: Run, agents: dict[str, Agent], started: dict | None) -> dict[str, AgentVersion]:
    """The versions of these agents the run started with; an agent it did not record (a planner may
    assign only the workflow's agents, all recorded at the start) is recorded now, as it is.
    ``started``: the run's first tasks, with the versions just recorded (nothing to read back)."""
    if started is not None:
        return started
    versions = Run.objects.filter(id=run.id).values_list("versions", flat=True).first() or {}
    refs = dict(versions.get("agents") or {})
    rows = AgentVersion.objects.in_bulk([refs[slug]["id"] for slug in agents if slug in refs])
    pinned, added = {}, False
    for slug, agent in agents.items():
        version = rows.get(refs[slug]["id"]) if slug in refs else None
        if version is None:
            version, added = agent_version(agent), True
            refs[slug] = version_ref(version)
        pinned[slug] = version
    if added:
        Run.objects.filter(id=run.id).update(versions={**versions, "agents": refs})
    return pinned


def tasks_create(
    *, run: Run, planned, agents: dict[str, Agent], depth: int, now, pinned=None, first: bool = False
) -> list[Task]:
    """Create planned tasks of a run, on the versions of their agents the run started with; those with
    nothing to wait for are created ready (the caller sends them). Call inside transaction.atomic() with
    the run locked. ``first``: the run's first tasks (it has none yet: nothing to read)."""
    existing = {t.key: t for t in run.tasks.all()} if run.pk and not first else {}
    done = {k for k, t in existing.items() if t.status == Task.Status.COMPLETED}
    pinned = _pinned_agents(run, agents, pinned)
    tasks = []
    for p in planned:
        waiting = len([d for d in p.depends_on if d not in done])
        limits = _budget_fields(p.budget, now)
        config = pinned[p.agent].config
        tasks.append(
            Task(
                run=run,
                key=p.key,
                agent=agents[p.agent],
                agent_version=pinned[p.agent],
                objective=p.objective,
                depends_on=p.depends_on,
                allowed_tools=list(config["allowed_tools"]),
                output_schema=config["output_schema"],
                max_attempts=config["max_attempts"],
                max_steps=limits["max_steps"] or config["max_steps"],
                max_tokens=limits["max_tokens"],
                max_tool_calls=limits["max_tool_calls"],
                max_cost_micros=limits["max_cost_micros"],
                max_seconds=p.budget.deadline_seconds,
                depth=depth,
                plan_version=run.plan_version,
                pending_deps=waiting,
                status=Task.Status.PENDING if waiting else Task.Status.READY,
                ready_at=None if waiting else now,
            )
        )
    created = Task.objects.bulk_create(tasks)
    by_key = {**existing, **{t.key: t for t in created}}
    upstream = {}
    for task in created:
        for dep in task.depends_on:
            if dep not in done:
                by_key[dep].dependents = [*by_key[dep].dependents, task.id]
                upstream[dep] = by_key[dep]
    if upstream:
        Task.objects.bulk_update(list(upstream.values()), ["dependents"])
    return created


def _run_input(value: dict | None) -> RunInputIn:
    """A run's input, validated; drill faults only where drills are on, a model version only if it exists."""
    try:
        run_input = RunInputIn.model_validate(value or {})
    except ValidationError as exc:
        raise InvalidInput("the run's input is invalid", pydantic_errors(exc, "input")) from exc
    if run_input.faults and not settings.WARDEN["DRILL_FAULTS"]:
        # A fault can kill a worker on purpose: where drills are off, starting a run cannot ask for one.
        raise InvalidInput(
            "drill faults are turned off here (WARDEN_DRILL_FAULTS=0)",
            [{"field": "input.faults", "message": "not accepted here"}],
        )
    if run_input.model_version is not None:
        if not ModelVersion.objects.filter(slug=run_input.model_version).exists():
            raise InvalidInput(
                f"unknown model version {run_input.model_version!r}",
                [{"field": "input.model_version", "message": "no such model version"}],
            )
    return run_input


def _first_plan(wf: Workflow, *, goal: str, max_tasks: int) -> tuple[list, dict]:
    """The tasks a run starts with: the workflow's static plan, its planner's one task, or none (an
    external agent opens its own)."""
    if wf.planner == Workflow.Planner.STATIC:
        return plan_validate(wf.tasks, max_tasks=max_tasks)
    if wf.planner == Workflow.Planner.EXTERNAL:
        return [], {}  # an agent running elsewhere opens its tasks and reports (integrations/external.py)
    if wf.planner_agent is None:
        raise InvalidInput(f"workflow {wf.slug!r} has no planner agent")
    return plan_validate(
        [{"key": "plan", "agent": wf.planner_agent.slug, "objective": f"Plan: {goal or wf.default_goal}"}],
        max_tasks=max_tasks,
    )


def _versions_at_start(
    wf: Workflow, agents: dict[str, Agent], *, project_id: int, wf_version: WorkflowVersion | None = None
) -> tuple[dict, WorkflowVersion, dict]:
    """The workflow's version, those of every agent the run may use (its first tasks', its planner's
    and those a planner may assign), and the approval policies in force with their settings (the gate
    holds a run to the stricter of those and the live ones); the workflow's version; and the first
    tasks' agents' versions, by slug."""
    may_use = dict(agents)
    if wf.planner_agent_id:
        may_use.setdefault(wf.planner_agent.slug, wf.planner_agent)
    others = [slug for slug in wf.agents or [] if isinstance(slug, str) and slug not in may_use]
    if others:
        may_use.update({a.slug: a for a in with_latest_version(Agent.objects.filter(slug__in=others))})
    pinned = {slug: agent_version(agent) for slug, agent in may_use.items()}
    # A replay's candidate version as it is: not one made of ``wf`` (which reads as that version does).
    wf_version = wf_version or workflow_version(wf)
    versions = {
        "workflow": version_ref(wf_version),
        "agents": {slug: version_ref(version) for slug, version in pinned.items()},
        "policies": policies_in_force(project_id=project_id, workflow_id=wf.id),
    }
    return versions, wf_version, {slug: pinned[slug] for slug in agents}


def _workflow_as(wf: Workflow, version: WorkflowVersion) -> Workflow:
    """``wf`` as ``version`` of it says, in memory only (a replay's candidate: never saved)."""
    shown = copy.copy(wf)
    for name in WORKFLOW_FIELDS:
        if name in version.config:
            setattr(shown, name, version.config[name])
    planner = version.config.get("planner_agent")
    shown.planner_agent = Agent.objects.filter(slug=planner).first() if planner else None
    return shown


def workflow_unknown(slug: str) -> InvalidInput:
    """The refusal for a workflow slug that names nothing (or, to a caller, nothing they may see)."""
    return InvalidInput(f"unknown workflow {slug!r}", [{"field": "workflow", "message": "no such workflow"}])


def run_start(
    *,
    workflow: str,
    input: dict | None = None,
    budget: dict | None = None,
    goal: str = "",
    started_by=None,
    project=None,
    via: str = "",
    request=None,
) -> Run:
    """``project``: a Project; by default the workflow's, or the default project for a shared workflow.
    Audited as started by ``started_by`` through ``via`` (not when the engine starts a run itself).
    One transaction: what it reads (the workflow, the versions it pins, the policies in
    force, each version read with its owner) and what it writes (the run, its root span, its first
    tasks, their outbox rows)."""
    with audited("run_start", actor=started_by, via=via, request=request, target="") as act:
        wf = with_latest_version(Workflow.objects.select_related("planner_agent", "project")).filter(slug=workflow)
        wf = wf.first()
        if wf is None:
            raise workflow_unknown(workflow)
        if project is None:
            project = wf.project or default_project()
        elif wf.project_id and wf.project_id != project.id:
            raise InvalidInput(
                f"workflow {workflow!r} belongs to another project",
                [{"field": "workflow", "message": "not available in this project"}],
            )
        act.update(project_id=project.id)
        run = _run_create(wf, project=project, input=input, budget=budget, goal=goal, started_by=started_by)
        act.update(run_id=run.id, target=f"run {run.id}")
        if project.id in (wf.shadowed_in or ()):  # replay/shadows.py starts its twin
            bus.announce(bus.RunStarted(run_id=run.id, project_id=project.id, workflow_id=wf.id))
    return run


def run_replay_start(
    *, original: Run, candidates: dict[str, AgentVersion], started_by=None, shadow: bool = False,
    live_reads: bool = False, workflow_version: WorkflowVersion | None = None,
) -> Run:  # fmt: skip
    """A replay of ``original`` (settled): a run of its workflow with its input (its drill faults left out:
    they were the original's circumstances) and goal, in replay mode (its tool calls never leave: the
    broker answers them from the original's ledger), with the agents of ``candidates`` (slug → version)
    pinned to those versions and every other agent as the workflow now has it. ``shadow``: the original
    is still going, and the replay follows it (Run.Mode.SHADOW). ``live_reads``: the reads its original
    did not make go to the system when safe to repeat (Run.live_reads). ``workflow_version``: the workflow
    as that version of it says (its plan, its agents, its limits and tool policies), pinned, instead of as
    it is now. Not audited here: the replay or shadow that starts it is (replay/services.py)."""
    with transaction.atomic():  # the workflow's budget: a candidate's spending is part of what is compared
        wf = with_latest_version(Workflow.objects.select_related("planner_agent", "project")).get(
            id=original.workflow_id
        )
        source = {k: v for k, v in (original.input or {}).items() if k != "faults"}
        if workflow_version is not None:
            wf = _workflow_as(wf, workflow_version)
        return _run_create(
            wf, project=original.project, input=source, budget=None, goal=original.goal, started_by=started_by,
            replay_of=original, candidates=candidates, mode=Run.Mode.SHADOW if shadow else Run.Mode.REPLAY,
            live_reads=live_reads, wf_version=workflow_version,
        )  # fmt: skip


def _run_create(
    wf: Workflow,
    *,
    project,
    input,
    budget,
    goal: str,
    started_by,
    replay_of: Run | None = None,
    candidates=None,
    mode: str = Run.Mode.LIVE,
    live_reads: bool = False,
    wf_version: WorkflowVersion | None = None,
) -> Run:
    run_input = _run_input(input)
    try:
        limits = BudgetIn.model_validate({**wf.default_budget, **(budget or {})})
    except ValidationError as exc:
        raise InvalidInput("the budget is invalid", pydantic_errors(exc, "budget")) from exc
    max_tasks = wf.max_tasks or settings.WARDEN["MAX_TASKS_PER_RUN"]
    planned, agents = _first_plan(wf, goal=goal, max_tasks=max_tasks)
    now = timezone.now()
    versions, wf_version, started = _versions_at_start(wf, agents, project_id=project.id, wf_version=wf_version)
    for slug, version in (candidates or {}).items():  # a replay's candidates, in place of the current ones
        versions["agents"][slug] = version_ref(version)
        if slug in started:
            started[slug] = version
    run = Run.objects.create(
        mode=mode,
        live_reads=live_reads,
        replay_of=replay_of,
        versions=versions,
        workflow_version=wf_version,
        workflow=wf,
        project=project,
        goal=goal or wf.default_goal,
        input=run_input.model_dump(mode="json"),
        status=Run.Status.RUNNING,
        started_at=now,
        started_by=started_by,
        code_version=settings.WARDEN["CODE_VERSION"],
        **_budget_fields(limits, now),
    )
    Span.objects.create(run=run, kind=Span.Kind.RUN, name=f"run {wf.slug}", status=Span.Status.RUNNING, started_at=now)
    tasks = tasks_create(run=run, planned=planned, agents=agents, depth=0, now=now, pinned=started, first=True)
    if wf.planner == Workflow.Planner.AGENT:
        tasks[0].output_schema = PLAN_OUTPUT_SCHEMA
        tasks[0].save(update_fields=["output_schema"])
    for task in tasks:
        if task.status == Task.Status.READY:
            outbox_add(actor=EXECUTE, kwargs={"run_id": run.id, "task_id": task.id})
    return run


def run_cancel(
    *, run_id: int, reason: str = "cancelled by operator", actor=None, via: str = "", request=None, detail=None
) -> Run:
    """Queued work is cancelled at once; running attempts stop cooperatively between steps, and the
    sweeper's reaper forces the final state after the grace period. Audited (``actor``, ``via``)."""
    now = timezone.now()
    who = {"actor": actor, "via": via, "request": request}
    with audited("run_cancel", **who, target=f"run {run_id}", detail={"reason": reason, **(detail or {})}) as act:
        run = Run.objects.select_for_update().get(id=run_id)
        act.update(run_id=run.id, project_id=run.project_id)
        refused = run_cancel_refusal(run)
        if refused is not None:
            raise refused
        # A run that has not started has nothing to stop: it is cancelled at once.
        to = Run.Status.CANCELLED if run.status == Run.Status.PENDING else Run.Status.CANCELLING
        run_transition(run=run, to=to, reason=reason, now=now)
        # Running attempts stop between steps (cooperatively); the rest is cancelled now.
        queued = TASK.sources(Task.Status.CANCELLED) - {Task.Status.RUNNING}
        TASK.move_where(run.tasks.all(), Task.Status.CANCELLED, sources=queued, status_reason=reason, finished_at=now)
        run_approvals_withdraw(run=run, reason=f"the run was cancelled: {reason}")
        run_finish_cancel_if_idle(run=run, now=now)
    return run


def run_approvals_withdraw(*, run: Run, reason: str) -> int:
    """The run moved on (cancelled, compensated): nobody needs to decide its pending requests or answer
    its questions any more, and nothing it still meant to do will be done. Returns how many requests
    were withdrawn. Run locked."""
    bus.run_changed(run.id)
    now = timezone.now()
    ids = approvals_withdraw(run_id=run.id, reason=reason, now=now)
    hooks.call(hooks.QUESTIONS_WITHDRAW, run=run, reason=reason, now=now)
    operations_withdrawn(run_id=run.id, approval_ids=ids, reason=reason, now=now)
    return len(ids)


def run_finish_cancel_if_idle(*, run: Run, now) -> bool:
    """A cancelling run with no running task is cancelled. Call with ``run`` locked."""
    if run.status != Run.Status.CANCELLING or run.tasks.filter(status=Task.Status.RUNNING).exists():
        return False
    run_transition(run=run, to=Run.Status.CANCELLED, reason=run.status_reason, now=now)
    return True


def _resume_locked(*, run: Run, reason: str, now, skip: tuple = ()) -> None:
    """needs_attention → running under the code version now deployed, and the tasks that were paused
    (ready, or waiting for a retry whose message found the run paused) are sent again. Run locked."""
    run_transition(run=run, to=Run.Status.RUNNING, reason=reason, now=now)
    run.code_version = settings.WARDEN["CODE_VERSION"]
    run.save(update_fields=["code_version"])
    for task in run.tasks.filter(status__in=[Task.Status.READY, Task.Status.RETRY_WAIT]).exclude(id__in=skip):
        if task.status == Task.Status.RETRY_WAIT:
            task_set_ready(task=task, now=now)
        else:
            outbox_add(actor=EXECUTE, kwargs={"run_id": task.run_id, "task_id": task.id})


RUN_BUDGET_FIELDS = ("max_steps", "max_tokens", "max_tool_calls", "max_cost_micros", "deadline")


def run_budget_set(*, run_id: int, changes: dict, actor=None, request=None) -> Run:
    """Change a run's budget (a data fix: raise it so that a resumed run can finish); audited with the
    values before and after. Other fields of a run are not changed this way."""
    unknown = set(changes) - set(RUN_BUDGET_FIELDS)
    if unknown:
        raise InvalidInput(f"only the budget can be changed: not {sorted(unknown)}")
    with transaction.atomic():
        run = Run.objects.select_for_update().get(id=run_id)
        before = {name: getattr(run, name) for name in changes}
        if changes:
            Run.objects.filter(id=run_id).update(**changes)
        audit(
            actor=actor,
            action="run_budget_set",
            run=run,
            target=f"run {run_id}",
            request=request,
            detail={"before": before, "after": changes},
        )
        bus.run_changed(run_id)
    return run


def run_resume(
    *, run_id: int, reason: str = "resumed by operator", actor=None, via: str = "", request=None, detail=None
) -> Run:
    """Continue a run that needs attention. Audited (``actor``, ``via``)."""
    who = {"actor": actor, "via": via, "request": request}
    with audited("run_resume", **who, target=f"run {run_id}", detail={"reason": reason, **(detail or {})}) as act:
        run = Run.objects.select_for_update().get(id=run_id)
        act.update(run_id=run.id, project_id=run.project_id)
        refused = run_resume_refusal(run)
        if refused is not None:
            raise refused
        _resume_locked(run=run, reason=reason, now=timezone.now())
    return run


def task_retry(
    *, task_id: int, reason: str = "retried by operator", actor=None, via: str = "", request=None, detail=None
) -> Task:
    """Give a failed task one more attempt, and resume its run if it was waiting for a human. Audited."""
    now = timezone.now()
    run_id = Task.objects.values_list("run_id", flat=True).get(id=task_id)
    who = {"actor": actor, "via": via, "request": request}
    with audited("task_retry", **who, target=f"task {task_id}", run_id=run_id, detail=detail) as act:
        run = Run.objects.select_for_update().get(id=run_id)  # lock order: run, then task
        task = Task.objects.select_for_update().get(id=task_id)
        act.update(target=f"task {task.id} ({task.key})", project_id=run.project_id)
        act["detail"] = {"reason": reason, "task": task.key, **act["detail"]}
        task_retry_locked(run=run, task=task, reason=reason, now=now)
    return task


def task_retry_locked(*, run: Run, task: Task, reason: str, now) -> None:
    """task_retry's body. Call inside transaction.atomic() with ``run``, then ``task``, locked."""
    refused = task_retry_refusal(run, task)
    if refused is not None:
        raise refused
    task.max_attempts = max(task.max_attempts, task.attempts + 1)
    task.failure_class = ""
    task.save(update_fields=["max_attempts", "failure_class"])
    task_set_ready(task=task, now=now)
    if run.status == Run.Status.NEEDS_ATTENTION:
        _resume_locked(run=run, reason=reason, now=now, skip=(task.id,))
