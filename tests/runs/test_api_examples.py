"""The integration API's OpenAPI schema shows an example of every operation's request body and success
response, and every example it carries is valid against the schema it illustrates."""

import json
from datetime import datetime

import pytest
from jsonschema import Draft202012Validator, FormatChecker
from referencing import Registry, Resource
from referencing.jsonschema import DRAFT202012

from api.runs import RunIn
from api.schemas import BodyIn
from config.api import api
from runs.schemas import RunInputIn

# As served (JSON), so that response codes are strings a JSON pointer can reach.
DOCUMENT = json.loads(json.dumps(api.get_openapi_schema()))
DOCUMENT_URI = "urn:warden:openapi"
REGISTRY = Registry().with_resource(DOCUMENT_URI, Resource.from_contents(DOCUMENT, DRAFT202012))
FORMATS = FormatChecker()
OPERATIONS = [(method, path) for path, methods in DOCUMENT["paths"].items() for method in methods]


@FORMATS.checks("date-time", raises=ValueError)
def _date_time(value) -> bool:
    # jsonschema checks date-time only with an optional package; RFC 3339 also wants the offset.
    return not isinstance(value, str) or datetime.fromisoformat(value).tzinfo is not None


def _pointer(*parts: str) -> str:
    return "".join("/" + str(part).replace("~", "~0").replace("/", "~1") for part in parts)


def _errors(example, pointer: str) -> list[str]:
    """Why ``example`` is not valid against the schema at ``pointer``, $refs resolved in the whole document."""
    validator = Draft202012Validator({"$ref": f"{DOCUMENT_URI}#{pointer}"}, registry=REGISTRY, format_checker=FORMATS)
    return [f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in validator.iter_errors(example)]


def _schema_examples(schema: dict) -> list:
    """The examples a media type's schema carries: its own, its referenced component's, or its items'."""
    if "$ref" in schema:
        schema = DOCUMENT["components"]["schemas"][schema["$ref"].removeprefix("#/components/schemas/")]
    if schema.get("examples"):
        return schema["examples"]
    if schema.get("type") == "array" and "items" in schema:
        return [[item] for item in _schema_examples(schema["items"])]
    return []


def _bodies(method: str, path: str):
    """(what, pointer to the media type) of the operation's JSON request body and 2xx responses."""
    operation = DOCUMENT["paths"][path][method]
    if "application/json" in operation.get("requestBody", {}).get("content", {}):
        yield "request body", _pointer("paths", path, method, "requestBody", "content", "application/json")
    for code, response in operation["responses"].items():
        if code.startswith("2") and "application/json" in response.get("content", {}):
            yield f"{code} response", _pointer("paths", path, method, "responses", code, "content", "application/json")


def _at(pointer: str):
    node = DOCUMENT
    for part in pointer.split("/")[1:]:
        node = node[part.replace("~1", "/").replace("~0", "~")]
    return node


@pytest.mark.parametrize(("method", "path"), OPERATIONS, ids=[f"{m} {p}" for m, p in OPERATIONS])
def test_every_operation_shows_valid_examples_of_its_bodies(method, path):
    bodies = list(_bodies(method, path))
    assert any(what.endswith("response") for what, _ in bodies), f"{method} {path} documents no 2xx JSON response"
    for what, pointer in bodies:
        media = _at(pointer)
        examples = ([media["example"]] if "example" in media else []) + _schema_examples(media["schema"])
        assert examples, f"{method} {path}: the {what} has no example"
        for example in examples:
            errors = _errors(example, pointer + "/schema")
            assert not errors, f"{method} {path}: an example of the {what} is invalid: {errors}"


def _examples_in(node, pointer: str = "", *, names: bool = False):
    """(pointer, examples) of every schema under ``node`` that carries a list of examples. ``names``: the
    node's keys are property names (any name), not keywords."""
    if isinstance(node, list):
        for n, item in enumerate(node):
            yield from _examples_in(item, f"{pointer}/{n}")
        return
    if not isinstance(node, dict):
        return
    if not names and isinstance(node.get("examples"), list):
        yield pointer, node["examples"]
    for key, value in node.items():
        if not names and key in ("examples", "example", "default", "const", "enum"):
            continue  # data, not schemas
        yield from _examples_in(value, pointer + _pointer(key), names=not names and key in ("properties", "$defs"))


def test_every_example_in_the_components_is_valid():
    """Field-level ones too (a run's workflow, an intent's arguments), not only those of whole bodies."""
    found = list(_examples_in(DOCUMENT["components"]["schemas"], "/components/schemas", names=True))
    assert found
    invalid = {pointer: errors for pointer, examples in found for e in examples if (errors := _errors(e, pointer))}
    assert not invalid


def _body_classes(cls=BodyIn):
    for sub in cls.__subclasses__():
        yield sub
        yield from _body_classes(sub)


@pytest.mark.parametrize("body", list(_body_classes()), ids=lambda body: body.__name__)
def test_request_examples_are_accepted_as_the_api_parses_bodies(body):
    """The JSON schema states most rules of a body, not all (validators, a time's parsing): parse as the API does."""
    # A part of a body (an intent's undo) may have none: the test above asks for each operation's.
    for example in body.model_json_schema().get("examples", []):
        body.model_validate_json(json.dumps(example))


def test_the_run_example_carries_an_input_the_engine_accepts():
    """A run's input is free-form in the body; run_start checks its faults (a fault at a call needs the call)."""
    for example in RunIn.model_json_schema()["examples"]:
        RunInputIn.model_validate(example["input"])
