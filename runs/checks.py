"""Django system checks for Warden's own settings (`manage.py check`; `check --deploy` adds the production
ones). `manage.py doctor` runs them beside its checks of the live deployment."""

import ipaddress

from django.conf import settings
from django.core.checks import Error, Warning, register


@register("warden")
def warden_settings(app_configs, **kwargs):
    cfg, found = settings.WARDEN, []
    heartbeat = cfg["HEARTBEAT_SECONDS"] or cfg["LEASE_SECONDS"] / 3
    if heartbeat >= cfg["LEASE_SECONDS"]:
        found.append(Error(
            f"WARDEN_HEARTBEAT_SECONDS ({heartbeat:g}) is not below WARDEN_LEASE_SECONDS ({cfg['LEASE_SECONDS']:g})",
            hint="every lease would expire before its heartbeat renews it: unset the heartbeat (a third of the lease)",
            id="warden.E001",
        ))  # fmt: skip
    for network in cfg["METRICS_ALLOW"]:
        try:
            ipaddress.ip_network(network, strict=False)
        except ValueError:
            found.append(Error(f"WARDEN_METRICS_ALLOW: {network!r} is not an address or network",
                               hint="comma-separated, e.g. 127.0.0.1/32,10.0.0.0/8", id="warden.E002"))  # fmt: skip
    if settings.LOG_FORMAT not in ("plain", "json"):
        found.append(Warning(f"WARDEN_LOG_FORMAT={settings.LOG_FORMAT!r} is neither plain nor json",
                             hint="plain lines are written", id="warden.W001"))  # fmt: skip
    if settings.REDIS_URL and settings.DATABASES["default"]["ENGINE"].endswith("sqlite3"):
        found.append(Warning("REDIS_URL is set but DATABASE_URL is not: scaled mode on SQLite",
                             hint="workers on other hosts cannot share a SQLite file: set DATABASE_URL=postgres://…",
                             id="warden.W002"))  # fmt: skip
    return found


@register("warden", deploy=True)
def warden_production(app_configs, **kwargs):
    cfg, found = settings.WARDEN, []
    if not cfg.get("PRODUCTION"):
        return found
    if cfg["DRILL_FAULTS"]:
        found.append(Error("WARDEN_DRILL_FAULTS is on in production: a run's input can make a worker crash",
                           hint="unset WARDEN_DRILL_FAULTS (or set it to 0)", id="warden.E003"))  # fmt: skip
    if cfg["SANDBOX_TOOLS"]:
        found.append(Error("WARDEN_SANDBOX_TOOLS is on in production: the sandbox systems' tools and effects "
                           "listing are registered", hint="unset WARDEN_SANDBOX_TOOLS (or set it to 0)",
                           id="warden.E004"))  # fmt: skip
    return found
