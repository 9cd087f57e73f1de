"""State machines: a table of allowed moves and the one place that applies it.

Each app declares its machines (runs/transitions.py: run and task; tools/transitions.py: tool operation;
approvals/transitions.py: approval request). Every status change goes through one of them:

- ``move(obj, to, **fields)``: one row the caller holds locked; refuses a move the table forbids.
- ``move_where(queryset, to, **fields)``: the bulk variant; it touches only rows in a state the table
  lets reach ``to`` (``sources=`` narrows that further, and may not name a state the table forbids).
- ``assign(obj, to, **fields)``: the in-memory half, for the hand-written SQL fast paths that write the
  row themselves; those take their states from ``edge`` and ``sql_in`` so the table governs them too.

tests/core/test_status_writes.py fails when a status is written anywhere else.
"""

from collections.abc import Iterable, Mapping

from django.db.models import QuerySet


class TransitionNotAllowed(Exception):
    """A state machine refused a change; the message names the machine and both states."""

    def __init__(self, machine: str, current: str, to: str):
        self.machine, self.current, self.to = machine, current, to
        super().__init__(f"{machine} cannot go from {current} to {to}")


class StateMachine:
    def __init__(self, name: str, states: Iterable[str], table: Mapping[str, Iterable[str]]):
        self.name = name
        self.table = {str(source): frozenset(str(s) for s in targets) for source, targets in table.items()}
        missing = set(map(str, states)) ^ set(self.table)
        if missing:  # a state the table forgets is a state nothing can leave (or a typo)
            raise ValueError(f"the {name} table does not match its states: {sorted(missing)}")

    def __getitem__(self, source: str) -> frozenset[str]:
        return self.table[source]

    def allowed(self, current: str, to: str) -> bool:
        return to in self.table[current]

    def check(self, current: str, to: str) -> None:
        if not self.allowed(current, to):
            raise TransitionNotAllowed(self.name, current, to)

    def sources(self, to: str) -> frozenset[str]:
        """The states from which ``to`` may be reached."""
        return frozenset(source for source, targets in self.table.items() if to in targets)

    def edge(self, current: str, to: str) -> str:
        """``to``, once the table allows ``current -> to``: a SQL fast path names its move with this, so
        the module fails to load when the table stops allowing it."""
        self.check(current, to)
        return to

    def sql_in(self, to: str, sources: Iterable[str] | None = None) -> str:
        """The allowed sources of ``to`` as a SQL list literal, e.g. ``('pending', 'ready')``. The states
        are the model's own constants, never input."""
        chosen = self._sources(to, sources)
        return "(" + ", ".join(f"'{s}'" for s in sorted(chosen)) + ")"

    def seen(self, obj, status: str) -> None:
        """Record in memory a status a statement just read back from the row (not a move)."""
        if status not in self.table:
            raise ValueError(f"{self.name} has no state {status!r}")
        obj.status = status

    def assign(self, obj, to: str, **fields) -> None:
        self.check(obj.status, to)
        obj.status = to
        for name, value in fields.items():
            setattr(obj, name, value)

    def move(self, obj, to: str, **fields) -> None:
        """Change one row the caller holds (locked, or fenced by its own WHERE) and its in-memory copy."""
        self.assign(obj, to, **fields)
        type(obj)._default_manager.filter(pk=obj.pk).update(status=to, **fields)

    def move_where(self, queryset: QuerySet, to: str, *, sources: Iterable[str] | None = None, **fields) -> int:
        """Move every row of ``queryset`` that may reach ``to``; returns how many moved."""
        chosen = self._sources(to, sources)
        return queryset.filter(status__in=sorted(chosen)).update(status=to, **fields)

    def _sources(self, to: str, sources: Iterable[str] | None) -> frozenset[str]:
        allowed = self.sources(to)
        if sources is None:
            return allowed
        chosen = frozenset(map(str, sources))
        for source in chosen - allowed:
            raise TransitionNotAllowed(self.name, source, to)
        return chosen
