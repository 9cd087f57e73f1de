"""Applying declaration documents (docs/declarations.md): every item checked as the admin checks it (its
form, then the owning app's checks), saved through the same services (so audited and governed alike: a
loosening waits for a second admin), all in one transaction.

Two passes: the first applies everything and rolls back, so that each item is checked against what the
items before it make, every error is collected, and a dry run's diff is exactly what applying would do.
Only when it found nothing wrong are the MCP servers to save asked for their tools (an outbound call,
never inside a transaction) and the second pass applies for real.
"""

import logging
from contextvars import ContextVar
from dataclasses import dataclass

from django.db import transaction

from agents.models import Workflow
from core.errors import Forbidden, InvalidInput, NotFound
from policy.models import ApprovalPolicy
from tenancy.access import authorize
from tenancy.admin_scope import config_save
from tenancy.audit import audit, audit_denied
from tenancy.models import ChangeRequest, Project
from tools.classifications import tool_classification_set
from tools.governance import changed_fields, declaration_save
from tools.http_tools import http_tool_problems
from tools.mcp_tools import (
    McpRefused,
    McpUnreachable,
    mcp_listing_problems,
    mcp_server_list,
    mcp_server_problems,
    mcp_tools_store,
)

from ..policies import FIELDS as POLICY_FIELDS
from ..policies import policy_save
from .kinds import KINDS, ORDER, Kind, form_class, form_data, item_of, value_problems, written

DEPLOYMENT_KINDS = ("agents", "workflows", "policies")
_CHECKING = ContextVar("declarations_checking", default=False)


class _NotInCheckingPass(logging.Filter):
    """The checking pass rolls back: the audit rows its services wrote never existed, so neither does
    their echo in the log."""

    def filter(self, record) -> bool:
        return not _CHECKING.get()


logging.getLogger("warden.audit").addFilter(_NotInCheckingPass())


@dataclass(frozen=True)
class Item:
    project: Project | None
    kind: Kind
    body: dict

    @property
    def name(self) -> str:
        return self.body[self.kind.identity]

    @property
    def label(self) -> str:
        where = f"{self.project.slug}:" if self.project is not None else ""
        return f"{where}{self.kind.key}[{self.name}]"


class _Refused(Exception):
    """One item's field errors, as [{"field", "message"}] with the item's fields."""

    def __init__(self, errors: list[dict]):
        super().__init__("; ".join(e["message"] for e in errors))
        self.errors = errors


def _refused(problems) -> _Refused:
    return _Refused([{"field": field or "", "message": message} for field, message in problems])


# --- reading documents -------------------------------------------------------------------------------


def declarations_items(documents: list) -> list[Item]:
    """The documents' items in the order they apply; InvalidInput naming each item and field that is not
    a declaration at all, NotFound for a project that does not exist."""
    items, errors, seen = [], [], set()
    for number, document in enumerate(documents, 1):
        where = f"document {number}"
        if not isinstance(document, dict):
            errors.append({"field": where, "message": "a mapping: project, then lists of items by kind"})
            continue
        slug = document.get("project")
        errors += [{"field": f"{where}.{key}", "message": f"not a kind of declaration: {', '.join(ORDER)}"}
                   for key in document if key != "project" and key not in KINDS]  # fmt: skip
        project = None
        if slug is not None:
            project = Project.objects.filter(slug=slug).first() if isinstance(slug, str) else None
            if project is None:
                raise NotFound(f"project {slug} does not exist")
        for key in ORDER:
            listed = document.get(key)
            items += _kind_items(project, KINDS[key], [] if listed is None else listed, where, errors, seen)
    if errors:
        raise InvalidInput("nothing was applied: the document is not valid", errors)
    return items


def _kind_items(project, kind: Kind, listed, where: str, errors: list, seen: set) -> list[Item]:
    """The items of one kind of one document; ``seen``: (project, kind, name) of every document's, so an
    item declared twice (in two files of a directory too) is an error, not a race between them."""
    if project is None and kind.key not in DEPLOYMENT_KINDS and listed:
        errors.append({"field": f"{where}.{kind.key}", "message": "belongs to a project: name it (project: SLUG)"})
        return []
    if not isinstance(listed, list):
        errors.append({"field": f"{where}.{kind.key}", "message": "a list of items"})
        return []
    items, prefix = [], f"{project.slug}:" if project is not None else ""
    for position, body in enumerate(listed, 1):
        name = body.get(kind.identity) if isinstance(body, dict) else None
        label = f"{prefix}{kind.key}[{name if isinstance(name, str) and name else position}]"
        if not isinstance(body, dict) or not isinstance(name, str) or not name:
            errors.append({"field": f"{label}.{kind.identity}", "message": f"each item is a mapping with its "
                           f"{kind.identity}"})  # fmt: skip
            continue
        errors += [{"field": f"{label}.{field}", "message": f"not a field of {kind.key}: {', '.join(kind.declared)}"}
                   for field in body if field not in kind.declared]  # fmt: skip
        if (project, kind.key, name) in seen:
            errors.append({"field": f"{label}.{kind.identity}", "message": "declared twice"})
        seen.add((project, kind.key, name))
        items.append(Item(project, kind, body))
    return items


# --- one item ----------------------------------------------------------------------------------------


def _references(item: Item) -> dict:
    """The rows an item names by slug, as ids; a name that is not there is a field error."""
    references, problems = {}, []
    workflow = item.body.get("workflow")
    if "workflow" in item.kind.fields and workflow not in (None, ""):
        found = Workflow.objects.filter(slug=workflow, project=item.project).values_list("id", flat=True).first()
        if found is None and item.project is not None:  # a shared workflow's runs may be any project's
            found = Workflow.objects.filter(slug=workflow, project=None).values_list("id", flat=True).first()
        if found is None:
            problems.append(("workflow", f"no workflow {workflow!r} in this project (nor a shared one)"))
        references["workflow"] = {workflow: found}
    agent = item.body.get("planner_agent")
    if "planner_agent" in item.kind.fields and agent not in (None, ""):
        found = KINDS["agents"].model.objects.filter(slug=agent).values_list("id", flat=True).first()
        if found is None:
            problems.append(("planner_agent", f"no agent {agent!r}"))
        references["planner_agent"] = {agent: found}
    project = item.body.get("project")
    if "project" in item.kind.fields and project not in (None, ""):  # an agent's: whose secret its key is
        found = Project.objects.filter(slug=project).values_list("id", flat=True).first()
        if found is None:
            problems.append(("project", f"no project {project!r}"))
        references["project"] = {project: found}
    if problems:
        raise _refused(problems)
    return references


def _new_row(item: Item):
    kind, model = item.kind, item.kind.model
    if model is ApprovalPolicy:
        effect = ApprovalPolicy.Effect.WAIVE if kind.key == "waivers" else ApprovalPolicy.Effect.REQUIRE
        return model(project=item.project, effect=effect)
    return model() if kind.shared else model(project=item.project)


def item_built(item: Item):
    """(the row as it is, or None; the row as the item declares it, unsaved; the fields that change),
    checked as the admin checks it: _Refused with field errors otherwise. Writes nothing."""
    kind = item.kind
    found = list(kind.rows(item.project).filter(**{kind.identity: item.name})[:2])
    if len(found) > 1:
        raise _refused([(kind.identity, f"two rows of this project are named {item.name!r}: rename one")])
    before = found[0] if found else None
    if problems := value_problems(kind, item.body):
        raise _refused(problems)
    references = _references(item)
    instance = type(before).objects.get(pk=before.pk) if before is not None else _new_row(item)
    form = form_class(kind)(form_data(kind, item.body, references), instance=instance)
    if not form.is_valid():
        raise _refused((field if field != "__all__" else "", message)
                       for field, messages in form.errors.items() for message in messages)  # fmt: skip
    row = form.instance
    if kind.key == "http_tools":
        problems = http_tool_problems(row)
    elif kind.key == "mcp_servers":
        problems = mcp_server_problems(row)
    else:
        problems = []  # classifications and policies: checked by the service that saves them
    if problems:
        raise _refused(problems)
    changed = changed_fields(before, row, kind.declared) if before is not None else list(kind.declared)
    return before, row, changed


def _saved(item: Item, user, row, before, changed, *, listed, token, request) -> ChangeRequest | None:
    """Save through the service the admin uses; a change request when it waits for a second admin."""
    key, project_id = item.kind.key, item.project.id if item.project is not None else None
    if key in ("http_tools", "mcp_servers"):
        held = declaration_save(user=user, row=row, fields=list(item.kind.declared), request=request)
        if held is None and key == "mcp_servers" and item.label in listed:
            mcp_tools_store(row, listed[item.label])
        return held
    if key == "classifications":
        values = {name: getattr(row, name) for name in ("tool_class", "reversibility", "approval", "note")}
        saved = tool_classification_set(user=user, project=item.project, tool=row.tool, token=token, request=request,
                                        **values)  # fmt: skip
        return saved if isinstance(saved, ChangeRequest) else None
    if key in ("policies", "waivers"):
        return policy_save(user=user, row=row, fields=POLICY_FIELDS, request=request)
    config_save(actor=user, obj=row, created=before is None, changed=changed, project_id=project_id, request=request)
    return None


def _outcome(item: Item, before, row, changed, held) -> dict:
    if before is None:
        changes = {name: {"before": None, "after": value} for name, value in item_of(item.kind, row).items()}
    else:
        changes = {name: {"before": written(before, name), "after": written(row, name)} for name in changed}
    status = "pending" if held is not None else ("created" if before is None else "changed")
    return {
        "project": item.project.slug if item.project is not None else None,
        "kind": item.kind.key,
        "name": item.name,
        "status": status,
        "changes": changes,
        "change_request": held.id if held is not None else None,
    }


def _item_apply(item: Item, user, *, listed, token, request) -> dict:
    before, row, changed = item_built(item)
    if before is not None and not changed:
        return {"project": item.project.slug if item.project else None, "kind": item.kind.key, "name": item.name,
                "status": "unchanged", "changes": {}, "change_request": None}  # fmt: skip
    if item.kind.shared and not user.is_superuser:
        raise Forbidden(f"{item.label}: {item.kind.key} are shared by every project: only a superuser declares "
                        "or changes one")  # fmt: skip
    try:
        held = _saved(item, user, row, before, changed, listed=listed, token=token, request=request)
    except InvalidInput as exc:
        raise _Refused(exc.errors or [{"field": "", "message": str(exc)}]) from exc
    return _outcome(item, before, row, changed, held)


# --- the whole -----------------------------------------------------------------------------------------


def _authorized(user, items: list[Item], token, request) -> None:
    """Before any transaction (a refusal's audit row stays): the caller administers every project the
    documents name; a document of the deployment's own rows is a superuser's."""
    if user is None or not user.is_active:
        raise Forbidden("declarations are applied as a person: name one")
    for project in {item.project for item in items}:
        if project is None and not user.is_superuser:
            audit(actor=user, action="denied:administer", target="the deployment's shared configuration",
                  outcome="denied", request=request, detail={"why": "not a superuser"})  # fmt: skip
            raise Forbidden("a document without a project declares shared configuration: superusers only")
        if project is not None:
            authorize(user, project.id, "administer", what=f"project {project.slug}", token=token, request=request)


def _pass(items: list[Item], user, *, listed, dry: bool, token, request) -> list[dict]:
    checking = _CHECKING.set(dry)
    try:
        return _passed(items, user, listed=listed, dry=dry, token=token, request=request)
    finally:
        _CHECKING.reset(checking)


def _passed(items: list[Item], user, *, listed, dry: bool, token, request) -> list[dict]:
    outcomes, errors = [], []
    with transaction.atomic():
        for item in items:
            try:
                with transaction.atomic():
                    outcomes.append(_item_apply(item, user, listed=listed, token=token, request=request))
            except _Refused as exc:
                errors += [{"field": f"{item.label}.{e['field']}".rstrip("."), "message": e["message"]}
                           for e in exc.errors]  # fmt: skip
        if not dry and not errors:
            _summary_audited(user, outcomes, request)
        if dry or errors:
            transaction.set_rollback(True)
    if errors:
        raise InvalidInput(f"nothing was applied: {len({e['field'].split('.')[0] for e in errors})} item(s) "
                           "not valid", errors)  # fmt: skip
    return outcomes


def _summary_audited(user, outcomes: list[dict], request) -> None:
    projects = {outcome["project"] for outcome in outcomes}
    for slug in projects:
        mine = [o for o in outcomes if o["project"] == slug]
        detail = {status: [f"{o['kind']}[{o['name']}]" for o in mine if o["status"] == status]
                  for status in ("created", "changed", "pending")}  # fmt: skip
        detail["unchanged"] = sum(o["status"] == "unchanged" for o in mine)
        project_id = Project.objects.filter(slug=slug).values_list("id", flat=True).first() if slug else None
        audit(actor=user, action="declarations_apply", project_id=project_id, target=slug or "shared configuration",
              request=request, detail=detail)  # fmt: skip


def _listings(items: list[Item], outcomes: list[dict], user, request) -> dict:
    """The tools of each MCP server the first pass saves at once, asked for outside any transaction (and
    audited, as the admin does on save): a server that does not answer applies nothing."""
    saved = {(o["project"], o["name"]) for o in outcomes if o["kind"] == "mcp_servers"
             and o["status"] in ("created", "changed")}  # fmt: skip
    listed, errors = {}, []
    for item in items:
        if item.kind.key != "mcp_servers" or (item.project.slug, item.name) not in saved:
            continue
        _, server, _ = item_built(item)
        try:
            listed[item.label] = mcp_server_list(server=server, user=user, request=request)
        except McpRefused as exc:
            errors += [{"field": f"{item.label}.{f or ''}".rstrip("."), "message": m} for f, m in exc.problems]
            continue
        except McpUnreachable as exc:
            errors.append({"field": item.label, "message": str(exc)[:300]})
            continue
        errors += [
            {"field": f"{item.label}.{f}", "message": m} for f, m in mcp_listing_problems(server, listed[item.label])
        ]
    if errors:
        raise InvalidInput("nothing was applied: an MCP server cannot be listed", errors)
    return listed


def declarations_apply(*, user, documents: list, dry_run: bool = False, token=None, request=None) -> list[dict]:
    """Apply declaration documents as ``user``: each item's outcome (created, changed, unchanged, or
    pending: a change request waits for a second admin), or InvalidInput naming every item and field
    that is wrong, with nothing written. ``dry_run``: the outcomes, with nothing written."""
    items = declarations_items(documents)
    _authorized(user, items, token, request)
    try:
        outcomes = _pass(items, user, listed={}, dry=True, token=token, request=request)
        if dry_run:
            return outcomes
        listed = _listings(items, outcomes, user, request)
        return _pass(items, user, listed=listed, dry=False, token=token, request=request)
    except Forbidden as exc:
        audit_denied(actor=user, action="declarations_apply", target="declarations", request=request, refusal=exc)
        raise


def declaration_documents(kind_key: str, name: str, body, project: Project) -> list[dict]:
    """One item, PUT at its own address, as a document: its name is the address's."""
    if kind_key not in KINDS:
        raise NotFound(f"no kind of declaration is called {kind_key}: {', '.join(ORDER)}")
    kind = KINDS[kind_key]
    if not isinstance(body, dict):
        raise InvalidInput("an item is a mapping", [{"field": "body", "message": "a JSON object"}])
    if body.get(kind.identity, name) != name:
        raise InvalidInput("the item's name is its address's", [{"field": kind.identity, "message": f"{name} (as "
                           "in the address) or left out"}])  # fmt: skip
    return [{"project": project.slug, kind_key: [{**body, kind.identity: name}]}]
