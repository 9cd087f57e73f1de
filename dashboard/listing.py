"""The dashboard's runs list: its filters (read from a query string), what a row computes in Python, and
one row rendered on its own for live updates. The reads are runs.selectors.runs_list's."""

import re
from datetime import date

from django.template.loader import render_to_string
from django.utils import timezone

from approvals.selectors.queue import approvals_pending_counted
from core.errors import NotFound
from runs.models import Run
from runs.selectors.runs_list import RunFilters, run_row

SEARCH_MAX_LENGTH = 200
SLUG = re.compile(r"^[-a-zA-Z0-9_]+$")


def _date(value: str, label: str, errors: list[str]) -> date | None:
    if not value:
        return None
    try:
        return date.fromisoformat(value)
    except ValueError:
        errors.append(f"“{value[:40]}” is not a date (YYYY-MM-DD): the {label} date was ignored.")
        return None


def filters_parse(params, *, workflows=None, projects=None) -> RunFilters:
    """Read the filters from a QueryDict (GET, or a bulk form's hidden fields). ``workflows``/``projects``:
    the slugs that may be chosen; an unknown one is reported and ignored rather than matching nothing."""
    f = RunFilters()
    errors = f.errors
    known = set(Run.Status.values)
    for status in params.getlist("status"):
        if status in known:
            if status not in f.statuses:
                f.statuses.append(status)
        elif status:
            errors.append(f"“{status[:40]}” is not a run status: it was ignored.")
    for name, choices in (("workflow", workflows), ("project", projects)):
        value = params.get(name, "").strip()
        if not value:
            continue
        if not SLUG.match(value) or len(value) > 64 or (choices is not None and value not in choices):
            errors.append(f"There is no {name} “{value[:64]}” here: the {name} filter was ignored.")
        else:
            setattr(f, name, value)
    starter = params.get("starter", "").strip()
    if len(starter) > 150:
        errors.append("A username has at most 150 characters: the “started by” filter was ignored.")
    else:
        f.starter = starter
    f.since = _date(params.get("since", "").strip(), "“created since”", errors)
    f.until = _date(params.get("until", "").strip(), "“created until”", errors)
    if f.since and f.until and f.since > f.until:
        errors.append("“Created since” is after “created until”: the range was ignored.")
        f.since = f.until = None
    q = " ".join(params.get("q", "").split())
    if len(q) > SEARCH_MAX_LENGTH:
        errors.append(f"The search text was cut to its first {SEARCH_MAX_LENGTH} characters.")
        q = q[:SEARCH_MAX_LENGTH]
    f.q = q
    after = params.get("after", "").strip()
    if after:
        if after.isdigit() and 0 < int(after) < 2**63:
            f.after = int(after)
        else:
            errors.append(f"“{after[:40]}” is not a page position: showing the first page.")
    return f


def _duration(seconds: float) -> str:
    seconds = int(max(seconds, 0))
    days, rest = divmod(seconds, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    if days:
        return f"{days}d {hours}h"
    if hours:
        return f"{hours}h {minutes:02d}m"
    if minutes:
        return f"{minutes}m {secs:02d}s"
    return f"{secs}s"


def rows_prepare(runs, now=None) -> list[Run]:
    """What a row computes in Python: its cost in dollars, and its duration (a run not finished yet:
    since it started)."""
    now = now or timezone.now()
    runs = list(runs)
    for run in runs:
        run.cost_label = f"${run.cost_micros / 1_000_000:.4f}"
        run.cost_limit_label = "" if run.max_cost_micros is None else f"${run.max_cost_micros / 1_000_000:.4f}"
        if run.started_at is None:
            run.duration = ""
        else:
            end = run.finished_at if run.is_terminal and run.finished_at else now
            run.duration = _duration((end - run.started_at).total_seconds())
    return runs


def run_row_html(run_id: int) -> tuple[int, str]:
    """(project id, the run's ``run-row`` fragment), for the live-update publisher. Renders without a
    request: whoever receives it must be allowed to view the project, which the caller checks."""
    run = run_row(run_id, pending_approvals=approvals_pending_counted())
    if run is None:
        raise NotFound(f"run {run_id} does not exist")
    (run,) = rows_prepare([run])
    return run.project_id, render_to_string("runs/list.html#run-row", {"run": run})
