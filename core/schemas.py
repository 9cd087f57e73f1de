"""Input from outside taken strictly: the base config and the number fields of request bodies and queries."""

import re
from typing import Annotated

from pydantic import BeforeValidator, ConfigDict, Field

# Input from outside is taken as the OpenAPI schema states it: no coercion (false is not 0, "5" is not 5)
# and no unknown fields, which are usually a client's typo that would otherwise be silently ignored.
STRICT = ConfigDict(strict=True, extra="forbid")


def _integral(value):
    return int(value) if isinstance(value, float) and value.is_integer() else value


def Whole(ge: int | None = None, le: int | None = None):
    """An integer field of a request body. JSON Schema counts 3.0 as an integer, and some encoders write whole
    numbers that way; 3.5 stays an error. The bounds sit inside so the OpenAPI schema states them."""
    return Annotated[int, Field(ge=ge, le=le), BeforeValidator(_integral)]


def _decimal_text(value):
    if isinstance(value, str) and not DECIMAL.fullmatch(value):
        raise ValueError("should be a whole number in decimal digits")
    return value


DECIMAL = re.compile(r"-?[0-9]+(\.0+)?")  # "3.0" is an integer to JSON Schema too


def QueryWhole(ge: int | None = None, le: int | None = None):
    """An integer query parameter: plain digits only ("1_000" and " 7 " are refused, where pydantic's lax
    parsing of text would take them)."""
    return Annotated[int, Field(ge=ge, le=le), BeforeValidator(_decimal_text)]


# An id in the path, as digits (pydantic would take "1_0" for 10).
PathId = Annotated[int, BeforeValidator(_decimal_text)]
