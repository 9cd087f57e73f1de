"""The XSS corpus and the secret canaries over every page, admin page and API response, without a browser
(tests/runs/test_xss_corpus.py is the browser's version, over the dashboard's pages).

The crawl comes from the URL resolver and the API's schema, with every id of the hostile scene (each span's
children and payload, each task, operation, artifact and blackboard entry of each run), plus the admin's
changelist of every registered model and the change pages of its latest rows. Every response:

- carries no canary: a secret tool argument, the provider's API key, a webhook endpoint's secret, the
  approval webhook's secret, the SECRET_KEY, the raw API tokens;
- HTML never holds a payload verbatim (only escaped); JSON is served as application/json and parses, so the
  payloads are JSON strings; nothing comes in another content type; and nosniff is on everywhere.
"""

import html
import json

from django.apps import apps
from django.conf import settings
from django.test import Client

from integrations.models import WebhookEndpoint
from tests.runs.test_xss_corpus import CORPUS
from tests.security.conftest import CANARIES, api_get_paths, fill, routes
from tools.models import SealedArguments

ADMIN_ROWS = 5  # change pages per model: its latest rows, the scene's (the answered run's spans and calls)
# Markup a page would have to escape; the others ({{7*7}}, …) are plain text anywhere.
MARKUP = [p for p in CORPUS if html.escape(p) != p]
# Query strings that make another response of the same URL.
VARIANTS = {"runs/<int:run_id>/spans/<int:span_id>/payload": ["", "?preview=1"]}


def strings(value):
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for k, v in value.items():
            yield from strings(k)
            yield from strings(v)
    elif isinstance(value, list):
        for v in value:
            yield from strings(v)


def crawl_urls(scene) -> tuple[list[str], list[str]]:
    """(URLs opened with the session, URLs opened with the bearer token)."""
    session, bearer = [], []
    for route in routes():
        if route.startswith("api/"):
            continue
        if route.startswith("admin/") and not (route.endswith("<path:object_id>/change/") or route.count("/") <= 3):
            continue  # the admin's add, history and delete pages: the GET sweep opens those
        if route in ("admin/jsi18n/", "admin/autocomplete/"):
            continue  # a static JavaScript catalogue; a lookup that needs its query (and a 403 without)
        for url in fill(route, scene, every=True, admin_rows=ADMIN_ROWS):
            session += [url + query for query in VARIANTS.get(route, [""])]
    for route in api_get_paths():
        bearer += fill(route, scene, every=True)
    # the API's own pages beyond its operations: its root, schema and docs
    session += sorted({"/" + r for r in routes() if r.startswith("api/") and "<" not in r} - set(bearer))
    return session, bearer


def crawl(scene) -> list[tuple[str, object]]:
    root = Client()
    root.force_login(scene.root)
    auth = {"HTTP_AUTHORIZATION": f"Bearer {scene.tokens['root']}"}
    session, bearer = crawl_urls(scene)
    return [(url, root.get(url)) for url in session] + [(url, root.get(url, **auth)) for url in bearer]


def test_no_response_carries_a_secret_or_live_markup(hostile, provider):
    """One crawl (it is the costly part), three findings: what it reached, secrets, markup."""
    crawled = crawl(hostile)

    # It reached every kind of page, and none failed.
    urls = {url for url, _ in crawled}
    run = hostile.runs.answered
    for expected in (
        f"/runs/{run.id}/",
        f"/runs/{run.id}/spans/{run.spans.last().id}/payload?preview=1",
        f"/runs/{run.id}/blackboard/{run.blackboard.get().id}/decide",
        f"/runs/{run.id}/artifacts/{run.artifacts.get().id}",
        f"/api/v1/runs/{run.id}/trace",
        f"/api/v1/operations/{run.operations.get().id}",
        "/admin/tools/sealedarguments/",
        f"/admin/tools/sealedarguments/{SealedArguments.objects.get().pk}/change/",
        "/api/v1/docs",
        "/approvals/",
    ):
        assert expected in urls, expected
    assert len(crawled) > 300
    assert [url for url, response in crawled if response.status_code >= 500] == []

    assert secrets_leaked(hostile, crawled, provider) == []

    # Markup stays text: escaped in HTML, a string in JSON, and no other content type to sniff.
    operations = set(crawl_urls(hostile)[1])  # the API's own answers (its root is Django's 404 page)
    raw, kinds, sniffable, api_not_json = [], {}, [], []
    shown_in_html, shown_in_api = set(), set()
    for url, response in crawled:
        kind = response.get("Content-Type", "").split(";")[0]
        kinds.setdefault(kind, []).append(url)
        if url in operations and kind != "application/json":
            api_not_json.append(url)
        if response.get("X-Content-Type-Options") != "nosniff":
            sniffable.append(url)
        body = response.content.decode()
        if kind == "text/html":
            raw += [f"{payload!r} in {url}" for payload in MARKUP if payload in body]
            shown_in_html |= {payload for payload in MARKUP if html.escape(payload) in body}
        elif kind == "text/plain":  # Prometheus' format: label values are names only (core/metrics.py)
            raw += [f"{payload!r} in {url}" for payload in MARKUP if payload in body]
        elif kind == "application/json":
            found = "\n".join(strings(json.loads(body)))  # in JSON a payload can only sit inside a string
            if url in operations:
                shown_in_api |= {payload for payload in CORPUS if payload in found}
    assert raw == [] and api_not_json == []
    assert set(kinds) == {"text/html", "application/json", "text/plain"}, {k: v[:3] for k, v in kinds.items()}
    assert kinds["text/plain"] == ["/metrics"]
    assert sniffable == []
    # The corpus did reach both: every payload is on some page (escaped) and in some API response.
    assert shown_in_html == set(MARKUP)
    assert shown_in_api == set(CORPUS)


# Rows that hold a secret on purpose: the sealed values the broker hands back to the tool, and a webhook
# endpoint's secret, which signs its deliveries (its admin page shows the first four characters).
KEEPERS = {(SealedArguments, "a secret tool argument"), (WebhookEndpoint, "a webhook endpoint's secret")}


def secrets_leaked(scene, crawled, provider) -> list[str]:
    canaries = {
        **CANARIES,
        "the SECRET_KEY": settings.SECRET_KEY,
        **{f"{user}'s API token": token for user, token in scene.tokens.items()},
    }
    # The secrets were there to leak: the broker sealed the argument, the provider was sent its key.
    sealed = json.dumps([s.values for s in SealedArguments.objects.all()])
    assert CANARIES["a secret tool argument"] in sealed
    key = CANARIES["the provider's API key"]
    assert provider.requests and {r["headers"]["authorization"] for r in provider.requests} == {f"Bearer {key}"}

    leaks = []
    for url, response in crawled:
        text = response.content.decode(errors="replace") + str(response.headers)
        leaks += [f"{what} in {url}" for what, canary in canaries.items() if canary in text]
    # nor any stored row, but where it is kept on purpose
    for model in apps.get_models():
        rows = json.dumps(list(model._default_manager.values()), default=str)
        leaks += [
            f"{what} in table {model._meta.label}"
            for what, canary in CANARIES.items()
            if canary in rows and (model, what) not in KEEPERS
        ]
    return leaks
