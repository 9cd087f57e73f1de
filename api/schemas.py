"""The base of the integration API's request bodies."""

from ninja import Schema

from core.schemas import STRICT


class BodyIn(Schema):
    """The base of every API request body: taken strictly (core/schemas.py says why)."""

    model_config = STRICT
