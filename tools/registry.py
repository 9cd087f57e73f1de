"""The registry of tools: trusted configuration, which what a model asks for is checked against.

Filled at start-up from the tool modules WARDEN["TOOL_MODULES"] names (tools.apps): each module declares its
tools with the kit (tools/kit.py); every declaration of every module is checked before any is registered,
so a bad one stops the start with its reason and nothing is half-registered.
"""

import importlib

from django.core.exceptions import ImproperlyConfigured
from pydantic import ValidationError

from .kit import (  # noqa: F401  (the names the broker, the gate and the pages read from here)
    NAME,
    ON_REFUSAL,
    SECRET,
    SECRET_NAME,
    Reversibility,
    ToolClass,
    ToolSpec,
    declared,
)
from .memory import MEMORY_TOOLS
from .secrets import REDACTED, secret_problems

TOOLS: dict[str, ToolSpec] = {}


def redact(spec: ToolSpec, arguments: dict) -> dict:
    """The arguments with secret fields replaced; safe for spans, the ledger, logs, pages and the API."""
    if not spec.secret_fields or not isinstance(arguments, dict):
        return arguments
    return {k: (REDACTED if k in spec.secret_fields and v is not None else v) for k, v in arguments.items()}


def _problems(spec: ToolSpec, names: set[str]) -> list[str]:
    """What is wrong with one declaration, given every tool name being loaded."""
    problems = []
    if not NAME.fullmatch(spec.name):
        problems.append("its name must look like system.operation (lower case, e.g. payments.refund)")
    if spec.name in MEMORY_TOOLS:
        problems.append("the name is Warden's own memory tool")
    if spec.tool_class not in ToolClass.ALL:
        problems.append(f"unknown side-effect class {spec.tool_class!r} (one of {', '.join(ToolClass.ALL)})")
    elif spec.is_write and spec.reversibility not in (Reversibility.REVERSIBLE, Reversibility.IRREVERSIBLE):
        problems.append("a write must say whether it is reversible or irreversible")
    elif not spec.is_write and spec.reversibility != Reversibility.NONE:
        problems.append("a read has no reversibility")
    if spec.undo_tool and spec.undo_tool not in names:
        problems.append(f"its undo names the tool {spec.undo_tool!r}, which is not registered")
    if spec.undo is not None and not spec.is_write:
        problems.append("a read has nothing to undo")
    if not (0 < spec.timeout_seconds <= 3600):
        problems.append("its timeout must be between 0 and 3600 seconds")
    # The deployment's own code: no grant needed, but never one of Warden's own settings (and a value
    # that is set, long enough to scrub, and none of the deployment's own secrets).
    problems += secret_problems(spec.secrets, project_id=None)
    if spec.on_refusal not in ON_REFUSAL:
        problems.append(f"on_refusal must be one of {ON_REFUSAL[1:]}, or empty for as the agent")
    if spec.external_id and spec.external_id not in spec.result.model_fields:
        problems.append(f"external_id names {spec.external_id!r}, which its result does not have")
    if spec.replay_result is not None:
        problems += _replay_result_problems(spec)
    if spec.repeatable and spec.is_write:
        problems.append("a write is never repeatable: only a read may be sent again by a replay")
    return problems


def _replay_result_problems(spec: ToolSpec) -> list[str]:
    """A write's stand-in answer in a replay (docs/replay.md) must be what the tool could have answered."""
    if not spec.is_write:
        return ["a read has no replay_result: a replay answers reads from the original run's ledger"]
    if not isinstance(spec.replay_result, dict):
        return ["its replay_result must be an object, as its result is"]
    try:
        spec.result.model_validate(spec.replay_result)
    except ValidationError as exc:
        fields = ", ".join(".".join(map(str, e["loc"])) or "result" for e in exc.errors())
        return [f"its replay_result is not a result it could answer ({fields})"]
    return []


def tools_load(modules: list[str]) -> dict[str, ToolSpec]:
    """Import the tool modules, check all their declarations, then register them all (or none)."""
    found: dict[str, ToolSpec] = {}
    problems: list[str] = []
    for module in modules:
        try:
            importlib.import_module(module)
        except ImportError as exc:
            problems.append(f"tool module {module}: cannot be imported ({exc})")
            continue
        for spec in declared(module):
            if spec.name in found:
                problems.append(f"{spec.name} ({module}): declared twice (also in {found[spec.name].module})")
            found[spec.name] = spec
    for spec in found.values():
        problems += [f"{spec.name} ({spec.module}): {problem}" for problem in _problems(spec, set(found))]
    if problems:
        raise ImproperlyConfigured("the tools cannot be registered:\n- " + "\n- ".join(problems))
    TOOLS.clear()
    TOOLS.update(found)
    return found
