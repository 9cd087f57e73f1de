"""What exists, written as declaration documents (docs/declarations.md): applying them back changes
nothing. Secrets appear by name only, as they are stored ({secret:NAME}); any value of a secret the
deployment holds or granted the project is scrubbed besides, should one have been typed into a header."""

import json

import yaml

from agents.models import Agent, Workflow
from core.errors import InvalidInput, NotFound
from tenancy.access import authorize, project_ids
from tenancy.models import Project
from tools.secrets import deployment_values, grants, scrub, secret_read

from .kinds import KINDS, PROJECT_KINDS, item_of


def _agents_named(workflows) -> set[str]:
    named = set()
    for workflow in workflows:
        named.update(slug for slug in workflow.agents or [] if isinstance(slug, str))
        named.update(task.get("agent") for task in workflow.tasks or [] if isinstance(task, dict) and task.get("agent"))
        if workflow.planner_agent_id:
            named.add(workflow.planner_agent.slug)
    return named


def _granted_values(project: Project | None) -> list[str]:
    if project is None:
        return []
    names = [name for name, slugs in grants().items() if project.slug in slugs]
    return [value for value in (secret_read(name) for name in names) if value]


def project_document(project: Project | None) -> dict:
    """One project's declarations, with the agents its workflows name (None: the deployment's shared
    configuration, every agent among it)."""
    document = {"project": project.slug} if project is not None else {}
    workflows = Workflow.objects.filter(project=project).select_related("planner_agent")
    agents = Agent.objects.all() if project is None else Agent.objects.filter(slug__in=_agents_named(workflows))
    if agents:
        document["agents"] = [item_of(KINDS["agents"], row) for row in agents.order_by("slug")]
    for key in PROJECT_KINDS if project is not None else ("workflows", "policies"):
        kind = KINDS[key]
        items = [item_of(kind, row) for row in kind.rows(project).order_by(kind.identity, "pk")]
        if items:
            document[key] = items
    return scrub(document, [*deployment_values(), *_granted_values(project)])


def declarations_export(*, user=None, project: str | None = None, token=None, request=None) -> list[dict]:
    """The documents ``user`` may see (None: a trusted operator at the shell, who sees everything): one
    project's, or every project's and, for a superuser, the shared configuration's."""
    if project is not None:
        row = Project.objects.filter(slug=project).first()
        if row is None:
            raise NotFound(f"project {project} does not exist")
        if user is not None:
            authorize(user, row.id, "view", what=f"project {project}", token=token, request=request)
        return [project_document(row)]
    allowed = project_ids(user, "view") if user is not None else None
    projects = Project.objects.order_by("slug")
    documents = [] if allowed is not None else [project_document(None)]
    return documents + [
        project_document(row) for row in (projects if allowed is None else projects.filter(id__in=allowed))
    ]


def documents_dump(documents: list[dict], *, as_json: bool = False) -> str:
    if as_json:
        return json.dumps(documents if len(documents) != 1 else documents[0], indent=2, ensure_ascii=False) + "\n"
    return yaml.safe_dump_all(documents, sort_keys=False, allow_unicode=True, width=120)


def documents_parse(text: str, *, name: str = "the document") -> list:
    """YAML (one or more documents; JSON is YAML too) as a list of documents: a list at the top is a list
    of documents. A text that does not parse is a field error naming where."""
    try:
        loaded = [document for document in yaml.safe_load_all(text) if document is not None]
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or "not YAML or JSON"
        raise InvalidInput(f"{name} does not parse", [{"field": name, "message": f"{problem}{where}"}]) from None
    if len(loaded) == 1 and isinstance(loaded[0], list):
        return loaded[0]
    return loaded
