"""schemathesis against the API's own OpenAPI schema, once per token scope and without a token: no
5xx, every response conforms to the schema, unauthenticated calls are refused, invalid bodies are
rejected with the one error shape, and valid ones are not refused as invalid."""

import pytest
import schemathesis
from django.core.wsgi import get_wsgi_application
from hypothesis import HealthCheck, settings
from schemathesis.specs.openapi.checks import negative_data_rejection, positive_data_acceptance

from config.api import SCHEMA_REJECTED
from tenancy.access import default_project, membership_grant
from tenancy.tokens import api_token_create
from tests.conftest import SCALED


def _load(*phases: str):
    loaded = schemathesis.openapi.from_wsgi("/api/v1/openapi.json", get_wsgi_application())
    # The token is the test's to give (per scope, or none): generated cases must not vary the Authorization
    # header, or a negative case that "dropped" it would be judged on a request that carried it.
    loaded.config.generation.update(with_security_parameters=False)
    for name in ("examples", "coverage", "fuzzing", "stateful"):
        loaded.config.phases.get_by_name(name=name).enabled = name in phases
    return loaded


# Examples and random cases for every scope; the coverage phase (boundaries and each way to break each
# field: most of the cases) once, with a token of every scope, since input is validated before any
# scope is checked.
schema = _load("examples", "fuzzing")
coverage_schema = _load("coverage")
SCOPES = ["read", "run", "operate", "approve"]
# Which scope may do what is the same on either database; what PostgreSQL can refuse that SQLite takes
# (a NUL in a string, an integer past 64 bits) needs the requests that reach it. The scaled half sends
# every case with a token of all the scopes, the embedded half once per scope.
CONFORMS_AS = ["all"] if SCALED else SCOPES
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
    tokens = {scope: api_token_create(user=admin, scopes=[scope])[1] for scope in SCOPES}
    return {**tokens, "all": api_token_create(user=admin, scopes=SCOPES)[1]}


def _negated_into_a_whole_number(case) -> bool:
    """schemathesis may "negate" an integer parameter into 0.0, which JSON Schema still counts as an integer,
    and so does the API: such a case is not invalid."""
    mutations = getattr(case.meta.phase.data, "mutations", ())
    return any(isinstance(m.new_value, float) and m.new_value.is_integer() for m in mutations)


@schema.parametrize()
@CHECKS_SETTINGS
@pytest.mark.parametrize("scope", CONFORMS_AS)
def test_every_operation_conforms_for_every_scope(case, scope, tokens):
    _conforms(case, tokens[scope])


@coverage_schema.parametrize()
@CHECKS_SETTINGS
def test_every_operation_takes_its_boundaries_and_refuses_each_broken_field(case, tokens):
    _conforms(case, tokens["all"])


def _conforms(case, token: str) -> None:
    headers = {"Authorization": f"Bearer {token}"}
    response = case.call(headers=headers)
    if case.method.upper() != case.operation.method.upper():  # a method the path does not have
        assert response.status_code == 405
        return
    assert response.status_code < 500, (case.method, case.path, response.text[:500])
    excluded = [negative_data_rejection] if _negated_into_a_whole_number(case) else []
    if response.status_code == 422 and case.meta.generation.mode.is_positive:
        # A rule the schema cannot state (a workflow that exists, a fault's task in that workflow): refused by
        # the domain with its own message, never by the schema validation the request satisfies.
        assert response.json()["message"] != SCHEMA_REJECTED, (case.path, case.body, response.text[:300])
        excluded.append(positive_data_acceptance)
    case.validate_response(response, headers=headers, excluded_checks=excluded)
    if response.status_code >= 400:
        assert set(response.json()) == {"code", "message", "errors"}, response.text[:300]


@schema.parametrize()
@CHECKS_SETTINGS
@pytest.mark.anymode  # refused before any query of the database or the broker
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
