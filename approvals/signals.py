"""Logins, logouts and failed logins go to the audit log (the username tried, never the password)."""

from django.contrib.auth.signals import user_logged_in, user_logged_out, user_login_failed
from django.dispatch import receiver

from .audit import audit


@receiver(user_logged_in)
def _logged_in(sender, request, user, **kwargs):
    audit(actor=user, action="login", target=user.get_username(), request=request)


@receiver(user_logged_out)
def _logged_out(sender, request, user, **kwargs):
    if user is not None:
        audit(actor=user, action="logout", target=user.get_username(), request=request)


@receiver(user_login_failed)
def _login_failed(sender, credentials, request=None, **kwargs):
    audit(
        actor=None, action="login", outcome="denied", target=str(credentials.get("username", ""))[:150], request=request
    )
