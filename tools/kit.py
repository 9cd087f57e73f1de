"""The tool kit: how a team declares its own tools in Python (docs/tools.md, "Python tools").

    from pydantic import Field
    from tools.kit import ToolArguments, ToolResult, ToolClass, Reversibility, Undo, tool

    class RefundArgs(ToolArguments):
        charge_id: str = Field(pattern=r"^ch_[a-z0-9]+$")
        amount_cents: int = Field(gt=0)

    class Refund(ToolResult):
        refund_id: str

    @tool(
        "payments.refund",
        arguments=RefundArgs,
        result=Refund,
        tool_class=ToolClass.NON_IDEMPOTENT_WRITE,
        reversibility=Reversibility.IRREVERSIBLE,
        secrets=["PAYMENTS_API_KEY"],
        external_id="refund_id",
    )
    def refund(arguments: RefundArgs, *, key: str, secrets: dict, deadline: float) -> Refund:
        ...  # call the payments service with `key` as its idempotency key, within `deadline` seconds

The module is named in WARDEN_TOOL_MODULES; Warden imports it at start-up and checks every declaration
before it registers any (tools/registry.py). A tool function raises ToolRefused (nothing changed, do not
retry; a model-driven agent is told, per ``on_refusal``), ToolMisconfigured (the call cannot be made as the
tool is set up: the task fails for a person), ToolUnavailable (nothing changed, worth another try) or
ToolTimeout (no answer in time: the change may or may not have been made, so Warden reconciles by key, or
a person decides). Secrets are named, never
passed by the model: the broker reads them at call time from the secret source (the environment by
default, WARDEN_SECRET_SOURCE for another) and hands them to the function alone.
"""

import re
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from jsonschema import Draft202012Validator
from pydantic import BaseModel, ConfigDict, ValidationError

# Teams import the failures and the default secret source from here.
from policy.classes import Reversibility, ToolClass  # noqa: F401  (what a tool's author declares)

from .failures import (  # noqa: F401
    ON_REFUSAL,
    ToolCutOff,
    ToolFailure,
    ToolMisconfigured,
    ToolRefused,
    ToolTimeout,
    ToolUnavailable,
)
from .secrets import SECRET_NAME, environment_secret, scrub, secret_read, secrets_for  # noqa: F401

SECRET = {"secret": True}  # json_schema_extra of an argument field that must never be shown
NAME = re.compile(r"^[a-z][a-z0-9_]*(\.[a-z][a-z0-9_]*)+$")  # system.operation, e.g. payments.refund


class ToolArguments(BaseModel):
    """Arguments as the model must send them: unknown fields are an error."""

    model_config = ConfigDict(extra="forbid")


class ToolResult(BaseModel):
    """What the system answers, as much of it as the tool declares (the rest is dropped)."""

    model_config = ConfigDict(extra="ignore")


class OpenResult(BaseModel):
    """The result of a tool declared without code (HTTP, MCP): the system's JSON object as it is."""

    model_config = ConfigDict(extra="allow")


class ArgumentsInvalid(ValueError):
    """A model's arguments do not match the tool's declaration; ``fields``: [{field, message}]."""

    def __init__(self, fields: list[dict]):
        super().__init__("; ".join(f"{f['field']}: {f['message']}" for f in fields))
        self.fields = fields


@dataclass(frozen=True)
class Undo:
    """What undoes (reversible) or corrects (irreversible) an effect: another registered tool, with
    arguments derived from the call's arguments and its receipt."""

    tool: str
    arguments: Callable[[dict, dict], dict]


@dataclass(frozen=True)
class ToolSpec:
    name: str
    system: str
    tool_class: str
    reversibility: str
    arguments: type[BaseModel]
    result: type[BaseModel]
    # execute(validated_args_dict, key=..., logged=..., fault=..., deadline=..., secrets=...) -> dict
    execute: Callable[..., dict]
    # Status lookup by idempotency key, for reconciling an ambiguous write; None when the system has none.
    lookup: Callable[[str], dict | None] | None = None
    # For a reversible write, the undo; for an irreversible one, the correction: (arguments, result) -> (tool, args)
    undo: Callable[[dict, dict], tuple[str, dict]] | None = None
    cacheable: bool = False  # a read whose result may be reused within a run
    timeout_seconds: float = 10.0
    rate_per_minute: int | None = None
    internal: bool = False  # used by the engine (compensations); not for agents' allowlists
    description: str = ""
    secret_fields: frozenset = field(default=frozenset())
    secrets: tuple[str, ...] = ()  # named credentials the broker hands the function at call time
    external_id: str = ""  # the result field that names the created object (a ticket id, a message id)
    undo_tool: str = ""  # the tool ``undo`` calls, checked when the tools are loaded
    module: str = ""
    # The broker runs the call in a thread of its own and stops waiting at timeout_seconds (a team's
    # tool); the sandbox systems, in Warden's own database, keep to the deadline they are given.
    cut_off: bool = False
    # A tool declared without code (HTTP, MCP): the JSON Schema of its arguments, in place of a model's,
    # and the project it belongs to (it is nobody else's).
    parameters: dict | None = None
    project_id: int | None = None
    kind: str = "python"  # python, http or mcp
    classified: bool = True  # False: an MCP tool no project admin has classified yet (tools/catalog.py)
    approval: str = ""  # a declared tool's project classification: "", "always" or "refuse"
    # A declared tool's version: a digest of what a call of it is (target, method, headers, server, class).
    declaration: str = ""
    # What the system's refusal (ToolRefused) becomes: "" as the agent (its model is told if it is
    # model-driven, a scripted agent's task fails), "model" or "fail" (docs/tools.md, "Refusals").
    on_refusal: str = ""
    # A write's stand-in answer in a replay run, where it is never sent (tools/replaying.py); None: the
    # replay's model is told the call was not sent.
    replay_result: dict | None = None
    # A read safe to send again, whatever the arguments (no effect, no cost worth counting): a replay that
    # allows live reads sends the ones its original did not make (tools/replaying.py).
    repeatable: bool = False

    @property
    def is_write(self) -> bool:
        return self.tool_class != ToolClass.READ_ONLY

    def arguments_schema(self) -> dict:
        """The JSON Schema of the arguments, as the model is shown it."""
        return self.parameters if self.parameters is not None else self.arguments.model_json_schema()

    def argument_names(self) -> set[str]:
        if self.parameters is not None:
            return set((self.parameters.get("properties") or {}).keys())
        return set(self.arguments.model_fields)

    def arguments_validated(self, values) -> dict:
        """The arguments as they will be sent, or ArgumentsInvalid with each field's reason."""
        if self.parameters is not None:
            if not isinstance(values, dict):
                raise ArgumentsInvalid([{"field": "arguments", "message": "must be an object"}])
            errors = sorted(Draft202012Validator(self.parameters).iter_errors(values), key=lambda e: list(e.path))
            if errors:
                raise ArgumentsInvalid([_schema_error(e) for e in errors[:20]])
            return dict(values)
        try:
            return self.arguments.model_validate(values).model_dump()
        except ValidationError as exc:
            raise ArgumentsInvalid(
                [{"field": ".".join(map(str, e["loc"])) or "arguments", "message": e["msg"]} for e in exc.errors()]
            ) from exc


def _schema_error(error) -> dict:
    # The validator's own message quotes the value; the field and the rule are enough to mend a call.
    field = ".".join(map(str, error.absolute_path)) or "arguments"
    if error.validator == "required":
        return {"field": field, "message": error.message[:200]}
    if error.validator == "additionalProperties":
        return {"field": field, "message": "unknown fields are not allowed"}
    return {"field": field, "message": f"does not satisfy {error.validator}={json_short(error.validator_value)}"}


def json_short(value) -> str:
    text = str(value)
    return text if len(text) <= 80 else text[:77] + "..."


def secret_fields(model: type[BaseModel]) -> frozenset:
    return frozenset(name for name, info in model.model_fields.items() if (info.json_schema_extra or {}).get("secret"))


_declared: dict[str, list[ToolSpec]] = defaultdict(list)  # by module, as its import declared them


def declare(spec: ToolSpec) -> ToolSpec:
    """Declare a ready-made spec (the sandbox module does; teams use @tool). Checked when loaded."""
    _declared[spec.module].append(spec)
    return spec


def declared(module: str) -> list[ToolSpec]:
    return list(_declared.get(module, ()))


def _adapters(function, arguments: type[BaseModel], lookup, undo: Undo | None, names: tuple[str, ...]):
    """The broker's calling conventions around a team's functions: execute, lookup by key, undo."""

    def execute(values: dict, *, key: str, deadline: float, secrets: dict, **_drill) -> dict:
        answer = function(arguments.model_validate(values), key=key, secrets=secrets, deadline=deadline)
        return answer.model_dump(mode="json") if isinstance(answer, BaseModel) else answer

    def find(key: str) -> dict | None:
        secrets = secrets_for(names, project_id=None)  # the deployment's own code: no grant needed
        return scrub(lookup(key, secrets=secrets), secrets.values())

    def undo_call(values: dict, receipt: dict) -> tuple[str, dict]:
        return undo.tool, undo.arguments(values, receipt)

    if undo is not None:
        undo_call.__name__ = f"calling {undo.tool}"
    return execute, find if lookup is not None else None, undo_call if undo is not None else None


def tool(
    name: str,
    *,
    arguments: type[BaseModel],
    result: type[BaseModel],
    tool_class: str,
    reversibility: str = Reversibility.NONE,
    undo: Undo | None = None,
    lookup: Callable[..., dict | None] | None = None,
    timeout_seconds: float = 10.0,
    rate_per_minute: int | None = None,
    secrets: Sequence[str] = (),
    cacheable: bool = False,
    internal: bool = False,
    external_id: str = "",
    description: str = "",
    on_refusal: str = "",
    replay_result: dict | None = None,
    repeatable: bool = False,
):
    """Declare the decorated function as the tool ``name``. The function gets the validated arguments
    (an instance of ``arguments``), the idempotency key to pass to the system, the secrets it named and
    its deadline in seconds; it returns a dict or a ``result`` instance. ``lookup(key, secrets=...)``
    finds what a call with that key did, for reconciling a write whose answer was lost. ``on_refusal``:
    what a ToolRefused the function raises becomes ("" as the agent, "model" or "fail"). ``replay_result``:
    a write's stand-in answer in a replay, where it is never sent (checked against ``result`` when loaded).
    ``repeatable``: a read safe to send again, which a replay allowing live reads may send."""
    names = tuple(secrets)

    # Declared as they are given: the ToolSpec's fields of the same names.
    given = {"tool_class": tool_class, "reversibility": reversibility, "arguments": arguments, "result": result,
             "cacheable": cacheable, "timeout_seconds": timeout_seconds, "rate_per_minute": rate_per_minute,
             "internal": internal, "external_id": external_id, "on_refusal": on_refusal,
             "replay_result": replay_result, "repeatable": repeatable}  # fmt: skip

    def decorate(function):
        execute, find, undo_call = _adapters(function, arguments, lookup, undo, names)
        declare(
            ToolSpec(
                name=name,
                system=name.partition(".")[0],
                execute=execute,
                lookup=find,
                undo=undo_call,
                undo_tool=undo.tool if undo is not None else "",
                description=description or (function.__doc__ or "").strip().split("\n")[0],
                secret_fields=secret_fields(arguments) if isinstance(arguments, type) else frozenset(),
                secrets=names,
                module=function.__module__,
                cut_off=True,
                **given,
            )
        )
        return function

    return decorate
