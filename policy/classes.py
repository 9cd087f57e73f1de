"""What a tool does, as the rules of a decision read it: its side-effect class and whether its effect can be
undone, and their order from harmless to most dangerous. Tools declare them (tools.kit re-exports these);
the gate's verdicts compare them (policy/verdicts.py)."""


class ToolClass:
    READ_ONLY = "read_only"
    IDEMPOTENT_WRITE = "idempotent_write"  # the system deduplicates by the idempotency key
    NON_IDEMPOTENT_WRITE = "non_idempotent_write"  # it does not: a repeat is a duplicate
    ALL = (READ_ONLY, IDEMPOTENT_WRITE, NON_IDEMPOTENT_WRITE)


class Reversibility:
    NONE = ""  # a read
    REVERSIBLE = "reversible"  # undone by another call (close the ticket)
    IRREVERSIBLE = "irreversible"  # only corrected (a correction e-mail)
    ALL = (NONE, REVERSIBLE, IRREVERSIBLE)


CLASS_RANK = {ToolClass.READ_ONLY: 0, ToolClass.IDEMPOTENT_WRITE: 1, ToolClass.NON_IDEMPOTENT_WRITE: 2}
REVERSIBILITY_RANK = {Reversibility.NONE: 0, Reversibility.REVERSIBLE: 1, Reversibility.IRREVERSIBLE: 2}


def stricter_class(*classes: str) -> str:
    """The most dangerous of these side-effect classes (an unknown one counts as the most dangerous)."""
    return max((c for c in classes if c), key=lambda c: CLASS_RANK.get(c, 2), default=ToolClass.READ_ONLY)


def stricter_reversibility(*values: str) -> str:
    return max(values, key=lambda r: REVERSIBILITY_RANK.get(r, 2), default=Reversibility.NONE)
