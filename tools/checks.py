"""The tools' system checks (`manage.py check`, and `manage.py doctor`, which runs them)."""

from django.core.checks import Warning, register

from .secrets import grants_warnings


@register("warden")
def secret_grants(app_configs, **kwargs):
    """Granted secrets whose value, now, refuses every call that names them."""
    return [
        Warning(message, hint="give the granted secret a value of its own, long and random", id="warden.W101")
        for message in grants_warnings()
    ]
