"""Cost and tokens per agent and per model over time, for the insight page and its API.

Counted from the model-call spans (what each call was charged, as the gateway priced it), grouped in the
database by period (the day or the ISO week its run was created, as the rest of the insight page counts
a run), by the agent of the task and by the model that answered (the span's name). One query.
"""

import datetime as dt
from dataclasses import dataclass, field

from django.db.models import Count, F, Sum
from django.db.models.functions import TruncDate, TruncWeek

from runs.models import Span

GRAINS = ("day", "week")
TOP = 12  # agents and models shown, by cost


@dataclass
class UsageRow:
    """One agent's or one model's calls, tokens and cost per period (micro-dollars)."""

    label: str
    calls: int = 0
    tokens: int = 0
    cost_micros: int = 0
    cells: dict = field(default_factory=dict)  # period -> [tokens, cost_micros]

    def series(self, periods: list) -> list[tuple[int, int]]:
        return [tuple(self.cells.get(p, (0, 0))) for p in periods]


@dataclass
class Usage:
    grain: str
    periods: list[dt.date]  # the first day of each period, oldest first
    by_agent: list[UsageRow]
    by_model: list[UsageRow]


def _periods(since: dt.datetime, today: dt.date, grain: str) -> list[dt.date]:
    first = since.date()
    if grain == "week":
        first -= dt.timedelta(days=first.weekday())
    step = dt.timedelta(days=7 if grain == "week" else 1)
    found = []
    while first <= today:
        found.append(first)
        first += step
    return found


def usage_compute(*, runs_q, since: dt.datetime, today: dt.date, grain: str = "day") -> Usage:
    """``runs_q`` filters spans by their run (the insight page's selection, on ``run__``)."""
    grain = grain if grain in GRAINS else "day"
    trunc = TruncWeek("run__created_at") if grain == "week" else TruncDate("run__created_at")
    rows = (
        Span.objects.filter(runs_q, kind=Span.Kind.MODEL_CALL)
        .annotate(period=trunc)
        .values("period", "task__agent__slug", "name")
        .annotate(calls=Count("id"), tokens=Sum(F("tokens_in") + F("tokens_out")), cost=Sum("cost_micros"))
        .order_by()
    )
    agents: dict[str, UsageRow] = {}
    models: dict[str, UsageRow] = {}
    for row in rows:
        period = row["period"].date() if isinstance(row["period"], dt.datetime) else row["period"]
        for groups, label in ((agents, row["task__agent__slug"] or "(no agent)"), (models, row["name"])):
            group = groups.setdefault(label, UsageRow(label=label))
            group.calls += row["calls"]
            group.tokens += row["tokens"] or 0
            group.cost_micros += row["cost"] or 0
            cell = group.cells.setdefault(period, [0, 0])
            cell[0] += row["tokens"] or 0
            cell[1] += row["cost"] or 0

    def top(groups: dict) -> list[UsageRow]:
        return sorted(groups.values(), key=lambda g: (-g.cost_micros, -g.tokens, g.label))[:TOP]

    return Usage(grain=grain, periods=_periods(since, today, grain), by_agent=top(agents), by_model=top(models))
