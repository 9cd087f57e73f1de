"""Sweeps over every URL the resolver knows, with real ids from the hostile scene, so that a new page, admin
page or API operation is covered without a line here: no POST is accepted without its CSRF token, the API
takes no session cookie, no GET changes the database. Then how sessions end (logout, deactivation: pages,
tokens, websockets) and the login lockout on the admin's login.

Checked elsewhere, not repeated: who may do what (tests/approvals/test_access.py: POLICY, PAGES,
ADMIN_ACTIONS, SOCKETS), the socket's origin, session and membership checks (tests/runs/test_consumers.py),
the lockout on /login/ (tests/approvals/test_login.py)."""

import hashlib
import json
import uuid
from urllib.parse import urlsplit

from django.contrib.sessions.models import Session
from django.db import connection
from django.test import Client
from django.urls import resolve

from dashboard.consumers import RunConsumer
from tenancy.tokens import api_token_create
from tests.runs import test_consumers as ws
from tests.runs.test_consumers import people, run  # noqa: F401  (fixtures)
from tests.security.conftest import api_get_paths, fill, routes

# A POST whose view ran would find what it needs to act (a CSRF check that let it through would show).
FORM = {
    "reason": "sweep",
    "decision": "approve",
    "verdict": "verified",
    "committed": "yes",
    "note": "sweep",
    "workflow": "xss",
    "goal": "sweep",
    "action": "cancel",
    "username": "root",
    "password": "root-pass-123",
}
# Columns a GET may write, on purpose. Nothing else: a view that writes on GET fails the sweep.
GET_WRITES = {
    # An API token's last use, stamped by authentication at most once a minute (tenancy/tokens.py).
    "approvals_apitoken": {"last_used_at"},
}


def fingerprint() -> dict[str, str]:
    """A digest of every row of every table (the scene is small enough to read whole)."""
    digests = {}
    with connection.cursor() as cursor:
        for table in sorted(connection.introspection.table_names(cursor)):
            cursor.execute(f"SELECT * FROM {connection.ops.quote_name(table)}")
            columns = [c[0] for c in cursor.description]
            kept = [i for i, name in enumerate(columns) if name not in GET_WRITES.get(table, ())]
            rows = sorted(repr([row[i] for i in kept]) for row in cursor.fetchall())
            digests[table] = f"{len(rows)}:{hashlib.sha256(''.join(rows).encode()).hexdigest()}"
    return digests


def changed(before: dict, after: dict) -> list[str]:
    return sorted(table for table in before.keys() | after.keys() if before.get(table) != after.get(table))


def as_user(user, **kwargs) -> Client:
    client = Client(**kwargs)
    client.force_login(user)
    return client


def page_routes() -> list[str]:
    # The API and the OTLP ingest take bearer tokens, never a session (test_the_api_takes_no_session_cookie…).
    return [r for r in routes() if not r.startswith(("api/", "v1/"))]


# --- CSRF ---------------------------------------------------------------------------------------------------
def test_every_post_without_its_csrf_token_is_refused_and_changes_nothing(hostile):
    """The dashboard's pages as the project's admin, the admin's as a superuser: each URL the resolver
    knows (an action, a confirmation, the admin's add, change, delete and actions, login and logout)."""
    member = as_user(hostile.admin, enforce_csrf_checks=True)
    root = as_user(hostile.root, enforce_csrf_checks=True)
    urls = [url for route in page_routes() for url in fill(route, hostile, every=False)]
    assert len(urls) > 250  # the admin's pages of every model are among them
    before = fingerprint()
    accepted = []
    for url in urls:
        client = root if url.startswith("/admin/") else member
        response = client.post(url, FORM)
        if response.status_code != 403 or b"CSRF verification failed" not in response.content:
            accepted.append((url, response.status_code))
    assert accepted == []
    assert changed(before, fingerprint()) == []
    assert member.get("/runs/").status_code == 200  # still logged in: the refused logout did nothing


def test_the_api_takes_no_session_cookie_for_any_operation(hostile):
    """The API authenticates bearer tokens only, so a cross-site form riding a session cookie gets 401,
    on every operation of its schema (reads too)."""
    from config.api import api as ninja_api

    client = as_user(hostile.root, enforce_csrf_checks=True)
    before = fingerprint()
    answers = {}
    for path, methods in ninja_api.get_openapi_schema()["paths"].items():
        route = path.removeprefix("/").replace("{", "<").replace("}", ">")
        route = route.replace("<approval_id>", "<request_id>").replace("<rule_id>", "<request_id>")
        route = route.replace("<task_key>", "<task_id>")  # any value: authentication comes first
        url = fill(route, hostile, every=False)[0]
        for method in methods:
            call = {"post": client.post, "put": client.put}.get(method, client.get)
            answers[(method, url)] = call(url, {"reason": "x"}, content_type="application/json").status_code
    for url in ("/v1/traces", "/api/v1/otlp/v1/traces"):  # the OTLP ingest, outside the API's schema
        answers[("post", url)] = client.post(url, b"\x0a\x00", content_type="application/x-protobuf").status_code
    assert answers and set(answers.values()) == {401}, answers
    assert changed(before, fingerprint()) == []


# --- no state change on GET ------------------------------------------------------------------------------------
def _required_query_routes() -> set[str]:
    import re

    from config.api import api as ninja_api

    routes = set()
    for path, methods in ninja_api.get_openapi_schema()["paths"].items():
        params = methods.get("get", {}).get("parameters", [])
        if any(p["in"] == "query" and p.get("required") for p in params):
            routes.add(re.sub(r"\{(\w+)\}", r"<\1>", path.removeprefix("/")))  # as api_get_paths names them
    return routes


def test_no_get_of_any_page_admin_page_or_api_endpoint_changes_the_database(
    hostile, django_capture_on_commit_callbacks
):
    root = as_user(hostile.root)
    bearer = {"HTTP_AUTHORIZATION": f"Bearer {hostile.tokens['root']}"}
    pages = [url for route in page_routes() for url in fill(route, hostile, every=False)]
    api = [url for route in api_get_paths() for url in fill(route, hostile, every=False)]
    before = fingerprint()
    statuses = {}
    with django_capture_on_commit_callbacks() as callbacks:
        for url in pages:
            statuses[url] = root.get(url).status_code
        for url in api:
            statuses[url] = root.get(url, **bearer).status_code
    assert changed(before, fingerprint()) == []
    assert callbacks == []  # nothing sent or broadcast after commit either
    # The sweep saw real pages, not a wall of refusals: outside the admin only the POST-only URLs refuse a
    # GET; in it, its POST-only logout and what no one may do (add a read-only row, delete an audit event).
    # A GET whose query parameters are required (a fork preview names its task and step) answers 422 when
    # called bare, changing nothing like the rest; every other one answers 200.
    needs_query = {url for route in _required_query_routes() for url in fill(route, hostile, every=False)}
    wrong = {u: s for u, s in statuses.items() if u in api and s != (422 if u in needs_query else 200)}
    assert not wrong, wrong
    refused = {url: status for url, status in statuses.items() if status >= 400 and url not in needs_query}
    post_only = {
        "logout", "runs:bulk", "runs:eval-run", "approvals-decide", "admin:logout", "inbox-breaker-close",
        "inbox-breaker-close-project", "questions-answer", "runs:annotate", "runs:eval-case",
        "approvals-change-decide",
    }  # fmt: skip
    assert {url for url, status in refused.items() if status == 405} == {
        url for url in pages if resolve(urlsplit(url).path).view_name in post_only
    }
    assert {url for url, status in refused.items() if status != 405 and not url.startswith("/admin/")} == set()
    assert set(refused.values()) <= {403, 405} and sum(status == 200 for status in statuses.values()) > 150


# --- sessions end -----------------------------------------------------------------------------------------------
def test_after_logout_the_old_session_cookie_opens_nothing(operator):
    browser = Client()
    assert browser.post("/login/", {"username": "olivia", "password": "operator-pass-123"}).status_code == 302
    cookie = browser.cookies["sessionid"].value
    assert browser.get("/runs/").status_code == 200
    assert browser.post("/logout/").status_code == 302
    assert not Session.objects.filter(session_key=cookie).exists()

    replayed = Client()
    replayed.cookies["sessionid"] = cookie
    response = replayed.get("/runs/")
    assert response.status_code == 302 and response["Location"].startswith("/login/")


def test_a_deactivated_user_is_sent_to_log_in_and_their_token_stops_working(operator):
    browser = as_user(operator)
    bearer = {"HTTP_AUTHORIZATION": f"Bearer {api_token_create(user=operator)[1]}"}
    assert browser.get("/runs/").status_code == 200
    assert browser.get("/api/v1/runs", **bearer).status_code == 200

    operator.is_active = False
    operator.save(update_fields=["is_active"])
    response = browser.get("/runs/")
    assert response.status_code == 302 and response["Location"].startswith("/login/")
    assert browser.get("/approvals/").status_code == 302
    assert browser.get("/api/v1/runs", **bearer).status_code == 401
    # nor can they log in again
    assert Client().post("/login/", {"username": "olivia", "password": "operator-pass-123"}).status_code == 200


@ws.run_async
async def test_logging_out_closes_the_users_open_socket_at_once(people, run, monkeypatch):  # noqa: F811
    """The logout itself tells the socket (not its next heartbeat, an hour away here)."""
    olivia, _, _ = people
    monkeypatch.setattr(RunConsumer, "beat_seconds", 3600)
    session = await ws.db(ws.session_of, olivia)
    communicator = ws.socket(f"/ws/runs/{run.id}/", session=session)
    assert (await communicator.connect(timeout=5))[0]
    assert (await ws.received(communicator))["hello"]

    def log_out():
        browser = Client()
        browser.cookies["sessionid"] = session
        assert browser.post("/logout/").status_code == 302

    await ws.db(log_out)
    await ws.db(ws.publish)
    assert await closed_with(communicator) == 4403
    await communicator.disconnect()


@ws.run_async
async def test_deactivating_a_user_closes_their_open_socket_at_once(people, run, monkeypatch):  # noqa: F811
    """The deactivation itself tells the socket (not its next heartbeat, an hour away here)."""
    olivia, _, _ = people
    monkeypatch.setattr(RunConsumer, "beat_seconds", 3600)
    communicator = ws.socket(f"/ws/runs/{run.id}/", session=await ws.db(ws.session_of, olivia))
    assert (await communicator.connect(timeout=5))[0]
    assert (await ws.received(communicator))["hello"]
    olivia.is_active = False
    await ws.db(olivia.save, update_fields=["is_active"])
    await ws.db(ws.publish)
    assert await closed_with(communicator) == 4403
    await communicator.disconnect()


async def closed_with(communicator) -> int:
    while True:
        output = await communicator.receive_output(timeout=5)
        if output["type"] == "websocket.close":
            return output["code"]
        assert json.loads(output["text"]).get("beat") or "refetch" in output["text"], output


# --- login throttling -----------------------------------------------------------------------------------------
def test_the_admin_login_shares_the_lockout_of_the_login_page(db, settings, django_user_model):
    settings.AXES_FAILURE_LIMIT = 3
    username = f"target-{uuid.uuid4().hex[:8]}"
    user = django_user_model.objects.create_user(username=username, password="right-pass-123", is_staff=True)
    api_token_create(user=user)  # a token is no way around it either: it signs in to nothing but the API
    for _ in range(3):
        Client().post("/login/", {"username": username, "password": "guess"})
    browser = Client()
    refused = browser.post("/admin/login/", {"username": username, "password": "right-pass-123", "next": "/admin/"})
    assert refused.status_code == 429 and "_auth_user_id" not in browser.session
    other_address = Client(REMOTE_ADDR="10.9.8.7")  # counted per username and address (docs/access.md)
    assert other_address.post("/admin/login/", {"username": username, "password": "right-pass-123"}).status_code == 302
