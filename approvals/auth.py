"""Login throttling: after LOGIN_FAILURES_LIMIT failed logins for one username from one address within
LOGIN_LOCKOUT_SECONDS, further attempts are refused — even with the right password — until the window
passes. Counted in the cache (Redis in scaled mode, so every server process shares the count). While
that cache is unreachable logins are not counted (a warning is logged; runs/shared.py): operators must
still be able to log in to a dashboard whose Redis is down, and the password is checked as always."""

from django.conf import settings
from django.contrib.auth.backends import ModelBackend
from django.contrib.auth.signals import user_logged_in, user_login_failed
from django.core.cache import cache
from django.dispatch import receiver

from runs.shared import tolerant


def _key(username: str, request) -> str:
    address = (request.META.get("REMOTE_ADDR") if request is not None else "") or "-"
    return f"warden:login-failures:{username.lower()[:150]}:{address}"


def login_throttled(username: str, request) -> bool:
    failures = tolerant(lambda: cache.get(_key(username or "", request)), None) or 0
    return failures >= settings.WARDEN["LOGIN_FAILURES_LIMIT"]


class ThrottledModelBackend(ModelBackend):
    def authenticate(self, request, username=None, password=None, **kwargs):
        if username is not None and login_throttled(username, request):
            return None  # counted as one more failure by the signal below
        return super().authenticate(request, username=username, password=password, **kwargs)


@receiver(user_login_failed)
def _count_failure(sender, credentials, request=None, **kwargs):
    tolerant(lambda: _count(_key(str(credentials.get("username", "")), request)), None)


def _count(key: str) -> None:
    cache.add(key, 0, timeout=int(settings.WARDEN["LOGIN_LOCKOUT_SECONDS"]))
    try:
        cache.incr(key)
    except ValueError:
        cache.set(key, 1, timeout=int(settings.WARDEN["LOGIN_LOCKOUT_SECONDS"]))


@receiver(user_logged_in)
def _reset(sender, request, user, **kwargs):
    tolerant(lambda: cache.delete(_key(user.get_username(), request)), None)
