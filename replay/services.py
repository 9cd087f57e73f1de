"""Replays: past runs run again on a candidate agent with zero effects (``replay_start``), and what the
candidate did differently (``replay_diff``). How a replay's tool calls are answered is the broker's
(tools/replaying.py); the runs are the engine's, in replay mode (runs.services.run_replay_start)."""

from collections import Counter, defaultdict

from agents.models import Agent, AgentVersion, Workflow, WorkflowVersion
from agents.versions import agent_version_draft
from core import bus
from core.errors import InvalidInput, NotFound
from evals.checks import check_failures, judges
from evals.judge import grade
from evals.models import EvalResult, EvalSuite
from runs.models import Artifact, Run, Span
from runs.services import run_replay_start
from runs.services.outbox import outbox_add
from tenancy.audit import audited
from tools.models import ToolOperation
from tools.replaying import NOT_SENT

from .models import Replay, ReplayRun

MAX_RUNS = 500
# What a draft may change: what the agent is asked and with what it answers (the rest is the agent's).
EDITABLE = ("instructions", "provider", "model", "script", "allowed_tools", "output_schema", "max_steps")
SETTLED = frozenset({*Run.TERMINAL, Run.Status.NEEDS_ATTENTION})
IRREVERSIBLE = ToolOperation.Reversibility.IRREVERSIBLE
# Journal keys that say how a step was made, not what it was: left out when two journals are compared.
_HOW = ("request", "retries", "cached", "replay", "refused")


def invalid(field: str, message: str) -> InvalidInput:
    """Bad input about ``field``, in the API's error shape."""
    return InvalidInput(message, [{"field": field, "message": message}])


def _originals(run_ids) -> list[Run]:
    ids = sorted({int(i) for i in run_ids or []})
    if not ids:
        raise invalid("runs", "choose at least one run")
    if len(ids) > MAX_RUNS:
        raise invalid("runs", f"at most {MAX_RUNS} runs at a time")
    runs = list(Run.objects.filter(id__in=ids).select_related("workflow", "project").order_by("id"))
    missing = sorted(set(ids) - {r.id for r in runs})
    if missing:
        raise NotFound(f"no run {missing[0]}")
    if len({r.project_id for r in runs}) > 1:
        raise invalid("runs", "the runs of one replay belong to one project")
    for run in runs:
        if run.mode != Run.Mode.LIVE:
            raise invalid("runs", f"run {run.id} is itself a replay")
        if run.status not in SETTLED:
            raise invalid("runs", f"run {run.id} is {run.status}: only a settled run can be replayed")
        if run.workflow.planner == Workflow.Planner.EXTERNAL:
            raise invalid("runs", f"run {run.id}'s agent runs elsewhere: Warden cannot run it again")
    return runs


def _edits_checked(edits: dict) -> dict:
    if not isinstance(edits, dict) or not edits:
        raise invalid("edits", "the edits are an object of the agent's fields")
    unknown = sorted(set(edits) - set(EDITABLE))
    if unknown:
        raise invalid("edits", f"a draft may change only {', '.join(EDITABLE)}: not {', '.join(unknown)}")
    types = {"instructions": str, "provider": str, "model": str, "script": list, "allowed_tools": list,
             "output_schema": dict, "max_steps": int}  # fmt: skip
    for name, value in edits.items():
        if not isinstance(value, types[name]) or (
            name == "allowed_tools" and not all(isinstance(t, str) for t in value)
        ):
            raise invalid(f"edits.{name}", f"{name} must be a {types[name].__name__}")
    if "provider" in edits and edits["provider"] not in Agent.Provider.values:
        raise invalid("edits.provider", f"unknown provider {edits['provider']!r}")
    return edits


def _candidate(agent_slug: str, version: int | None, edits: dict | None, runs: list[Run]) -> AgentVersion:
    _agent(agent_slug, project_id=runs[0].project_id)  # an unknown agent is said so first
    for run in runs:
        if agent_slug not in ((run.versions or {}).get("agents") or {}):
            raise invalid("agent", f"run {run.id} does not use {agent_slug}: replaying it would change nothing")
    return candidate_of(agent_slug, version, edits, project_id=runs[0].project_id)


def _agent(slug: str, *, project_id: int) -> Agent:
    agent = Agent.objects.filter(slug=slug).first()
    if agent is None or agent.project_id not in (None, project_id):
        raise invalid("agent", f"unknown agent {slug!r}")
    return agent


def candidate_of(agent_slug: str, version: int | None, edits: dict | None, *, project_id: int) -> AgentVersion:
    """The version tried: one of the agent's (``version``) or a draft of it with ``edits``."""
    agent = _agent(agent_slug, project_id=project_id)
    if (version is None) == (edits is None):
        raise invalid("candidate", "name a version of the agent, or the edits of a draft")
    if version is not None:
        found = AgentVersion.objects.filter(agent=agent, number=version).first()
        if found is None:
            raise invalid("version", f"{agent_slug} has no version {version}")
        return found
    return agent_version_draft(agent, _edits_checked(edits))


def suite_runs(suite: EvalSuite) -> list[int]:
    """The runs an evaluation suite's cases last had, live and settled: a replay of them is graded by the
    cases' checks."""
    found = {}
    results = EvalResult.objects.filter(case__suite=suite, run__mode=Run.Mode.LIVE, run__status__in=SETTLED)
    for case_id, run_id in results.order_by("id").values_list("case_id", "run_id"):
        found[case_id] = run_id  # the latest of each case
    if not found:
        raise invalid("suite", f"suite {suite.slug} has no settled run to replay: run the suite first")
    return sorted(found.values())


def replay_start(
    *, run_ids=None, agent: str = "", version: int | None = None, edits: dict | None = None, actor=None,
    via: str = "", request=None, note: str = "", live_reads: bool = False, suite: EvalSuite | None = None,
    workflow_version: int | None = None,
) -> Replay:  # fmt: skip
    """Replay each of ``run_ids`` (settled runs of one project) on the candidate: ``agent`` on one of its
    versions (``version``) or a draft of its current configuration with ``edits``, and/or the runs'
    workflow as its version ``workflow_version`` says. The replays run on the workers like any run;
    nothing they call leaves but, with ``live_reads``, the reads their originals did not make that the
    tools say are safe to repeat. ``suite``: instead of ``run_ids``, the runs its cases last had, each
    pair then graded by its case's checks. Audited."""
    if suite is not None:
        if run_ids:
            raise invalid("runs", "choose runs or a suite, not both")
        run_ids = suite_runs(suite)
    detail = {"runs": sorted({int(i) for i in run_ids or []})[:50], "agent": agent, "version": version,
              "edits": sorted(edits) if isinstance(edits, dict) else None, "live_reads": live_reads,
              "workflow_version": workflow_version}  # fmt: skip
    with audited("replay_start", actor=actor, via=via, request=request, target="replay", detail=detail) as act:
        originals = _originals(run_ids)
        act.update(project_id=originals[0].project_id)
        if suite is not None and suite.project_id != originals[0].project_id:
            raise invalid("suite", f"unknown suite {suite.slug!r}")
        candidate = _candidate(agent, version, edits, originals) if agent else None
        flow = _workflow_candidate(workflow_version, originals)
        if candidate is None and flow is None:
            raise invalid("candidate", "name an agent's candidate, a version of the runs' workflow, or both")
        replay = Replay.objects.create(
            project_id=originals[0].project_id,
            candidate={"agent": agent or None, "version": candidate.number if candidate else None,
                       "draft": bool(candidate and candidate.draft), "edits": edits,
                       "workflow_version": workflow_version},  # fmt: skip
            candidate_version=candidate, created_by=actor, note=note, live_reads=live_reads, suite=suite,
        )  # fmt: skip
        act.update(target=f"replay {replay.id}")
        for original in originals:
            run = run_replay_start(original=original, candidates={agent: candidate} if candidate else {},
                                   started_by=actor, live_reads=live_reads, workflow_version=flow)  # fmt: skip
            ReplayRun.objects.create(replay=replay, original=original, run=run)
    return replay


def _workflow_candidate(number: int | None, runs: list[Run]) -> WorkflowVersion | None:
    """The runs' workflow as its version ``number`` says (the runs of one workflow, then)."""
    if number is None:
        return None
    if len({run.workflow_id for run in runs}) > 1:
        raise invalid("workflow_version", "the runs of a workflow version's replay are of that one workflow")
    found = WorkflowVersion.objects.filter(workflow_id=runs[0].workflow_id, number=number, draft=False).first()
    if found is None:
        raise invalid("workflow_version", f"{runs[0].workflow.slug} has no version {number}")
    return found


def replay_get(replay_id: int) -> Replay:
    found = Replay.objects.filter(id=replay_id).select_related("project").first()
    if found is None:
        raise NotFound(f"no replay {replay_id}")
    return found


def replay_settled(replay: Replay) -> bool:
    """Every replay run has ended or stopped (and, for a suite's replay, been graded by its judges)."""
    statuses = Run.objects.filter(id__in=replay.pairs.values("run_id")).values_list("status", flat=True)
    if not all(status in SETTLED for status in statuses):
        return False
    return replay.suite_id is None or not replay.pairs.filter(grades__isnull=True).exists()


# --- a suite's judges on a replay run ---------------------------------------------------------------------
GRADE_PAIR = "grade_replay_pair"  # the actor that asks the judges (replay/actors.py)


def _case_of(pair: ReplayRun):
    result = (
        EvalResult.objects.filter(run_id=pair.original_id, case__suite_id=pair.replay.suite_id)
        .select_related("case")
        .order_by("-id")
        .first()
    )
    return result.case if result is not None else None


def replay_run_settled_heard(event: bus.RunSettled) -> None:
    """Subscribed durably: a suite's replay run ended. Its case's judges grade it after commit (a model call
    is I/O, never inside the transaction); a case without judges is graded at once, with none."""
    if not event.replay:
        return
    pair = ReplayRun.objects.filter(run_id=event.run_id, replay__suite__isnull=False).select_related("replay").first()
    if pair is None or pair.grades is not None:
        return
    case = _case_of(pair)
    if case is None or not judges(case.checks):
        ReplayRun.objects.filter(id=pair.id).update(grades=[])
        return
    outbox_add(actor=GRADE_PAIR, kwargs={"pair_id": pair.id})


def replay_pair_grade(pair_id: int) -> bool:
    """Grade a settled replay run by its case's judges, once (the actor's body; safe to run twice)."""
    pair = ReplayRun.objects.filter(id=pair_id, grades__isnull=True).select_related("replay", "run").first()
    if pair is None:
        return False
    case = _case_of(pair)
    checks = judges(case.checks) if case is not None else []
    grades = [grade(judge, run=pair.run, project_id=pair.replay.project_id) for judge in checks]
    return bool(ReplayRun.objects.filter(id=pair.id, grades__isnull=True).update(grades=grades))


# --- the differences -------------------------------------------------------------------------------------
# What the differences are read from, for any number of runs in three queries (one per table), grouped here:
# a replay of 500 runs costs its page the same few queries as a replay of one.
class _Reads:
    def __init__(self, original_ids, run_ids):
        ids = {*original_ids, *run_ids} - {None}
        self.calls: dict[int, list[dict]] = defaultdict(list)
        ops = ToolOperation.objects.filter(run_id__in=set(original_ids) - {None}, kind=ToolOperation.Kind.ACTION)
        fields = ("run_id", "tool", "arguments_hash", "tool_class", "reversibility", "status", "task__key", "step")
        for run_id, tool, digest, tool_class, reversibility, status, task, step in ops.order_by("id").values_list(
            *fields
        ):
            self.calls[run_id].append({
                "tool": tool, "digest": digest, "write": tool_class != ToolOperation.ToolClass.READ_ONLY,
                "reversibility": reversibility, "status": status, "task": task or "", "step": step,
            })  # fmt: skip
        self.spans: dict[int, list[tuple]] = defaultdict(list)
        spans = Span.objects.filter(run_id__in=ids, step__isnull=False).order_by("id")
        for row in spans.values_list("run_id", "id", "kind", "name", "step", "task__key", "body", "payload__body"):
            self.spans[row[0]].append(row[1:])
        self.outputs: dict[int, dict] = defaultdict(dict)
        artifacts = Artifact.objects.filter(run_id__in=ids).order_by("version", "id")
        for run_id, key, content in artifacts.values_list("run_id", "key", "content"):
            self.outputs[run_id][key] = content  # the latest version of each wins

    def replay_calls(self, run_id: int) -> list[dict]:
        calls = []
        for _id, kind, _name, step, task, body, payload_body in self.spans[run_id]:
            body = body if payload_body is None else payload_body
            record = body.get("replay") if kind == Span.Kind.TOOL_CALL and isinstance(body, dict) else None
            if record:
                calls.append({**record, "task": task or "", "step": step})
        return calls

    def journals(self, run_id: int) -> dict[str, list]:
        """Each task's journal: (kind, name, body without how it was made, span id), the latest span of each
        step."""
        steps: dict[str, dict[int, tuple]] = {}
        for span_id, kind, name, step, task, body, payload_body in self.spans[run_id]:
            body = body if payload_body is None else payload_body
            if isinstance(body, dict):
                body = {k: v for k, v in body.items() if k not in _HOW}
            steps.setdefault(task or "", {})[step] = (kind, name, body, span_id)
        return {key: [entry for _, entry in sorted(found.items())] for key, found in steps.items()}


def _unmatched(ours: list[dict], theirs: list[dict]) -> list[dict]:
    """The calls of ``ours`` that ``theirs`` has no counterpart of (the same tool and arguments), in order."""
    left = Counter((c["tool"], c["digest"]) for c in theirs)
    out = []
    for call in ours:
        key = (call["tool"], call["digest"])
        if left[key]:
            left[key] -= 1
        else:
            out.append(call)
    return out


def _first_divergence(original: dict, replayed: dict) -> dict | None:
    """The replay's first step (in the order it was journaled) that is not the original's, per task; a
    task only one of the two has diverges at its first step."""
    found = []
    for key in set(original) | set(replayed):
        a, b = original.get(key) or [], replayed.get(key) or []
        for step in range(1, max(len(a), len(b)) + 1):
            x, y = (a[step - 1] if step <= len(a) else None), (b[step - 1] if step <= len(b) else None)
            if x is None or y is None or x[:3] != y[:3]:
                what = "only in the replay" if x is None else "only in the original" if y is None else (
                    f"{x[0]} {x[1]} / {y[0]} {y[1]}")  # fmt: skip
                order = y[3] if y is not None else float("inf")
                found.append((order, {"task": key, "step": step, "what": what}))
                break
    return min(found, key=lambda item: item[0])[1] if found else None


def _usage(run: Run) -> dict:
    seconds = (run.finished_at - run.started_at).total_seconds() if run.finished_at and run.started_at else None
    return {"steps": run.steps_used, "tokens": run.tokens_used, "cost_usd": run.cost_micros / 1_000_000,
            "seconds": seconds, "status": run.status, "reason": run.status_reason[:500]}  # fmt: skip


def _irreversible_first(calls: list[dict]) -> list[dict]:
    return sorted(calls, key=lambda c: (c.get("reversibility") != IRREVERSIBLE, not c.get("write")))


def pair_diff(original: Run | None, run: Run, reads: _Reads | None = None) -> dict:
    """One original and its replay: what differs (or None where the original is gone)."""
    reads = reads or _Reads([original.id if original else None], [run.id])
    replayed_calls = reads.replay_calls(run.id)
    # Settled once both are (a shadow's original may still be going).
    both = run.status in SETTLED and (original is None or original.status in SETTLED)
    base = {"original": original.id if original else None, "replay": run.id, "settled": both,
            "replay_usage": _usage(run)}  # fmt: skip
    if original is None:
        return {**base, "difference": None}
    original_calls = reads.calls[original.id]
    added = _irreversible_first(_unmatched(replayed_calls, original_calls))
    removed = _irreversible_first(_unmatched(original_calls, replayed_calls))
    outputs_a, outputs_b = reads.outputs[original.id], reads.outputs[run.id]
    divergence = _first_divergence(reads.journals(original.id), reads.journals(run.id))
    same = not added and not removed and outputs_a == outputs_b and original.status == run.status
    return {
        **base,
        "difference": not same,
        "status": {"original": original.status, "replay": run.status},
        "output_equal": outputs_a == outputs_b,
        "outputs_differing": sorted(k for k in set(outputs_a) | set(outputs_b) if outputs_a.get(k) != outputs_b.get(k)),
        "calls_added": added,
        "calls_removed": removed,
        "irreversible_added": [c for c in added if c.get("write") and c.get("reversibility") == IRREVERSIBLE],
        "would_wait_for_approval": [c for c in replayed_calls if c.get("verdict") == "approval"],
        "not_sent": [c for c in replayed_calls if c.get("answered") == NOT_SENT],
        "original_usage": _usage(original),
        "first_divergence": divergence,
    }


def replay_diff(replay: Replay, *, latest: int | None = None) -> dict:
    """Each pair's differences, and the totals (of the ``latest`` pairs only: a shadow's grow with traffic)."""
    pairs = replay.pairs.select_related("original", "run")
    found = list(pairs) if latest is None else list(pairs.order_by("-id")[:latest])[::-1]
    reads = _Reads([p.original_id for p in found], [p.run_id for p in found])
    pairs = [pair_diff(p.original, p.run, reads) for p in found]
    if replay.suite_id is not None:
        _graded(replay, found, pairs)
    # The totals are of the pairs that have settled: a half-done pair's difference is not one yet.
    counted = [p for p in pairs if p["difference"] is not None and p["settled"]]
    total = {
        "runs": len(pairs),
        "settled": sum(1 for p in pairs if p["settled"]),
        "differing": sum(1 for p in counted if p["difference"]),
        "calls_added": sum(len(p["calls_added"]) for p in counted),
        "calls_removed": sum(len(p["calls_removed"]) for p in counted),
        "irreversible_added": sum(len(p["irreversible_added"]) for p in counted),
        "would_wait_for_approval": sum(len(p["would_wait_for_approval"]) for p in counted),
        "outputs_differing": sum(1 for p in counted if not p["output_equal"]),
        "checks_regressed": sum(1 for p in counted if (p.get("checks") or {}).get("regressed")),
    }
    for field in ("steps", "tokens", "cost_usd"):
        total[f"{field}_original"] = sum(p["original_usage"][field] for p in counted)
        total[f"{field}_replay"] = sum(p["replay_usage"][field] for p in counted)
    return {"replay": replay.id, "candidate": replay.candidate, "total": total, "runs": pairs}


def _graded(replay: Replay, found: list[ReplayRun], pairs: list[dict]) -> None:
    """Each settled pair of a suite's replay, graded by its case's checks and judges (the judges graded
    once, when the replay run settled: replay_pair_grade; the original's, when its case's run did)."""
    originals = [p.original_id for p in found if p.original_id]
    cases, judged = {}, {}
    results = EvalResult.objects.filter(run_id__in=originals, case__suite_id=replay.suite_id).select_related("case")
    for result in results.order_by("id"):
        cases[result.run_id], judged[result.run_id] = result.case, result.grades or []  # the latest of each
    for pair, diff in zip(found, pairs, strict=True):
        case = cases.get(pair.original_id)
        if case is None or not diff["settled"]:
            continue
        before = check_failures(case, pair.original) + _judge_failures(judged[pair.original_id])
        after = check_failures(case, pair.run) + _judge_failures(pair.grades or [])
        diff["checks"] = {"case": case.name, "original": before, "replay": after,
                          "regressed": not before and bool(after), "fixed": bool(before) and not after,
                          "judges": {"original": judged[pair.original_id], "replay": pair.grades}}  # fmt: skip


def _judge_failures(grades: list[dict]) -> list[str]:
    failed = [g for g in grades if not g.get("passed")]
    return [f"judge on {g.get('artifact')}: {'no score' if g.get('score') is None else g['score']}" for g in failed]


FAIL_ON = ("irreversible-added", "check-regressed", "calls-added", "any-difference")


def replay_fails(diff: dict, fail_on: str) -> bool:
    """Whether ``diff`` crosses the line ``fail_on`` draws (manage.py replay --fail-on, for CI)."""
    total = diff["total"]
    if fail_on == "irreversible-added":  # the line CI draws: a new irreversible call, or a graded check lost
        return total["irreversible_added"] > 0 or total["checks_regressed"] > 0
    if fail_on == "check-regressed":
        return total["checks_regressed"] > 0
    if fail_on == "calls-added":
        return total["calls_added"] > 0
    if fail_on == "any-difference":
        return total["differing"] > 0
    raise invalid("fail_on", f"fail_on is one of {', '.join(FAIL_ON)}")
