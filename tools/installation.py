"""This installation's id, which prefixes every idempotency key Warden sends (tools.models.Installation)."""

import re
import secrets

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured

from .models import Installation

KEY = re.compile(r"^[a-z][a-z0-9]{3,31}$")
_known: tuple[str, int] | None = None  # (key, legacy_runs_through): fixed for the life of the database


def installation() -> tuple[str, int]:
    """The id (the setting's if set, else the stored one) and the last run that keeps keys without it."""
    global _known
    if _known is None:
        configured = settings.WARDEN.get("INSTALLATION_ID") or ""
        if configured and not KEY.fullmatch(configured):
            raise ImproperlyConfigured("WARDEN_INSTALLATION_ID: 4 to 32 lower-case letters and digits, a letter first")
        row = Installation.objects.order_by("id").first()
        if row is None:  # a database made without migration 0007's row (e.g. flushed): make one now
            row, _ = Installation.objects.get_or_create(id=1, defaults={"key": "i" + secrets.token_hex(5)})
        _known = (configured or row.key, row.legacy_runs_through)
    return _known


def run_key_prefix(run_id: int) -> str:
    """Every idempotency key of a run starts with this: ``warden:<installation>:<run>:``."""
    key, legacy_runs_through = installation()
    return f"warden:{run_id}:" if run_id <= legacy_runs_through else f"warden:{key}:{run_id}:"
