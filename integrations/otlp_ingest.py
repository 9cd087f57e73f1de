"""OTLP ingest: spans from any OpenTelemetry-instrumented agent become a Warden run's trace (docs/integrations.md,
"OpenTelemetry").

A request (OTLP/HTTP, protobuf or JSON) is parsed whole and checked before anything is written
(integrations/otlp_parse.py); then, in one transaction, each span goes to a run: the one its ``warden.run.id``
attribute (on the span or its resource) names, else the run of its trace (a new external run the first
time a trace is seen). The tree is kept as the exporter sent it: a span hangs under its parent and joins
its parent's task; a trace's root span opens (or joins) the task of the agent that made it
(``gen_ai.agent.name``, else the resource's ``service.name``). A span whose parent has not arrived yet
(exporters send children first, and a batch may end between them) hangs under that task's span, marked
``otlp_orphan``, until its parent arrives in a later request: then it moves under it, with its subtree
and their usage. A span with GenAI usage (``gen_ai.usage.input_tokens`` / ``output_tokens``) or a chat
operation is a model call, priced by the price table for the provider that answered
(``gen_ai.provider.name``, formerly ``gen_ai.system``); ``execute_tool`` is a tool call; anything else a
step of the agent's plan. A span sent twice (exporters retry) is kept once, by trace and span id. Usage
counts against the run's budget as any external report does.
"""

from dataclasses import dataclass

from django.db import transaction
from django.db.models import Count, Q, Sum
from django.db.models.fields.json import KT
from django.utils.text import slugify

from agents.gateway import cost_micros
from agents.models import Workflow
from agents.selectors import workflow_visible
from core import bus
from core.errors import NotFound
from runs.models import Run, Span
from runs.services import sql
from runs.services.runs import run_start
from tenancy.access import authorize, default_project
from tenancy.models import Project

from .external import budget_breach, budget_stop, external_task_open
from .models import OtlpTrace
from .otlp_parse import OtlpInvalid, OtlpSpan, otlp_parse

__all__ = ["OtlpInvalid", "OtlpSpan", "otlp_ingest", "otlp_parse"]

MODEL_OPERATIONS = {"chat", "text_completion", "generate_content", "embeddings"}
RUN_ATTRIBUTE = "warden.run.id"
# A span whose parent has not been received (yet): kept under its task's span with this mark until
# the parent arrives; the trace page flags it.
ORPHAN = Span.ORPHAN
ORPHAN_MARK = "parent not received"
TOKENS_MAX = 2_000_000_000  # a span's token counts fit the column, whatever the exporter claims


# --- where each span goes ----------------------------------------------------------------------------


def _named_run(span: OtlpSpan, user, token, request) -> Run | None:
    ref = span.attribute(RUN_ATTRIBUTE)
    if ref is None:
        return None
    try:
        run_id = int(ref)
    except (TypeError, ValueError) as exc:
        raise OtlpInvalid(f"{RUN_ATTRIBUTE} {ref!r} is not a run id") from exc
    run = Run.objects.select_related("workflow").filter(id=run_id).first()
    if run is None:
        raise NotFound(f"run {run_id} does not exist")
    authorize(user, run.project_id, "start", what=f"run {run_id}", token=token, request=request)
    if run.workflow.planner != Workflow.Planner.EXTERNAL:
        raise OtlpInvalid(f"run {run_id} is run by Warden's own workers; spans go to an external run")
    return run


def _trace_run(span: OtlpSpan, user, token, request, default_workflow: str) -> Run:
    """The run of this trace: found, or started (an external run) the first time the trace is seen."""
    slug = str(span.attribute("warden.workflow", default=default_workflow))
    workflow = workflow_visible(slug=slug, user=user)  # another project's answers as a missing one
    if workflow is None or workflow.planner != Workflow.Planner.EXTERNAL:
        raise OtlpInvalid(f"no external workflow {slug!r} to start a run of this trace in (warden.workflow)")
    project_slug = span.attribute("warden.project")
    project = (
        Project.objects.filter(slug=str(project_slug)).first()
        if project_slug
        else workflow.project or default_project()
    )
    if project is None:
        raise NotFound(f"project {project_slug} does not exist")
    authorize(user, project.id, "start", what=f"project {project.slug}", token=token, request=request)
    known = OtlpTrace.objects.filter(project=project, trace_id=span.trace_id).select_related("run").first()
    if known is not None:
        return known.run
    run = run_start(workflow=slug, goal=span.name, started_by=user, project=project, via="otlp", request=request)
    OtlpTrace.objects.create(project=project, trace_id=span.trace_id, run=run)
    return run


def _kind(span: OtlpSpan) -> str:
    operation = str(span.attribute("gen_ai.operation.name", default=""))
    if operation in MODEL_OPERATIONS or span.attribute("gen_ai.usage.input_tokens", "gen_ai.usage.output_tokens"):
        return Span.Kind.MODEL_CALL
    if operation == "execute_tool" or span.attribute("gen_ai.tool.name"):
        return Span.Kind.TOOL_CALL
    return Span.Kind.PLAN


def _int(value) -> int:
    try:
        return min(TOKENS_MAX, max(0, int(value or 0)))
    except (TypeError, ValueError, OverflowError):
        return 0


@dataclass
class Placed:
    """An OTLP span stored in the run: its row and its task."""

    id: int
    task_id: int


def _task(run: Run, span: OtlpSpan, tasks: dict) -> Placed:
    """The task of the agent that made a root span, and the task's span, opened once per agent."""
    agent = str(span.attribute("gen_ai.agent.name", "service.name", default="agent"))[:200]
    if (run.id, agent) not in tasks:
        task = external_task_open(run_id=run.id, key=(slugify(agent) or "agent")[:64], agent=agent)
        parent = Span.objects.filter(task=task, kind=Span.Kind.TASK).values_list("id", flat=True).first()
        tasks[(run.id, agent)] = Placed(id=parent, task_id=task.id)
    return tasks[(run.id, agent)]


def _stored(run: Run, spans: list[OtlpSpan]) -> dict[tuple[str, str], Placed]:
    """The run's spans this request names (as spans or as parents), by (trace id, span id)."""
    ids = sorted({s.span_id for s in spans} | {s.parent_span_id for s in spans if s.parent_span_id})
    # KT reads the ids as text: a plain key lookup is JSON-decoded on SQLite, so an id of hex digits that reads as a
    # number ("8464867e96933604" is inf) came back a float, never matched, and a resend stored the span twice.
    rows = (
        Span.objects.filter(run=run, attributes__otlp_span_id__in=ids)
        .annotate(trace=KT("attributes__otlp_trace_id"), span=KT("attributes__otlp_span_id"))
        .values_list("id", "task_id", "trace", "span")
    )
    return {(trace, span): Placed(id=pk, task_id=task) for pk, task, trace, span in rows}


def _ordered(spans: list[OtlpSpan]) -> list[OtlpSpan]:
    """Each span once, after its parent when the parent is in the same request (parse refused cycles)."""
    by_key = {}
    for span in spans:
        by_key.setdefault((span.trace_id, span.span_id), span)
    done, ordered = set(), []
    for key in by_key:
        chain = []
        while key in by_key and key not in done:
            done.add(key)
            chain.append(by_key[key])
            key = (key[0], by_key[key].parent_span_id)
        ordered.extend(reversed(chain))
    return ordered


def _usage(kind: str, tokens: int, cost: int, sign: int = 1) -> dict:
    return {"steps": sign, "tokens": sign * tokens, "tool_calls": sign * int(kind == Span.Kind.TOOL_CALL),
            "cost": sign * cost}  # fmt: skip


def _record(run: Run, span: OtlpSpan, tasks: dict, placed: dict) -> bool:
    """The span under its parent (else its agent's task), with its usage; False when it was recorded already."""
    if (span.trace_id, span.span_id) in placed:
        return False
    parent = placed.get((span.trace_id, span.parent_span_id)) if span.parent_span_id else None
    where = parent or _task(run, span, tasks)
    kind = _kind(span)
    tokens_in = _int(span.attribute("gen_ai.usage.input_tokens", "gen_ai.usage.prompt_tokens"))
    tokens_out = _int(span.attribute("gen_ai.usage.output_tokens", "gen_ai.usage.completion_tokens"))
    provider = str(span.attribute("gen_ai.provider.name", "gen_ai.system", default=""))[:32]
    model = str(span.attribute("gen_ai.response.model", "gen_ai.request.model", default=""))[:100]
    cost = cost_micros(provider, model, tokens_in, tokens_out) if kind == Span.Kind.MODEL_CALL and model else 0
    shown = {
        k: v
        for k, v in span.attributes.items()
        if k.startswith(("gen_ai.", "warden.")) and not isinstance(v, dict | list)
    }
    tree = {"otlp_parent_span_id": span.parent_span_id} if span.parent_span_id else {}
    if span.parent_span_id and parent is None:
        tree[ORPHAN] = ORPHAN_MARK
    row = Span.objects.create(
        run=run, task_id=where.task_id, parent_id=where.id, kind=kind,
        name=(model if kind == Span.Kind.MODEL_CALL and model else span.name)[:200],
        status=Span.Status.ERROR if span.error else Span.Status.OK, started_at=span.started, ended_at=span.ended,
        tokens_in=tokens_in, tokens_out=tokens_out, cost_micros=cost,
        attributes={"external": True, "otlp_trace_id": span.trace_id, "otlp_span_id": span.span_id,
                    "otlp_name": span.name, "provider": provider, **tree, **dict(list(shown.items())[:40])},
    )  # fmt: skip
    placed[(span.trace_id, span.span_id)] = Placed(id=row.id, task_id=where.task_id)
    usage = _usage(kind, tokens_in + tokens_out, cost)
    sql.add_usage("runs_task", where.task_id, **usage)
    sql.add_usage("runs_run", run.id, **usage)
    return True


# --- a parent that arrives after its children ----------------------------------------------------------------
def _descends(span_id: int, ancestor_id: int) -> bool:
    """Whether ``ancestor_id`` is ``span_id`` or above it (adopting it there would close a loop)."""
    current, seen = span_id, set()
    while current and current not in seen:
        if current == ancestor_id:
            return True
        seen.add(current)
        current = Span.objects.filter(id=current).values_list("parent_id", flat=True).first()
    return False


def _move_subtree(run: Run, root_id: int, to_task: int) -> None:
    """A span and everything below it go to another task, their usage with them."""
    ids, frontier = [root_id], [root_id]
    while frontier:
        frontier = list(Span.objects.filter(run=run, parent_id__in=frontier).values_list("id", flat=True))
        ids += frontier
    moving = Span.objects.filter(run=run, id__in=ids).exclude(task_id=to_task)
    for row in moving.values("task_id").annotate(
        tokens=Sum("tokens_in") + Sum("tokens_out"), cost=Sum("cost_micros"), steps=Count("id"),
        tool_calls=Count("id", filter=Q(kind=Span.Kind.TOOL_CALL)),
    ).order_by():  # fmt: skip
        usage = {"steps": row["steps"], "tokens": row["tokens"] or 0, "tool_calls": row["tool_calls"]}
        sql.add_usage("runs_task", row["task_id"], **{k: -v for k, v in usage.items()}, cost=-(row["cost"] or 0))
        sql.add_usage("runs_task", to_task, **usage, cost=row["cost"] or 0)
    moving.update(task_id=to_task)


def _adopt(run: Run, arrived: list[tuple[str, str]], placed: dict) -> None:
    """Spans that were waiting for one of the spans just recorded move under it."""
    waiting = Span.objects.filter(
        run=run, attributes__has_key=ORPHAN, attributes__otlp_parent_span_id__in=sorted({s for _, s in arrived})
    ).values_list("id", "attributes")
    for span_id, attributes in waiting:
        parent = placed.get((attributes.get("otlp_trace_id"), attributes.get("otlp_parent_span_id")))
        if parent is None or _descends(parent.id, span_id):
            continue  # a namesake in another trace; or a parent that claims to be below its child
        attributes.pop(ORPHAN, None)
        Span.objects.filter(id=span_id).update(parent_id=parent.id, attributes=attributes)
        _move_subtree(run, span_id, parent.task_id)


def _ingest_run(run: Run, spans: list[OtlpSpan], tasks: dict) -> int:
    """Call inside transaction.atomic(): the run's spans of this request, in their tree; how many were new."""
    run = Run.objects.select_for_update().get(id=run.id)  # one request at a time places spans in a run
    if run.status != Run.Status.RUNNING:
        return 0  # a finished run's trace keeps what it had; late spans are not counted
    placed = _stored(run, spans)
    arrived = [(s.trace_id, s.span_id) for s in _ordered(spans) if _record(run, s, tasks, placed)]
    if arrived:
        _adopt(run, arrived, placed)
    return len(arrived)


def otlp_ingest(*, spans: list[OtlpSpan], user, token, request=None, default_workflow: str) -> dict:
    """Write the spans (all of them, or none): which runs they went to and how many were new."""
    runs: dict[int, Run] = {}
    by_run: dict[int, list[OtlpSpan]] = {}
    found: dict[tuple, Run] = {}  # by what names the run: each is looked up (and authorised) once
    tasks: dict = {}
    recorded = 0
    with transaction.atomic():
        for span in spans:
            names = (span.attribute(RUN_ATTRIBUTE), span.trace_id, span.attribute("warden.workflow"),
                     span.attribute("warden.project"))  # fmt: skip
            if names not in found:
                found[names] = _named_run(span, user, token, request) or _trace_run(
                    span, user, token, request, default_workflow
                )
            runs.setdefault(found[names].id, found[names])
            by_run.setdefault(found[names].id, []).append(span)
        for run_id in sorted(by_run):  # locks in one order
            recorded += _ingest_run(runs[run_id], by_run[run_id], tasks)
        for run in runs.values():
            run.refresh_from_db()
            why = budget_breach(run) if run.status == Run.Status.RUNNING else ""
            if why:
                budget_stop(run, why)
    for run_id in runs:
        bus.run_changed(run_id)
    return {"runs": sorted(runs), "spans": recorded}
