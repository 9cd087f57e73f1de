"""Which tool a name means for a project: Warden's registry (Python tools, the same everywhere), else
the project's own HTTP tools and MCP servers' tools (declared in the admin). A project's tool is nobody
else's: another project's run asking for it finds no such tool.

A declared tool's spec carries its *effective* class, the one the gate and the broker act on:

- an HTTP tool: its declaration (never below its method's floor, tools/http_tools.py), made stricter by a
  project admin's classification of the same name, never looser;
- an MCP tool: the class a project admin confirmed (a classification of the same name); until one does,
  the most dangerous class, unclassified. The server's annotations are only a suggestion: MCP calls them
  hints, and a server is not trusted to say its own tool is harmless.

``declaration`` is a digest of what the call is (target, headers, class): an approval binds it, so a call
whose declaration changed after it was approved waits for a new approval (tools/gate.py).
"""

import hashlib
from dataclasses import replace

from policy.classes import (  # noqa: F401  (the order, read here by the tools' governance)
    CLASS_RANK,
    REVERSIBILITY_RANK,
    stricter_class,
    stricter_reversibility,
)

from .http_tools import http_tool_find
from .kit import ToolSpec
from .mcp_tools import mcp_tool_find
from .models import ToolClassification
from .registry import TOOLS, Reversibility, ToolClass


def tool_spec(name: str, project_id: int | None) -> ToolSpec | None:
    spec = TOOLS.get(name)
    if spec is not None or project_id is None or not isinstance(name, str):
        return spec
    declared = http_tool_find(name, project_id) or mcp_tool_find(name, project_id)
    if declared is None:
        return None
    row = (
        ToolClassification.objects.filter(project_id=project_id, tool=name)
        .values_list("tool_class", "reversibility", "approval")
        .first()
    )
    return declared_effective(declared, row)


def declared_effective(spec: ToolSpec, row: tuple | None) -> ToolSpec:
    """A declared tool's spec with its effective class, given the project's classification ``row``
    ((tool_class, reversibility, approval) or None)."""
    if spec.kind == "mcp":
        if row is None:
            tool_class, reversibility, classified = ToolClass.NON_IDEMPOTENT_WRITE, Reversibility.IRREVERSIBLE, False
        else:
            # MCP cannot say how an effect is undone: a confirmed write is irreversible whatever it says.
            tool_class, classified = row[0], True
            reversibility = Reversibility.NONE if tool_class == ToolClass.READ_ONLY else Reversibility.IRREVERSIBLE
    else:
        tool_class = stricter_class(spec.tool_class, row[0] if row else "")
        reversibility = stricter_reversibility(spec.reversibility, row[1] if row else "")
        classified = True
    if tool_class != ToolClass.READ_ONLY and not reversibility:
        reversibility = Reversibility.IRREVERSIBLE
    approval = row[2] if row else ""
    digest = hashlib.sha256(f"{spec.declaration}|{tool_class}|{reversibility}".encode()).hexdigest()
    return replace(
        spec,
        tool_class=tool_class,
        reversibility=reversibility,
        classified=classified,
        approval=approval,
        declaration=digest,
    )
