"""Reads for the replay pages: a person's replays, the runs a replay may try, and a pair's journals side by
side. Who may read what is decided by tenancy.access (the pages ask before they read here)."""

from django.db.models import Count

from agents.models import Agent, AgentVersion, Workflow
from runs.models import Run, Span, Task
from tenancy.access import visible_rows

from .models import Replay, ReplayRun
from .services import SETTLED

# Journal keys that say how a step was made, not what it was; the pair view's per-step "same" leaves
# them out as replay.services does when it finds the first divergence (which the page takes from there).
HOW = frozenset({"request", "retries", "cached", "replay", "refused"})
STEPS_SHOWN = 2000  # per run: a pair view of a larger run says how many more the API and the run pages have


def replays_for_user(user, *, shown: int = 100) -> list[Replay]:
    """The newest replays of the projects ``user`` may view, with their number of runs. One query."""
    rows = Replay.objects.select_related("project", "created_by").annotate(runs=Count("pairs"))
    return list(visible_rows(rows, user).order_by("-id")[:shown])


def replay_for_page(replay_id: int) -> Replay | None:
    """The replay with its project, its author and its candidate version's agent. One query."""
    rows = Replay.objects.select_related("project", "created_by", "candidate_version__agent")
    return rows.filter(id=replay_id).first()


def replay_pair(replay: Replay, original_id: int) -> ReplayRun | None:
    return replay.pairs.select_related("original", "run").filter(original_id=original_id).first()


# --- what a replay may try ---------------------------------------------------------------------------------
def workflow_agent_slugs(workflow: Workflow) -> list[str]:
    """The agents a workflow's runs use, the workers first: its static plan's, those a planner may assign,
    then the planner."""
    slugs = [t.get("agent") for t in workflow.tasks or [] if isinstance(t, dict)]
    slugs += list(workflow.agents or [])
    if workflow.planner_agent_id:
        slugs.append(workflow.planner_agent.slug)
    return list(dict.fromkeys(s for s in slugs if isinstance(s, str) and s))


def replayable_workflows() -> list[Workflow]:
    """Workflows whose runs Warden ran itself (an external agent's cannot be run again). One query."""
    rows = Workflow.objects.select_related("project", "planner_agent").exclude(planner=Workflow.Planner.EXTERNAL)
    return list(rows.order_by("slug"))


def agent_versions(slug: str) -> list[AgentVersion]:
    """An agent's versions, newest first (drafts are their replay's, not the agent's history)."""
    return list(AgentVersion.objects.filter(agent__slug=slug, draft=False).order_by("-number"))


def agent_current(slug: str) -> Agent | None:
    return Agent.objects.filter(slug=slug).first()


def runs_to_replay(*, workflow: Workflow, project_id: int, statuses, limit: int) -> list[Run]:
    """The latest ``limit`` settled live runs of ``workflow`` in the project, with one of ``statuses``."""
    statuses = [s for s in statuses if s in SETTLED] or list(SETTLED)
    rows = Run.objects.filter(workflow=workflow, project_id=project_id, mode=Run.Mode.LIVE, status__in=statuses)
    return list(rows.only("id", "status", "finished_at", "created_at").order_by("-id")[:limit])


def run_projects(run_ids) -> dict[int, int]:
    """{run id: its project id} of those that exist."""
    return dict(Run.objects.filter(id__in=run_ids).values_list("id", "project_id"))


def run_for_replay_form(run_id: int) -> Run | None:
    return Run.objects.select_related("workflow", "project").filter(id=run_id).first()


# --- a pair side by side -----------------------------------------------------------------------------------
def _journal(run_id: int) -> tuple[list[str], dict[str, dict[int, dict]], int]:
    """Task keys in plan order, each task's steps (the latest span of each, as the engine reads its
    journal), and how many steps there are. Two queries."""
    tasks = list(Task.objects.filter(run_id=run_id).order_by("id").values_list("key", flat=True))
    rows = (
        Span.objects.filter(run_id=run_id, step__isnull=False)
        .order_by("id")
        .values("id", "task__key", "step", "kind", "name", "status", "body", "payload__body")[: STEPS_SHOWN * 2]
    )
    steps: dict[str, dict[int, dict]] = {}
    for row in rows:
        body = row["payload__body"] if row["body"] is None else row["body"]
        entry = {"span": row["id"], "kind": row["kind"], "name": row["name"], "status": row["status"], "body": body}
        steps.setdefault(row["task__key"], {})[row["step"]] = entry
    return tasks, steps, sum(len(s) for s in steps.values())


def _what(entry: dict | None):
    if entry is None:
        return None
    body = entry["body"]
    if isinstance(body, dict):
        body = {k: v for k, v in body.items() if k not in HOW}
    return entry["kind"], entry["name"], body


def pair_side_by_side(original_id: int, replay_run_id: int) -> dict:
    """Each task's journal steps of the original and of its replay, aligned by task and step:
    {"tasks": [{"key", "rows": [{"step", "original", "replay", "same"}]}], "steps": (original, replay)}.
    Four queries."""
    order_a, steps_a, count_a = _journal(original_id)
    order_b, steps_b, count_b = _journal(replay_run_id)
    tasks = []
    for key in dict.fromkeys([*order_a, *order_b]):
        a, b = steps_a.get(key, {}), steps_b.get(key, {})
        rows = []
        for step in range(1, max([0, *a, *b]) + 1):
            left, right = a.get(step), b.get(step)
            rows.append({"step": step, "original": left, "replay": right, "same": _what(left) == _what(right)})
        only = "" if bool(a) == bool(b) else "original" if a else "replay"
        tasks.append({"key": key, "rows": rows, "only": only})
    return {"tasks": tasks, "steps": (count_a, count_b)}
