"""Which tool a name means for a project: Warden's registry (Python tools, the same everywhere), else
the project's own HTTP tools and MCP servers' tools (declared in the admin). A project's tool is nobody
else's: another project's run asking for it finds no such tool."""

from .http_tools import http_tool_find
from .kit import ToolSpec
from .mcp_tools import mcp_tool_find
from .registry import TOOLS


def tool_spec(name: str, project_id: int | None) -> ToolSpec | None:
    spec = TOOLS.get(name)
    if spec is not None or project_id is None or not isinstance(name, str):
        return spec
    return http_tool_find(name, project_id) or mcp_tool_find(name, project_id)
