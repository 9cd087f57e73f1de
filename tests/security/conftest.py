"""A hostile scene for the security sweeps, built from the existing builders: the XSS corpus of
tests/runs/test_xss_corpus.py in a scripted model's words, tool results, failures, names, goals, inputs and
objectives; a model behind the OpenAI protocol (tests/agents/test_model_providers.py) that files a ticket
with a secret argument, writes the corpus on the blackboard and answers with it; runs driven in this
thread (tests/runs/test_run_actions.py). Secrets are canaries, unique per session."""

import json
import re
import uuid
from types import SimpleNamespace

import pytest
from django.apps import apps
from django.contrib import admin
from django.contrib.contenttypes.models import ContentType
from django.urls import URLResolver, get_resolver

from agents.models import Agent, ModelPrice, Workflow
from approvals.models import Question
from config.api import api as ninja_api
from evals.demo import demo_suite_load
from evals.models import Annotation, EvalCase, EvalResult, EvalRun, EvalSuite
from integrations.models import WebhookEndpoint
from policy.models import AllowRule, ApprovalRequest
from replay.models import Replay, Shadow
from replay.services import replay_start
from runs.heartbeat import lease_keeper
from runs.models import Run
from runs.services import run_start
from tenancy.access import default_project, membership_grant
from tenancy.models import ChangeRequest
from tenancy.tokens import api_token_create
from tests.agents.test_model_providers import completion, provider  # noqa: F401  (the fixture)
from tests.runs.test_run_actions import drive
from tests.runs.test_xss_corpus import CORPUS, JOINED, SHORT, run_input, xss_workflows

CANARIES = {
    "a secret tool argument": f"canary-arg-{uuid.uuid4().hex}",
    "the provider's API key": f"sk-canary-{uuid.uuid4().hex}",
    "a webhook endpoint's secret": f"canary-hook-{uuid.uuid4().hex}",
    "the approval webhook's secret": f"canary-approval-hook-{uuid.uuid4().hex}",
}


class HostileModel:
    """Behind the OpenAI protocol: files a ticket with the secret argument, writes the corpus on the
    blackboard, then answers with it."""

    def __init__(self, fake):
        self.turns = 0
        fake.respond = self.respond

    def respond(self, request: dict) -> dict:
        self.turns += 1
        calls = [
            (
                "tickets__create",
                {"customer_id": "xss-1", "title": SHORT, "api_key": CANARIES["a secret tool argument"]},
            ),
            ("blackboard__write", {"key": "xss", "kind": "text", "value": JOINED, "expected_version": 0}),
        ]
        if self.turns <= len(calls):
            name, arguments = calls[self.turns - 1]
            return completion(tool=name, arguments=json.dumps(arguments))
        return completion(content=json.dumps({"summary": JOINED, "items": CORPUS}))


@pytest.fixture
def hostile(demo, provider, settings, monkeypatch, django_user_model):  # noqa: F811  (the fixture)
    """Three runs of the default project full of the corpus: ``stopped`` (needs attention: a task failed
    with the corpus), ``proposed`` (waits for the approval of a ticket), ``answered`` (completed by the
    model behind the OpenAI protocol, with a ledger row, an artifact and a blackboard entry); an eval
    suite, a webhook endpoint, an allow rule; ``root`` (superuser) and ``admin`` (the default project's
    admin), each with an API token."""
    monkeypatch.setattr(lease_keeper, "hold", lambda task_id, token: None)  # no heartbeat thread in a test
    monkeypatch.setenv(settings.WARDEN["OPENAI_API_KEY_ENV"], CANARIES["the provider's API key"])
    settings.WARDEN = {
        **settings.WARDEN,
        "APPROVAL_WEBHOOK_URL": "http://127.0.0.1:9/approvals",  # never called: notifications are not sent here
        "APPROVAL_WEBHOOK_SECRET": CANARIES["the approval webhook's secret"],
    }
    home = default_project()
    WebhookEndpoint.objects.create(
        url="http://127.0.0.1:9/hook", secret=CANARIES["a webhook endpoint's secret"], project=home
    )
    HostileModel(provider)
    xss, propose = xss_workflows()
    xss.tasks = [{**task, "objective": f"{task['objective']} {JOINED}"} for task in xss.tasks]
    xss.save(update_fields=["tasks"])
    gpt = Agent.objects.create(
        slug="hostile-gpt",
        name=SHORT,
        provider="openai",
        model="gpt-test",
        allowed_tools=["tickets.create", "blackboard.write"],
        output_schema={"type": "object"},
        max_attempts=1,
    )
    ModelPrice.objects.create(provider="openai", model="gpt-test", input_usd_per_mtok="2.5", output_usd_per_mtok="10")
    Workflow.objects.create(
        slug="hostile", name=SHORT, tasks=[{"key": "answer", "agent": gpt.slug, "objective": JOINED}]
    )
    runs = SimpleNamespace(
        stopped=drive(run_start(workflow=xss.slug, goal=JOINED, input=run_input())),
        proposed=drive(
            run_start(workflow=propose.slug, goal=JOINED, input=run_input(propose_tools=["tickets.create"]))
        ),
        answered=drive(run_start(workflow="hostile", goal=JOINED, input=run_input())),
    )
    assert runs.stopped.status == Run.Status.NEEDS_ATTENTION, runs.stopped.status_reason
    assert runs.proposed.status == Run.Status.WAITING_FOR_APPROVAL, runs.proposed.status_reason
    assert runs.answered.status == Run.Status.COMPLETED, runs.answered.status_reason
    assert runs.answered.blackboard.filter(value=JOINED).exists() and runs.answered.artifacts.exists()
    assert runs.answered.operations.filter(tool="tickets.create").exists()

    suite = demo_suite_load()
    EvalCase.objects.create(suite=suite, name=SHORT, workflow=xss, goal=JOINED, input=run_input())
    EvalSuite.objects.filter(id=suite.id).update(description=JOINED)
    # A pass whose judge answered with the corpus, and a reviewer's comment in its words: model output and
    # people's words shown on the comparison, the run page and the API, escaped.
    eval_run = EvalRun.objects.create(suite=suite, trigger=SHORT)
    grade = {"agent": SHORT, "artifact": SHORT, "score": 0.5, "reasoning": JOINED, "passed": True, "cost_micros": 1,
             "model": SHORT}  # fmt: skip
    case = suite.cases.get(name=SHORT)
    EvalResult.objects.create(eval_run=eval_run, case=case, run=runs.answered, passed=True, grades=[grade])
    Annotation.objects.create(run=runs.answered, comment=JOINED, score=0.5)
    root = django_user_model.objects.create_superuser(username="root", password="root-pass-123", email="r@x.y")
    admin_user = django_user_model.objects.create_user(username="ada", password="ada-pass-12345")
    membership_grant(user=admin_user, project=home, role="admin")
    AllowRule.objects.create(project=home, tool="tickets.create", arguments={"title": SHORT}, created_by=root)
    # An agent's question in the corpus's words, with the corpus as a choice (its card escapes both).
    Question.objects.create(
        run=runs.answered, task=runs.answered.tasks.first(), step=1, text=JOINED, choices=[SHORT, "no"]
    )
    # A rule change in the corpus's words, asked for by one admin: the queue and the API show it, escaped.
    asker = django_user_model.objects.create_user(username="asker", password="asker-pass-12345")
    membership_grant(user=asker, project=home, role="admin")
    ChangeRequest.objects.create(project=home, subject="tools.httptool", object_id=1, action="change", label=SHORT,
                                 before={"description": SHORT}, after={"description": JOINED}, loosens=[JOINED],
                                 requested_by=asker)  # fmt: skip
    # A replay of the answered run, its draft and its note in the corpus's words (its page and the API escape them).
    replay = replay_start(
        run_ids=[runs.answered.id], agent=gpt.slug, edits={"instructions": JOINED}, note=JOINED, via="test"
    )
    runs.replayed = drive(replay.pairs.get().run)
    # A shadow of the answered run's workflow, whose note is in the corpus's words too.
    shadow = Shadow.objects.create(
        project=home, workflow=runs.answered.workflow,
        replay=Replay.objects.create(project=home, candidate={"agent": gpt.slug, "version": 1}, note=JOINED),
    )  # fmt: skip
    tokens = {user.username: api_token_create(user=user, scopes=["read"])[1] for user in (root, admin_user)}
    return SimpleNamespace(runs=runs, root=root, admin=admin_user, tokens=tokens, suite=suite, replay=replay,
                           shadow=shadow)  # fmt: skip


# --- URLs from the resolver, filled with the scene's ids ---------------------------------------------------
# <int:run_id>, <run_id>, and a regex pattern's (?P<app_label>runs|tools|…) (the admin's app index)
PARAM = re.compile(r"<(?:\w+:)?(\w+)>|\(\?P<(\w+)>[^)]*\)")
ADMIN_MODEL = re.compile(r"^admin/(\w+)/(\w+)/")
# Unnamed patterns of others that no request is sent to on purpose: the admin's catch-all (any unknown
# admin URL: a redirect to its login, or a 404).
SKIPPED = {"admin/(?P<url>.*)$"}


def routes(patterns=None, prefix: str = ""):
    """Every URL pattern of the site as a route string (``runs/<int:run_id>/``), API and admin included."""
    for pattern in get_resolver().url_patterns if patterns is None else patterns:
        route = prefix + str(pattern.pattern)
        if isinstance(pattern, URLResolver):
            yield from routes(pattern.url_patterns, route)
        elif route not in SKIPPED:
            yield route


def admin_model(route: str):
    match = ADMIN_MODEL.match(route)
    if match is None:
        return None
    try:
        model = apps.get_model(*match.groups())
    except LookupError:
        return None
    return model if model in admin.site._registry else None


RUN_SCOPED = {"run_id", "span_id", "artifact_id", "task_id", "operation_id", "entry_id"}


def run_ids(run: Run) -> dict[str, list]:
    """The ids a run-scoped URL may take, for one run."""
    return {
        "run_id": [run.id],
        "span_id": list(run.spans.order_by("id").values_list("id", flat=True)),
        "artifact_id": list(run.artifacts.order_by("id").values_list("id", flat=True)),
        "task_id": list(run.tasks.order_by("id").values_list("id", flat=True)),
        "operation_id": list(run.operations.order_by("id").values_list("id", flat=True)),
        "entry_id": list(run.blackboard.order_by("id").values_list("id", flat=True)),
    }


def _moved_models(route: str) -> list[str]:
    """The model names of an old admin link's pattern, ``admin/runs/(?P<model>a|b)/…`` (config/urls.py)."""
    match = re.search(r"\(\?P<model>([^)]*)\)", route)
    return match.group(1).split("|") if match else []


def fill(route: str, scene, *, every: bool, admin_rows: int = 1) -> list[str]:
    """The URLs of ``route`` with the scene's ids: one (``every=False``), or one per object it can show.
    A parameter the scene has no ids for fails: a new kind of URL needs its ids here."""
    route = route.replace("^", "").replace("$", "")
    names = [a or b for a, b in PARAM.findall(route)]
    if not names:
        return ["/" + route]
    model = admin_model(route)
    if model is not None:  # <path:object_id> (and the user admin's <id>): rows of that model
        # the latest rows: the scene's own, after the demo's
        pks = list(model._default_manager.order_by("-pk").values_list("pk", flat=True)[:admin_rows]) or [0]
        return ["/" + PARAM.sub(str(pk), route) for pk in pks]
    if "app_label" in names:
        labels = sorted({model._meta.app_label for model in admin.site._registry})
        return ["/" + PARAM.sub(label, route) for label in (labels if every else labels[:1])]
    if RUN_SCOPED.intersection(names):
        contexts = [run_ids(run) for run in vars(scene.runs).values()]
    else:
        run = scene.runs.answered
        contexts = [
            {
                "request_id": list(ApprovalRequest.objects.order_by("id").values_list("id", flat=True)),
                "question_id": list(Question.objects.order_by("id").values_list("id", flat=True)),
                "change_id": list(ChangeRequest.objects.order_by("id").values_list("id", flat=True)),
                "suite_id": [scene.suite.id],
                "replay_id": [scene.replay.id],
                "shadow_id": [scene.shadow.id],
                "original_id": list(scene.replay.pairs.values_list("original_id", flat=True)),  # a pair's page
                "eval_run_id": list(scene.suite.eval_runs.values_list("id", flat=True)),
                # the admin's "view on site" of a row
                "content_type_id": [ContentType.objects.get_for_model(Run).id],
                "object_id": [run.id],
                # old admin links of the models that moved to another app (config/urls.py): those it names
                "model": _moved_models(route),
                "rest": [""],
                # a breaker (dashboard/inbox.py): the sweeps see how its close answers each caller
                "what": ["tool"],
                "name": ["crm.read"],
                "project": [run.project.slug],  # a project's own tool's breaker
                # declarations as code (api/declarations.py): a project's, one item of a kind
                "slug": [run.project.slug],
                "kind": ["classifications"],
            }
        ]
    if "token" in names:  # a decision link (approvals/links.py) to a pending request: made only when needed
        contexts = [{**ids, "token": [_decision_token()]} for ids in contexts]
    urls = []
    for ids in contexts:
        missing = [n for n in names if n not in ids]
        assert not missing, f"{route}: the scene has no ids for {missing}; add them (tests/security/conftest.py)"
        # The route's last id varies (every span of the run, …); those before it take their first value.
        *fixed, varying = names
        for value in ids[varying] if every else ids[varying][:1]:
            chosen = {**{n: ids[n][0] for n in fixed}, varying: value}
            urls.append("/" + PARAM.sub(lambda m, chosen=chosen: str(chosen[m.group(1) or m.group(2)]), route))
        if urls and not every:
            break
    assert urls, f"{route}: no object of the scene fits it; add one (tests/security/conftest.py)"
    return urls


def api_get_paths() -> list[str]:
    """The API's GET operations, from its schema (the routes it serves are built from the same routers)."""
    schema = ninja_api.get_openapi_schema()
    paths = [path for path, methods in schema["paths"].items() if "get" in methods]
    return sorted(re.sub(r"\{(\w+)\}", r"<\1>", path.removeprefix("/")) for path in paths)


def _decision_token() -> str:
    from approvals.links import decision_link

    pending = ApprovalRequest.objects.filter(status="pending", parent=None).order_by("id").first()
    return decision_link(pending).rsplit("/", 1)[1] if pending else "no-pending-request"
