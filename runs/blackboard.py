"""The blackboard: durable knowledge shared between a run's tasks (seed 001's memory design).

Two tools, allowed per agent like any other (trusted configuration), handled by the engine rather than
the broker since they change nothing outside Warden:

- ``blackboard.write {key, kind, value, expected_version, sources, ttl_seconds}`` — a new version of
  ``key`` if its latest version is still ``expected_version`` (0: the key is new): compare-and-set, so
  of two writers who read the same version one wins and the other is told the current version. The
  value must be of its kind; ``sources`` names the tasks whose artifacts it rests on.
- ``blackboard.verify {key, version, verdict, note}`` — a verifier's verdict on another task's entry.

Tasks' prompts carry only verified, unexpired entries (the latest verified version of each key), with
their source and time. A write replayed after a crash finds the version it made and answers the same.
"""

from django.db import IntegrityError, transaction
from django.utils import timezone
from pydantic import ValidationError

from core import bus
from core.errors import InvalidInput, NotFound
from tenancy.audit import audited
from tools.broker import ToolOutcome
from tools.memory import MEMORY_TOOLS, TOOL_SCHEMAS, VERIFY, WRITE, VerifyArgs, WriteArgs  # noqa: F401

from .models import Artifact, BlackboardEntry, Run, Task

KINDS = {"text": str, "number": (int, float), "flag": bool, "record": dict, "list": list}


def _error(code: str, message: str, **extra):

    return ToolOutcome(error={"code": code, "message": message, **extra})


def _result(entry: BlackboardEntry):

    return ToolOutcome(result={"key": entry.key, "version": entry.version, "verification": entry.verification})


def memory_tool_call(*, run: Run, task: Task, step: int, name: str, arguments):
    if name not in task.allowed_tools:
        return _error(
            "not_allowed", f"tool {name!r} is not allowed for this task", available=sorted(task.allowed_tools)
        )
    if not isinstance(arguments, dict):
        return _error("invalid_arguments", f"the arguments of {name} must be an object")
    try:
        args = (WriteArgs if name == WRITE else VerifyArgs).model_validate(arguments)
    except ValidationError as exc:
        fields = [{"field": ".".join(map(str, e["loc"])) or "arguments", "message": e["msg"]} for e in exc.errors()]
        return _error("invalid_arguments", f"invalid arguments for {name}", fields=fields)
    return _write(run, task, step, args) if name == WRITE else _verify(run, task, args)


def _write(run: Run, task: Task, step: int, args: WriteArgs):
    mine = BlackboardEntry.objects.filter(run_id=run.id, author_task_id=task.id, author_step=step).first()
    if mine is not None:
        return _result(mine)  # this step wrote it before a crash or a retry: the same answer
    if not isinstance(args.value, KINDS[args.kind]) or (args.kind == "number" and isinstance(args.value, bool)):
        return _error("invalid_arguments", f"the value is not of kind {args.kind}")
    found = dict(
        Artifact.objects.filter(run_id=run.id, task__key__in=args.sources)
        .order_by("version")
        .values_list("task__key", "id")
    )  # each task's latest artifact
    missing = sorted(set(args.sources) - set(found))
    if missing:
        return _error("invalid_arguments", f"no artifact from {', '.join(missing)} to rest on")
    sources = sorted(found.values())
    latest = BlackboardEntry.objects.filter(run_id=run.id, key=args.key).order_by("-version").first()
    current = latest.version if latest else 0
    if current != args.expected_version:
        return _error("version_conflict", f"{args.key} is at version {current}, not {args.expected_version}",
                      current_version=current)  # fmt: skip
    if latest is not None and latest.kind != args.kind:
        return _error("invalid_arguments", f"{args.key} holds a {latest.kind}, not a {args.kind}")
    expires = timezone.now() + timezone.timedelta(seconds=args.ttl_seconds) if args.ttl_seconds else None
    try:
        with transaction.atomic():  # the unique (run, key, version) settles a race between two writers
            entry = BlackboardEntry.objects.create(
                run_id=run.id, key=args.key, version=current + 1, kind=args.kind, value=args.value,
                author_task_id=task.id, author_step=step, sources=sources, expires_at=expires,
            )  # fmt: skip
    except IntegrityError:
        now_at = BlackboardEntry.objects.filter(run_id=run.id, key=args.key).order_by("-version").first().version
        return _error("version_conflict", f"{args.key} was written meanwhile: it is at version {now_at}",
                      current_version=now_at)  # fmt: skip
    return _result(entry)


def _verify(run: Run, task: Task, args: VerifyArgs):
    entry = BlackboardEntry.objects.filter(run_id=run.id, key=args.key, version=args.version).first()
    if entry is None:
        return _error("not_found", f"{args.key} has no version {args.version}")
    if entry.author_task_id == task.id:
        return _error("not_allowed", "a task cannot verify its own entry")
    BlackboardEntry.objects.filter(id=entry.id).update(verification=args.verdict, verified_by=task.key, note=args.note)
    entry.refresh_from_db()
    return _result(entry)


def knowledge(run_id: int) -> list[dict]:
    """What a task's prompt may carry: per key, the latest verified version that has not expired."""
    now = timezone.now()
    rows = (
        BlackboardEntry.objects.filter(run_id=run_id, verification=BlackboardEntry.Verification.VERIFIED)
        .exclude(expires_at__lt=now)
        .select_related("author_task")
        .order_by("key", "-version")
    )
    seen, found = set(), []
    for entry in rows:
        if entry.key in seen:
            continue
        seen.add(entry.key)
        found.append(
            {
                "key": entry.key,
                "version": entry.version,
                "value": entry.value,
                "by": entry.author_task.key if entry.author_task_id else "an operator",
                "verified_by": entry.verified_by,
                "sources": entry.sources,
                "at": entry.created_at.strftime("%Y-%m-%d %H:%M UTC"),
            }
        )
    return found


def entry_decide(
    *, entry_id: int, verdict: str, note: str = "", by: str = "", actor=None, via: str = "", request=None
) -> BlackboardEntry:
    """A person's verdict on one version of an entry (the dashboard or the admin), audited. It may
    overrule a verifier task's verdict either way: from the next attempt on, prompts carry the entry
    only if it is verified. ``by``: the name it is recorded under (by default the actor's)."""
    by = by or (f"{actor.get_username()} (operator)" if actor is not None else "an operator")
    if verdict not in (BlackboardEntry.Verification.VERIFIED, BlackboardEntry.Verification.REJECTED):
        raise InvalidInput("the verdict is verified or rejected", [{"field": "verdict", "message": "required"}])
    note = note.strip()
    if verdict == BlackboardEntry.Verification.REJECTED and not note:
        raise InvalidInput("say why the entry is wrong", [{"field": "note", "message": "required to reject"}])
    if len(note) > 1000:
        raise InvalidInput("the note is too long", [{"field": "note", "message": "at most 1000 characters"}])
    who = {"actor": actor, "via": via, "request": request}
    with audited("blackboard_decide", **who, target=f"blackboard entry {entry_id}") as act:
        entry = BlackboardEntry.objects.select_for_update().select_related("run").filter(id=entry_id).first()
        if entry is None:
            raise NotFound(f"blackboard entry {entry_id} does not exist")
        act.update(
            target=f"blackboard entry {entry.id} ({entry.key} v{entry.version})",
            run_id=entry.run_id,
            project_id=entry.run.project_id,
            detail={"verdict": verdict, "note": note, "key": entry.key, "version": entry.version},
        )
        entry.verification, entry.verified_by, entry.note = verdict, by[:100], note
        entry.save(update_fields=["verification", "verified_by", "note"])
        bus.run_changed(entry.run_id)
    return entry
