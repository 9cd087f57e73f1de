"""Executing one task: reserve an attempt, run the agent loop over the step journal, finish.

Steps 1..k of a re-executed attempt are replayed from the journal (spans with a step number); only
step k+1 calls out. The worker that finishes a task claims a ready successor itself, so a chain of
tasks does not wait for the broker between hops.
"""

import json
import logging
import time
from dataclasses import dataclass, field

from django.conf import settings
from django.db import DatabaseError
from django.utils import timezone
from dramatiq.middleware import TimeLimitExceeded

from agents.conversation import fit, turns
from agents.gateway import ModelRequest, ModelResponse, model_complete, worst_case
from agents.models import Agent, ModelVersion
from agents.prompts import prompt_head, prompt_with_steps
from agents.versions import pinned_endpoint
from core import bus, metrics
from core.errors import BudgetExceeded, InvalidInput, LeaseLost, StepFailure, TransientFailure
from core.faults import crash_now, faults
from core.logs import log_context
from tenancy.models import Project
from tools.broker import TaskParked, replay_outcome, tool_call, tool_call_for_journal
from tools.failures import ON_REFUSAL_FAIL, ON_REFUSAL_MODEL
from tools.registry import TOOLS
from tools.replaying import OriginalBehind

from ..blackboard import MEMORY_TOOLS, knowledge, memory_tool_call
from ..heartbeat import lease_keeper
from ..models import Artifact, Run, Span, Task
from . import hot, sql
from .budget import BudgetBusy, budget_release, budget_reserve
from .budget import limited as budget_limited
from .completion import (
    output_validate,
    quarantine,
    task_fail_or_retry,
    task_finish,
    task_park,
    task_stop_cancelled,
    task_yield,
)
from .hot_sql import context_sql
from .leases import CRASH, Lease, Usage, task_reserve, worker_id
from .plans import plan_check
from .replan import world_lines, world_state
from .spare import live_work_going, put_off_seconds

log = logging.getLogger("warden.engine")


def task_execute(*, run_id: int, task_id: int, owner: str | None = None) -> None:
    """The actor's body: run this task, then keep going with a successor it claimed directly."""
    owner = owner or worker_id()
    lease = task_reserve(run_id=run_id, task_id=task_id, owner=owner)
    while isinstance(lease, Lease):
        current = lease
        lease_keeper.hold(current.task_id, current.token)
        try:
            with log_context(run=current.run_id, task=current.task_id, attempt=current.attempt):
                lease = _attempt(current)
        except LeaseLost:
            lease = None
        finally:
            lease_keeper.release(current.task_id)
    if lease == CRASH:
        crash_now()


def _tool_digest(call: dict) -> str:
    return json.dumps([call.get("name"), call.get("arguments")], sort_keys=True, default=str)


@dataclass
class _LoopState:
    journal: list[dict]
    pending: list[dict] = field(default_factory=list)  # the last reply's tool calls not yet made, in order
    pending_replayed: bool = False  # …and that reply came from an earlier attempt's journal
    model_turns: int = 0
    tool_calls: int = 0
    tool_repeats: dict = field(default_factory=dict)
    last_result: dict | None = None
    # Replies in a row whose calls the systems refused (one reply's several refusals count once), and
    # the last refusal: the bound MAX_CONSECUTIVE_REFUSALS reads them.
    refusals_in_a_row: int = 0
    refused_turn: int | None = None
    last_refusal: str = ""
    prompt_head: list[str] | None = None  # agents.prompts.prompt_head, built at the attempt's first turn

    @classmethod
    def replay(cls, journal: list[dict]) -> "_LoopState":
        state = cls(journal=[])
        for entry in journal:
            state.apply(entry)
        state.pending_replayed = bool(state.pending)
        return state

    @property
    def pending_tool(self) -> dict | None:
        return self.pending[0] if self.pending else None

    def apply(self, entry: dict) -> None:
        self.journal.append(entry)
        body = entry["body"] or {}
        if entry["kind"] == Span.Kind.MODEL_CALL:
            self.model_turns += 1
            # Several calls in one reply are made one by one, each its own journaled step (and key).
            self.pending = list(body.get("tool_calls") or ([body["tool_call"]] if body.get("tool_call") else []))
            for call in self.pending:
                digest = _tool_digest(call)
                self.tool_repeats[digest] = self.tool_repeats.get(digest, 0) + 1
        else:
            self.tool_calls += 1
            self.pending = self.pending[1:]
            self.pending_replayed = self.pending_replayed and bool(self.pending)
            # What the model saw last: the result, or the structured error in its place.
            self.last_result = body.get("result") if "result" in body else {"error": body.get("error")}
            self._count_refusal(entry["name"], body)

    def _count_refusal(self, name: str, body: dict) -> None:
        if not body.get("refused"):
            self.refusals_in_a_row, self.refused_turn = 0, None
            return
        if self.refused_turn != self.model_turns:
            self.refusals_in_a_row += 1
            self.refused_turn = self.model_turns
        self.last_refusal = f"{name}: {(body.get('error') or {}).get('message', '')}"

    @property
    def next_step(self) -> int:
        return len(self.journal) + 1


def _load_context(lease: Lease) -> tuple[Run, Task, Agent, dict]:
    """The task, its agent and run (the claim's statement returned them on PostgreSQL, else one query), and
    its dependencies' artifacts (one query)."""
    row = lease.context or sql.fetchone(context_sql(), {"task": lease.task_id, "now": sql.ts(timezone.now())})
    lease.context = None  # read once: a later attempt reads its own
    (key, objective, depends_on, dependents, output_schema, allowed_tools, plan_version, depth, agent_id, *rest) = row
    t_usage, (max_seconds, started_at), rest = rest[:8], rest[8:10], rest[10:]
    agent, rest = _agent_of(agent_id, rest[:14]), rest[14:]
    run_input, r_status, *r_usage, r_plan, max_tasks, journal_epoch, project_id, project_slug, pinned, knows = rest[:-3]
    mode, replay_of_id, live_reads = rest[-3:]
    run_input = sql.loads(run_input)
    _as_the_run_uses_it(agent, sql.loads(pinned) if pinned is not None else None, run_input)
    run = Run(
        id=lease.run_id,
        input=run_input,
        status=r_status,
        plan_version=r_plan,
        project=Project(id=project_id, slug=project_slug),  # its slug names its own tools (metrics, breakers)
        mode=mode,  # a replay's calls never leave (tools/replaying.py)
        replay_of_id=replay_of_id,
        live_reads=bool(live_reads),
        **dict(zip(sql.USAGE_FIELDS, r_usage, strict=True)),
    )
    run.max_tasks = max_tasks
    task = Task(
        id=lease.task_id,
        run_id=lease.run_id,
        key=key,
        objective=objective,
        depends_on=sql.loads(depends_on),
        dependents=sql.loads(dependents),
        output_schema=sql.loads(output_schema),
        allowed_tools=sql.loads(allowed_tools),
        plan_version=plan_version,
        depth=depth,
        agent_id=agent_id,
        status=Task.Status.RUNNING,
        attempts=lease.attempt,
        fencing_token=lease.token,
        journal_epoch=journal_epoch,
        **dict(zip(sql.USAGE_FIELDS, t_usage, strict=True)),
    )
    task.agent, task.run = agent, run
    task.max_seconds, task.started_at = max_seconds, sql.parse_ts(started_at)
    deps, task.join_problems, lease.verify = _dependencies(lease.run_id, task.depends_on)
    task.knowledge = knowledge(lease.run_id) if knows else []  # as of this attempt's start
    # A re-planner sees the world as it is now, not as it was when the run began (seed 000).
    task.world = world_state(run.id, exclude_task=task.id) if agent.is_planner and plan_version > 1 else None
    return run, task, agent, deps


def _agent_of(agent_id: int, columns) -> Agent:
    """The agent from its columns of the context row (as it is now; the run's pinned version applies later)."""
    (slug, instructions, provider, model, script, is_planner, cache_seconds, fallback, fallback_model) = columns[:9]
    routing, endpoint = sql.loads(columns[9]), columns[10:14]
    return Agent(
        id=agent_id,
        slug=slug,
        instructions=instructions,
        provider=provider,
        model=model,
        script=sql.loads(script),
        is_planner=bool(is_planner),
        cache_seconds=cache_seconds,
        fallback_provider=fallback,
        fallback_model=fallback_model,
        routing=routing or {},
        **dict(zip(("base_url", "api_key_secret", "send_max_tokens", "project_id"), endpoint, strict=True)),
    )


def _dependencies(run_id: int, depends_on: list[str]) -> tuple[dict, list[str], list[int]]:
    """The latest artifact of each dependency (by key), what is wrong with joining them, and the ones
    to mark verified."""
    if not depends_on:
        return {}, [], []
    where, keys = sql.in_list("t.key", depends_on)
    latest = {}
    for dep_key, artifact_id, content, schema, verification in sql.fetchall(
        "SELECT t.key, a.id, a.content, a.schema, a.verification FROM runs_artifact a "
        f"JOIN runs_task t ON t.id = a.task_id WHERE a.run_id = %s AND {where} ORDER BY a.version",
        [run_id, *keys],
    ):
        latest[dep_key] = (artifact_id, sql.loads(content), sql.loads(schema), verification)
    return {key: content for key, (_, content, _, _) in latest.items()}, *_join_check(latest)


def _join_check(latest: dict) -> tuple[list[str], list[int]]:
    """Each input is checked where it is joined, before this task's model sees it (seed 003's cascading
    errors): one a person or a verifier rejected, or that no longer matches the schema it was written
    with (a data fix gone wrong), stops the task. Inputs that pass are marked verified, once, by the
    attempt's first journal statement (returned here: the ids to mark)."""
    problems, passed = [], []
    for key, (artifact_id, content, schema, verification) in sorted(latest.items()):
        if verification == Artifact.Verification.REJECTED:
            problems.append(f"the input from {key} (artifact {artifact_id}) was rejected")
            continue
        try:
            output_validate(content, schema)
        except StepFailure as exc:
            problems.append(f"the input from {key} (artifact {artifact_id}) is invalid: {exc}")
            continue
        if verification == Artifact.Verification.UNVERIFIED:
            passed.append(artifact_id)
    return problems, [] if problems else passed


_PINNED_FIELDS = ("instructions", "provider", "model", "script", "is_planner", "cache_seconds", "fallback_provider",
                  "fallback_model", "routing")  # fmt: skip


def _as_the_run_uses_it(agent: Agent, pinned: dict | None, run_input: dict) -> None:
    if pinned is not None:  # the agent as the run started with it (agents/versions.py), not as edited since
        _apply_pinned(agent, pinned)
    if run_input.get("model_version"):
        _apply_model_version(agent, run_input["model_version"])


def _apply_pinned(agent: Agent, config: dict) -> None:
    for name in _PINNED_FIELDS:
        if name in config:
            setattr(agent, name, config[name] if config[name] is not None or name != "routing" else {})
    for name, value in pinned_endpoint(config).items():  # absent from the version: none, not the live one
        setattr(agent, name, value)


def _apply_model_version(agent: Agent, version: str) -> None:
    """The run's agents as a model version changes them (trusted configuration, checked at the start)."""

    overrides = ModelVersion.objects.filter(slug=version).values_list("overrides", flat=True).first() or {}
    for name, value in (overrides.get(agent.slug) or {}).items():
        if name in ModelVersion.OVERRIDABLE:
            setattr(agent, name, value)


def _load_journal(task_id: int) -> list[dict]:
    rows = Span.objects.filter(task_id=task_id, step__isnull=False).order_by("step").select_related("payload")
    return [
        {"step": s.step, "kind": s.kind, "name": s.name, "body": s.body if s.payload_id is None else s.payload.body}
        for s in rows
    ]


def _attempt(lease: Lease):
    run, task, agent, deps = _load_context(lease)
    if _gives_way(run):
        return _give_way(lease)
    state = _LoopState.replay([] if lease.fresh else _load_journal(task.id))
    run_usage, task_usage = Usage.of(run), Usage.of(task)
    slice_ends = lease.claimed_at + settings.WARDEN["SLICE_SECONDS"]
    # The task's wall-clock budget, counted from its first start, on the monotonic clock from here on.
    task_ends = None
    if task.max_seconds and task.started_at:
        task_ends = time.monotonic() + task.max_seconds - (timezone.now() - task.started_at).total_seconds()
    try:
        if task.join_problems:
            raise StepFailure("; ".join(task.join_problems), "validation")
        while True:
            if task_ends is not None and time.monotonic() > task_ends:
                raise BudgetExceeded("deadline", f"{task.max_seconds}s", f"{task.max_seconds}s", "task")
            if state.pending_tool is not None:
                run_usage.check_before_step("run", tool_call=True)
                task_usage.check_before_step("task", tool_call=True)
                run_usage, task_usage = _tool_step(lease, run, task, state)
            else:
                if time.monotonic() > slice_ends:
                    return task_yield(lease)
                if _gives_way(run):
                    return _give_way(lease)
                run_usage.check_before_step("run")
                task_usage.check_before_step("task")
                try:
                    response, started = _model_call(lease, run, task, agent, state, deps)
                except BudgetBusy:
                    return task_yield(lease)
                if response.final is not None:
                    return _final(lease, run, task, agent, state, response, started)
                run_usage, task_usage = _journal_model_step(lease, task, state, response, started)
                for call in state.pending:
                    _loop_guard(state, call)
            if run_usage.status == Run.Status.CANCELLING:
                return task_stop_cancelled(lease)
            run_usage.check_after_step("run")
            task_usage.check_after_step("task")
    except StepFailure as exc:
        return task_fail_or_retry(lease, exc)
    except TimeLimitExceeded:
        return task_fail_or_retry(lease, TransientFailure("the attempt ran past the worker's time limit"))
    except LeaseLost:
        raise
    except _Parked:
        return None
    except _Behind:
        return _shadow_wait(lease, run, task)
    except DatabaseError as exc:  # the database went away mid-attempt: worth another attempt
        log.warning("task %s attempt %s: database error %r", lease.task_id, lease.attempt, exc)
        return task_fail_or_retry(lease, TransientFailure(f"database error: {exc}"))
    except Exception as exc:  # a bug must not leave the task leased until the lease expires
        log.exception("task %s attempt %s failed unexpectedly", lease.task_id, lease.attempt)
        return task_fail_or_retry(lease, StepFailure(f"internal error: {exc!r}", "permanent"))


def _model_call(lease: Lease, run: Run, task: Task, agent: Agent, state: _LoopState, deps: dict):
    """The next model call, its worst case held against the budgets first. Returns (response, started);
    raises BudgetBusy when siblings' holds leave no room for now."""
    request = _model_request(lease, run, task, agent, state, deps)
    _hold_worst_case(lease, run, task, agent, request)
    started = timezone.now()
    try:
        response = model_complete(provider=agent.provider, script=agent.script, model=agent.model, request=request)
    except StepFailure as exc:
        budget_release(lease)
        _error_span(lease, kind=Span.Kind.MODEL_CALL, name=agent.model, started=started, message=str(exc))
        _model_call_counted(agent.provider, "error", started)
        raise
    _model_call_counted(response.provider or agent.provider, "cached" if response.cached else "ok", started, response)
    return response, started


def _model_call_counted(provider: str, outcome: str, started, response: ModelResponse | None = None) -> None:
    """The call happened (its tokens are spent) whether or not its step is journaled later."""
    provider = metrics.bounded(provider)
    metrics.STEPS.labels(Span.Kind.MODEL_CALL, "ok" if response is not None else "error").inc()
    metrics.STEP_SECONDS.labels(Span.Kind.MODEL_CALL).observe((timezone.now() - started).total_seconds())
    metrics.MODEL_CALLS.labels(provider, outcome).inc()
    if response is not None:
        metrics.TOKENS.labels(provider, "in").inc(response.tokens_in)
        metrics.TOKENS.labels(provider, "out").inc(response.tokens_out)
        metrics.COST.labels(provider).inc(response.cost_micros / 1_000_000)


def _tool_call_counted(run: Run, name: str, body: dict | None, started) -> None:
    error = (body or {"error": {}}).get("error")
    if error and error.get("code") == "unknown_tool":
        project, tool = "", "unknown"
    elif name in TOOLS or name in MEMORY_TOOLS:  # the deployment's tools: the same in every project
        project, tool = "", metrics.bounded(name)
    else:  # a project's own tool: another project's of the same name is another series
        project, tool = metrics.bounded_pair(run.project.slug, name)
    metrics.STEPS.labels(Span.Kind.TOOL_CALL, "error" if body is None else "ok").inc()
    metrics.STEP_SECONDS.labels(Span.Kind.TOOL_CALL).observe((timezone.now() - started).total_seconds())
    # A refusal's code is the tool's own word (http_422, ...): counted as one outcome.
    outcome = "ok" if error is None else metrics.bounded(error.get("code") or "error")
    if (body or {}).get("refused"):
        outcome = "refused"
    metrics.TOOL_CALLS.labels(project, tool, outcome).inc()


def _hold_worst_case(lease: Lease, run: Run, task: Task, agent: Agent, request: ModelRequest) -> None:
    """The call's worst case is held against the budgets before it is made (runs/services/budget.py);
    the journal statement that counts its real figures drops the hold."""
    if not budget_limited(run, task):
        return
    tokens, cost = worst_case(provider=agent.provider, model=agent.model, request=request)
    budget_reserve(lease, run, task, tokens=tokens, cost=cost)


def _model_request(lease: Lease, run: Run, task: Task, agent: Agent, state: _LoopState, deps: dict) -> ModelRequest:
    """What the model is asked at this turn: the prompt from the journal so far (for a real provider, the
    task message and the conversation in its own format), and the context a scripted agent reads."""
    prompt, history = _prompt_and_history(task, agent, state, deps)
    return ModelRequest(
        agent_slug=agent.slug,
        instructions=agent.instructions,
        turn=state.model_turns + 1,
        attempt=lease.attempt,
        prompt=prompt,
        history=history,
        context={
            "deps": deps,
            "last": state.last_result or {},
            "input": run.input,
            "task": task.key,
            "known": {entry["key"]: entry["value"] for entry in task.knowledge},
            "world": {"tasks": {t["key"]: t for t in task.world["tasks"]}, **task.world} if task.world else {},
        },
        tool_names=list(task.allowed_tools),
        project_id=run.project_id,
        cache_seconds=agent.cache_seconds,
        fallback=(agent.fallback_provider, agent.fallback_model) if agent.fallback_provider else None,
        routing=agent.routing,
        endpoint=agent.endpoint,
    )


def model_driven(agent: Agent) -> bool:
    """A real model decides the calls (the native loop), not a script."""
    return agent.provider in (Agent.Provider.OPENAI, Agent.Provider.ANTHROPIC)


def _prompt_and_history(task: Task, agent: Agent, state: _LoopState, deps: dict) -> tuple[str, list[dict]]:
    """A scripted agent reads one prompt with a record of its recent steps. A real model gets the task
    message (its inputs whole, within a quarter of the budget each) and the exchanges so far as messages,
    fitted to the rest of the budget; both rebuilt from the journal alone, so a resumed attempt sends the
    same bytes."""
    native = model_driven(agent)
    budget = settings.WARDEN["CONTEXT_CHARS"]
    if state.prompt_head is None:  # the attempt's task, inputs, knowledge and world: the same at every turn
        state.prompt_head = prompt_head(
            objective=task.objective,
            output_schema=task.output_schema,
            dependencies=deps,
            budget_chars=budget,
            knowledge=task.knowledge,
            world=world_lines(task.world) if task.world else None,
            value_chars=budget // 4 if native else None,
        )
    prompt = prompt_with_steps(state.prompt_head, [] if native else state.journal, budget)
    if not native:
        return prompt, []
    history, dropped = fit(turns(state.journal), max(1000, budget - len(prompt)))
    if dropped:
        prompt += f"\n({dropped} earlier exchanges omitted for the context budget)"
    return prompt, history


def _final(lease: Lease, run: Run, task: Task, agent: Agent, state: _LoopState, response: ModelResponse, started):
    """Validate the final answer (and a planner's plan) before the task may complete."""
    try:
        output_validate(response.final, task.output_schema)
    except StepFailure:
        _journal_model_step(lease, task, state, response, started)  # the call happened and cost tokens
        raise
    planned = None
    if agent.is_planner:
        if task.depth + 1 > settings.WARDEN["MAX_PLANNING_DEPTH"]:
            raise StepFailure(f"planning depth {task.depth + 1} is over the cap", "policy")
        try:
            planned = plan_check(run, response.final)
        except InvalidInput as exc:
            details = "; ".join(f"{e['field']}: {e['message']}" for e in exc.errors)
            raise StepFailure(f"invalid plan: {exc}{' (' + details + ')' if details else ''}", "validation") from exc
    successor = task_finish(lease, run, task, step=state.next_step, response=response, started=started, planned=planned)
    faults.crash_point(run.input, run_id=run.id, task_key=task.key, call=None, point="after_enqueue")
    return successor


def _journal_model_step(lease: Lease, task: Task, state: _LoopState, response: ModelResponse, started):
    body = response.as_journal()
    if body.get("tool_calls"):
        # Secret argument values are sealed apart: the journal (a span) never holds them. Each is sealed
        # under the step of its tool call (the reply's calls take the next steps, in order), which is the
        # step the broker and the ledger row know the call by, and so the step they unseal with.
        body["tool_calls"] = [
            tool_call_for_journal(task_id=task.id, step=state.next_step + 1 + i, tool_call=call)
            for i, call in enumerate(body["tool_calls"])
        ]
        body["tool_call"] = body["tool_calls"][0]
    elif body.get("tool_call"):
        body["tool_call"] = tool_call_for_journal(
            task_id=task.id, step=state.next_step + 1, tool_call=body["tool_call"]
        )
    return _journal(
        lease,
        task,
        step=state.next_step,
        kind=Span.Kind.MODEL_CALL,
        name=response.model,
        body=body,
        started=started,
        response=response,
        state=state,
    )


def _loop_guard(state: _LoopState, tool_call: dict) -> None:
    """Stop a task that keeps making the same tool call with the same arguments."""
    limit = settings.WARDEN["LOOP_GUARD_REPEATS"]
    if state.tool_repeats.get(_tool_digest(tool_call), 0) >= limit:
        raise StepFailure(f"loop guard: {tool_call.get('name')} called {limit} times with the same arguments", "loop")


class _Parked(Exception):
    """The attempt stopped to wait for a reviewer; the task is parked."""


def _gives_way(run: Run) -> bool:
    """A shadow's work waits while live work is going (runs/services/spare.py)."""
    return run.mode == Run.Mode.SHADOW and live_work_going()


def _give_way(lease: Lease) -> None:
    return task_yield(lease, delay_seconds=put_off_seconds(), reason="waits for spare time: live work first")


class _Behind(Exception):
    """A shadow's call waits for the run it follows (tools/replaying.py): the attempt hands the task back."""


SHADOW_WAIT_MAX_SECONDS = 15.0


def _original_settled(run: Run) -> bool:
    """Whether the run a shadow follows has stopped going (ended, or stopped for a person): a call it has
    not made by then is answered as a replay's is."""
    status = Run.objects.filter(id=run.replay_of_id).values_list("status", flat=True).first()
    return status is None or status in Run.TERMINAL or status == Run.Status.NEEDS_ATTENTION


def _shadow_wait(lease: Lease, run: Run, task: Task) -> None:
    """Look again later: soon while the task is young (its original is likely a step ahead), up to
    SHADOW_WAIT_MAX_SECONDS for an original that waits long (for a reviewer, say)."""
    age = (timezone.now() - task.started_at).total_seconds() if task.started_at else 0.0
    delay = min(SHADOW_WAIT_MAX_SECONDS, 0.2 + age / 20)
    task_yield(lease, delay_seconds=delay, reason=f"waits for run {run.replay_of_id}, which it shadows")


def _tool_step(lease: Lease, run: Run, task: Task, state: _LoopState):

    call = state.pending_tool
    call_number = state.tool_calls + 1
    started = timezone.now()
    while True:
        if str(call.get("name")) in MEMORY_TOOLS:  # Warden's own memory: nothing outside changes
            outcome = memory_tool_call(
                run=run, task=task, step=state.next_step, name=str(call.get("name")), arguments=call.get("arguments")
            )
            break
        try:
            outcome = tool_call(
                run=run,
                task=task,
                step=state.next_step,
                call_number=call_number,
                name=str(call.get("name")),
                arguments=call.get("arguments") or {},
                resumed=state.pending_replayed,
                fence=(task.id, lease.token),
                # A model can read a refusal and correct its call; a script would only repeat it.
                on_refusal=ON_REFUSAL_MODEL if model_driven(task.agent) else ON_REFUSAL_FAIL,
            )
            break
        except TaskParked as parked:
            if task_park(lease, operation_id=parked.operation_id, reason=str(parked)):
                raise _Parked() from None
            # decided before we could park: ask the broker again, it finds the decision
        except OriginalBehind as behind:  # a shadow's call its original has not made (yet)
            if not _original_settled(run):
                raise _Behind() from None
            outcome = replay_outcome(behind.answer)
            break
        except StepFailure as exc:
            _error_span(lease, kind=Span.Kind.TOOL_CALL, name=str(call.get("name")), started=started, message=str(exc))
            _tool_call_counted(run, str(call.get("name")), None, started)
            raise
    body = outcome.body
    if call.get("id"):  # the provider's id pairs the result with its call in the conversation
        body = {**body, "call_id": call["id"]}
    usage = _journal(
        lease,
        task,
        step=state.next_step,
        kind=Span.Kind.TOOL_CALL,
        name=str(call.get("name")),
        body=body,
        started=started,
        state=state,
        tool_call=True,
    )
    _tool_call_counted(run, str(call.get("name")), outcome.body, started)
    faults.crash_point(run.input, run_id=run.id, task_key=task.key, call=call_number, point="after_advance")
    _refusals_bound(state, outcome.refused)
    return usage


def _refusals_bound(state: _LoopState, refused: bool) -> None:
    """The model was told of a refusal: past MAX_CONSECUTIVE_REFUSALS replies in a row that ended in one,
    the task fails with the last one's reason. Checked when a refusal is journaled, not when one is
    replayed: a task retried by hand gives its model another turn."""
    limit = settings.WARDEN["MAX_CONSECUTIVE_REFUSALS"]
    if refused and state.refusals_in_a_row >= limit:
        raise StepFailure(f"{state.refusals_in_a_row} refused calls in a row; the last: {state.last_refusal}",
                          "permanent")  # fmt: skip


def _journal(
    lease: Lease,
    task: Task,
    *,
    step: int,
    kind: str,
    name: str,
    body,
    started,
    state: _LoopState,
    response: ModelResponse | None = None,
    tool_call: bool = False,
) -> tuple[Usage, Usage]:
    """Journal one step and count it on the task and the run, atomically, as a compare-and-set on the
    lease. On PostgreSQL this is one statement (one round trip, one commit); elsewhere one transaction.
    The row update is HOT-friendly: it touches no indexed column (the heartbeat renews the lease)."""
    params = hot.step_params(
        lease, step=step, kind=kind, name=name, started=started, response=response, tool_call=tool_call
    )
    body_json = json.dumps(body, default=str)
    try:
        run_usage, task_usage = hot.journal_step(params, body, body_json)
    except LeaseLost:
        quarantine(lease, task, step=step, body=body, response=response)
        raise
    bus.run_changed(lease.run_id)  # committed by now: the PostgreSQL path is a single statement
    state.apply({"step": step, "kind": kind, "name": name, "body": body})
    return run_usage, task_usage


def _error_span(lease: Lease, *, kind: str, name: str, started, message: str) -> None:
    bus.run_changed(lease.run_id)
    Span.objects.create(
        run_id=lease.run_id,
        task_id=lease.task_id,
        parent_id=lease.span_id,
        kind=kind,
        name=name,
        status=Span.Status.ERROR,
        attempt=lease.attempt,
        fencing_token=lease.token,
        started_at=started,
        ended_at=timezone.now(),
        attributes={"error": message[:2000]},
    )
