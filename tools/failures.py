"""What a tool call can raise (re-exported by tools/kit.py, where teams import them from). Kept apart so
that the modules below the kit (tools/secrets.py) can refuse a call the same way a tool does."""

import re

# What a refusal becomes (a tool's ``on_refusal``): as the agent (a model-driven agent's model is told,
# a scripted agent's task fails), or the same for every agent.
ON_REFUSAL_AS_AGENT, ON_REFUSAL_MODEL, ON_REFUSAL_FAIL = "", "model", "fail"
ON_REFUSAL = (ON_REFUSAL_AS_AGENT, ON_REFUSAL_MODEL, ON_REFUSAL_FAIL)
_CODE = re.compile(r"^[a-z][a-z0-9_]{0,39}$")


class ToolFailure(Exception):
    """Base of what a tool function raises."""


class ToolRefused(ToolFailure):
    """The system refused the request; nothing changed. Not tried again: a model-driven agent is told
    (``{"error": {"code", "message"}}``) and may correct its call. ``code``: a short lower-case word the
    model reads with the message (``http_422``, ``amount_too_large``)."""

    code = "tool_refused"

    def __init__(self, *args, code: str = ""):
        super().__init__(*args)
        if code and _CODE.fullmatch(code):
            self.code = code


class ToolMisconfigured(ToolRefused):
    """Warden or the system refused the call as the tool is set up (a host or command no longer allowed,
    a header, a secret not granted, a credential refused): no argument the model could change would help,
    so the task fails for a person to mend the declaration, whatever ``on_refusal`` says."""

    code = "tool_misconfigured"


class ToolUnavailable(ToolFailure):
    """The system is briefly unavailable; nothing changed. Worth another try."""


class ToolTimeout(ToolFailure):
    """No answer before the deadline: the change may or may not have been made."""


class ToolCutOff(ToolTimeout):
    """The broker stopped waiting at the tool's deadline: the call may still be under way."""
