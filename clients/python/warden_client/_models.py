"""What the API answers, as small typed records (the whole answer stays in ``raw``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


class WardenError(Exception):
    """A 4xx or 5xx answer, with the API's error code and per-field errors (docs/api.md, "Errors")."""

    def __init__(self, status: int, code: str, message: str, errors: list | None = None):
        super().__init__(f"{status} {code}: {message}")
        self.status, self.code, self.message, self.errors = status, code, message, errors or []


@dataclass
class Run:
    id: int
    kind: str
    status: str
    status_reason: str
    raw: dict = field(repr=False)

    @property
    def finished(self) -> bool:
        return self.status in ("completed", "failed", "cancelled", "compensated")


@dataclass
class Operation:
    id: int
    idempotency_key: str
    status: str
    status_reason: str
    approval_id: int | None
    result: Any
    raw: dict = field(repr=False)

    @property
    def decided(self) -> bool:
        """No longer waiting for a reviewer: approved, rejected, or further along."""
        return self.status not in ("awaiting_approval", "proposed")

    @property
    def approved(self) -> bool:
        return self.status == "approved"

    @property
    def created(self) -> bool:
        """This intent request recorded it; False when a rerun found it there already."""
        return bool(self.raw.get("created"))


def run_of(data: dict) -> Run:
    return Run(data["id"], data.get("kind", ""), data["status"], data.get("status_reason", ""), data)


def operation_of(data: dict) -> Operation:
    return Operation(
        data["id"],
        data["idempotency_key"],
        data["status"],
        data.get("status_reason", ""),
        data.get("approval_id", data.get("approval")),
        data.get("result"),
        data,
    )
