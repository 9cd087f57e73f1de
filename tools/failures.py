"""What a tool call can raise (re-exported by tools/kit.py, where teams import them from). Kept apart so
that the modules below the kit (tools/secrets.py) can refuse a call the same way a tool does."""


class ToolFailure(Exception):
    """Base of what a tool function raises."""


class ToolRefused(ToolFailure):
    """The system refused the request; nothing changed. Not tried again."""


class ToolUnavailable(ToolFailure):
    """The system is briefly unavailable; nothing changed. Worth another try."""


class ToolTimeout(ToolFailure):
    """No answer before the deadline: the change may or may not have been made."""


class ToolCutOff(ToolTimeout):
    """The broker stopped waiting at the tool's deadline: the call may still be under way."""
