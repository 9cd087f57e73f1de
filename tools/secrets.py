"""Named secrets: which project may use which, the one door they are read through, and the scrubbing of
whatever a system sends back (docs/tools.md, "Secrets").

A tool names the credentials it needs ({secret:NAME} in an HTTP tool's or an MCP server's headers, a
stdio MCP server's ``secrets``, ``secrets=[...]`` of a Python tool) and the broker reads them at each
call from the secret source. That source, the process environment by default, also holds Warden's own
secrets, so a name has owners:

- WARDEN_SECRET_GRANTS (``{"NAME": ["project-slug", ...]}``) says which projects' declarations may name
  it. Any other name is refused to a project with the same words whether or not it is set, so a form
  never tells a project admin which variables exist.
- Warden's own settings (``warden_own``) can never be named nor granted, and no secret may hold one of
  the deployment's own secret values (``deployment_values``), checked at each read.
- Python tools registered in code (project None) are the deployment's own code: they need no grant.
- A value shorter than MIN_LENGTH is refused: too short to be found again in what a system answers.

``secrets_for`` is that one door (save-time checks, the MCP listing, every call and lookup);
``scrub`` takes every secret a call used, and the deployment's own, out of what comes back.
"""

import base64
import json
import os
import re
from collections.abc import Iterable
from functools import lru_cache
from urllib.parse import quote, quote_plus, urlsplit

from django.conf import settings
from django.utils.module_loading import import_string

from tenancy.models import Project

from .failures import ToolMisconfigured

SECRET_NAME = re.compile(r"^[A-Z][A-Z0-9_]{0,127}$")
MIN_LENGTH = 8
REDACTED = "[secret]"
# Warden's own settings, whatever WARDEN_SECRET_GRANTS says (the provider key variables the settings
# name are added in ``warden_own``).
OWN_PREFIXES = ("DJANGO_", "WARDEN_", "OTEL_")
OWN_NAMES = frozenset(
    {
        "SECRET_KEY",
        "DATABASE_URL",
        "REDIS_URL",
        "EMAIL_HOST_USER",
        "EMAIL_HOST_PASSWORD",
        "OPENAI_API_KEY",
        "ANTHROPIC_API_KEY",
        "PGPASSWORD",  # libpq's, read by the database driver
        "PROMETHEUS_MULTIPROC_DIR",
    }
)
_URL_SAFE = str.maketrans("+/", "-_")


class SecretRefused(ToolMisconfigured):
    """A named secret may not be used here. The reason never holds a value, nor says whether a secret
    that is not granted exists."""


# --- the source and the rules ------------------------------------------------------------------------


def environment_secret(name: str) -> str | None:
    """The default secret source: the process environment."""
    return os.environ.get(name) or None


def secret_read(name: str) -> str | None:
    """The source's value, unchecked: for this module and the deployment's start-up checks only."""
    source = settings.WARDEN.get("SECRET_SOURCE") or "tools.secrets.environment_secret"
    return import_string(source)(name)


def warden_own(name: str) -> bool:
    """Is ``name`` one of Warden's own settings, which no tool may name and no grant may give?"""
    providers = {settings.WARDEN.get("OPENAI_API_KEY_ENV"), settings.WARDEN.get("ANTHROPIC_API_KEY_ENV")}
    return name.startswith(OWN_PREFIXES) or name in OWN_NAMES or name in providers


def _url_password(url: str) -> str | None:
    try:
        return urlsplit(url).password
    except ValueError:
        return None


def deployment_values() -> set[str]:
    """The values of the deployment's own secrets, as this process holds them now."""
    cfg, database = settings.WARDEN, settings.DATABASES.get("default", {})
    urls = [getattr(settings, "DATABASE_URL", ""), os.environ.get("DATABASE_URL", ""), settings.REDIS_URL or ""]
    providers = (cfg.get("OPENAI_API_KEY_ENV"), cfg.get("ANTHROPIC_API_KEY_ENV"), "OPENAI_API_KEY", "ANTHROPIC_API_KEY")
    values = {
        settings.SECRET_KEY,
        *getattr(settings, "SECRET_KEY_FALLBACKS", ()),
        database.get("PASSWORD"),
        getattr(settings, "EMAIL_HOST_PASSWORD", ""),
        cfg.get("APPROVAL_WEBHOOK_SECRET"),
        cfg.get("METRICS_TOKEN"),
        *urls,
        *(_url_password(url) for url in urls if url),
        *(os.environ.get(name) for name in providers if name),
    }
    return {value for value in values if isinstance(value, str) and value}


def grants() -> dict[str, list[str]]:
    """WARDEN_SECRET_GRANTS: the projects (slugs) each secret name is granted to."""
    return settings.WARDEN.get("SECRET_GRANTS") or {}


def grants_problems() -> list[str]:
    """Grants that can never hold: of Warden's own settings (a start-up error, tools.apps)."""
    return [
        f"WARDEN_SECRET_GRANTS grants {name}, one of Warden's own settings: it can never be granted"
        for name in grants()
        if warden_own(name)
    ]


def grants_warnings() -> list[str]:
    """Grants whose value, now, would refuse every call that names them (manage.py check and doctor)."""
    found = []
    for name in grants():
        if warden_own(name):
            continue
        value = secret_read(name)
        if value is not None and len(value) < MIN_LENGTH:
            found.append(
                f"the granted secret {name} is shorter than {MIN_LENGTH} characters: calls naming it are refused"
            )
        elif value is not None and _holds_deployment_value(value):
            found.append(f"the granted secret {name} holds one of Warden's own secrets: calls naming it are refused")
    return found


def _holds_deployment_value(value: str) -> bool:
    # Equal to one, or holding a long one ("Bearer <Django's key>"); a short one (a password such as
    # "postgres") inside a longer value is more likely a coincidence than a copy.
    return any(own == value or (len(own) >= 2 * MIN_LENGTH and own in value) for own in deployment_values())


def _checked(name, *, project: str | None) -> tuple[str | None, str]:
    """The value of ``name`` for one use by ``project`` (a slug; None: the deployment's own code), or
    None and why not."""
    if not isinstance(name, str) or not SECRET_NAME.fullmatch(name):
        return None, f"the secret name {str(name)[:60]!r} must be upper case letters, digits and _"
    if warden_own(name):
        return None, f"the secret {name} is one of Warden's own settings: it can never be named"
    if project is not None and project not in grants().get(name, ()):
        return None, f"the secret {name} is not granted to project {project}"  # set or not: the same words
    value = secret_read(name)
    if value is None:
        return None, f"the secret {name} is not set" + (f" (it is granted to project {project})" if project else "")
    if len(value) < MIN_LENGTH:
        return None, (
            f"the secret {name} is shorter than {MIN_LENGTH} characters: too short to be kept out of what "
            "systems answer"
        )
    if _holds_deployment_value(value):
        return None, f"the secret {name} holds one of Warden's own secrets: it can never be used"
    return value, ""


def _project(project_id: int | None) -> str | None:
    if project_id is None:
        return None
    return Project.objects.filter(id=project_id).values_list("slug", flat=True).first() or f"#{project_id}"


def secrets_for(names: Iterable[str], *, project_id: int | None) -> dict[str, str]:
    """The named secrets' values, read now (a rotated secret is used at the next call), for a declaration
    of project ``project_id`` (None: a Python tool, the deployment's own code). Raises SecretRefused with
    the first refusal; nothing is read past it."""
    names = list(dict.fromkeys(names))
    if not names:
        return {}
    project, values = _project(project_id), {}
    for name in names:
        value, why = _checked(name, project=project)
        if value is None:
            raise SecretRefused(why)
        values[name] = value
    return values


def secret_problems(names: Iterable[str], *, project_id: int | None) -> list[str]:
    """Every refusal ``secrets_for`` would give for these names: for the checks made on save and when
    the tools are loaded."""
    names = list(dict.fromkeys(names))
    if not names:
        return []
    project = _project(project_id)
    return [why for value, why in (_checked(name, project=project) for name in names) if value is None]


# --- scrubbing ---------------------------------------------------------------------------------------


@lru_cache(maxsize=256)
def _forms(secret: str) -> frozenset[str]:
    """The shapes a system may quote ``secret`` in: as it is, percent-encoded, hex, JSON-escaped, and
    base64 in both alphabets at each byte alignment (of a secret inside a longer base64 text, only the
    characters that depend on its bytes alone are the same whatever surrounds it)."""
    raw = secret.encode()
    forms = {secret, quote(secret, safe=""), quote(secret), quote_plus(secret), raw.hex(), json.dumps(secret)[1:-1]}
    for pad in range(3):
        encoded = base64.b64encode(b"\0" * pad + raw).decode()
        core = encoded[-(-8 * pad // 6) : 8 * (pad + len(raw)) // 6]
        forms |= {core, core.translate(_URL_SAFE)}
    return frozenset(form for form in forms if len(form) >= MIN_LENGTH)


def _pattern(secrets: Iterable[str]) -> re.Pattern | None:
    forms = set()
    for secret in {*secrets, *deployment_values()}:
        if isinstance(secret, str) and len(secret) >= MIN_LENGTH:
            forms |= _forms(secret)
    if not forms:
        return None
    # Longest first: a form that contains another is replaced whole. Case-insensitive: hex and percent
    # escapes come in either case.
    return re.compile("|".join(re.escape(form) for form in sorted(forms, key=len, reverse=True)), re.IGNORECASE)


def _scrubbed(value, pattern: re.Pattern):
    if isinstance(value, str):
        return pattern.sub(REDACTED, value)
    if isinstance(value, dict):
        return {_scrubbed(k, pattern): _scrubbed(v, pattern) for k, v in value.items()}
    if isinstance(value, list):
        return [_scrubbed(v, pattern) for v in value]
    if isinstance(value, tuple):
        return tuple(_scrubbed(v, pattern) for v in value)
    return value


def scrub(value, secrets: Iterable[str] = ()):
    """``value`` (a text, or JSON-like dicts and lists) with every shape of every secret in ``secrets``
    and of the deployment's own replaced by [secret], in dict keys as in values. Call it before any cut:
    a cut can leave half a secret that no longer matches."""
    pattern = _pattern(secrets)
    return value if pattern is None else _scrubbed(value, pattern)


def scrub_failure(exc: BaseException, secrets: Iterable[str] = ()) -> BaseException:
    """``exc`` with its message scrubbed, in place; the exceptions it was raised from are dropped when
    their texts quote a secret (a traceback in a log would print them)."""
    pattern = _pattern(secrets)
    if pattern is None:
        return exc
    exc.args = _scrubbed(exc.args, pattern)
    chained, seen = exc.__cause__ or exc.__context__, 0
    while chained is not None and seen < 10:
        if pattern.search(f"{chained!r} {chained}"):
            exc.__cause__, exc.__context__, exc.__suppress_context__ = None, None, True
            break
        chained, seen = chained.__cause__ or chained.__context__, seen + 1
    return exc
