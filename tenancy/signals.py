"""Logins, logouts and failed logins go to the audit log (the username tried, never the password); a
logout or a deactivation closes the user's open dashboard sockets at once."""

from django.conf import settings
from django.contrib import admin
from django.contrib.admin.models import ADDITION, CHANGE, DELETION, LogEntry
from django.contrib.auth.signals import user_logged_in, user_logged_out, user_login_failed
from django.db.models.signals import post_save
from django.dispatch import receiver

from core.bus import access_changed

from .admin_scope import ScopedAdmin
from .audit import audit


@receiver(user_logged_in)
def _logged_in(sender, request, user, **kwargs):
    audit(actor=user, action="login", target=user.get_username(), request=request)


@receiver(user_logged_out)
def _logged_out(sender, request, user, **kwargs):
    if user is not None:
        audit(actor=user, action="logout", target=user.get_username(), request=request)
        access_changed(user.id)  # its open dashboard sockets close now, not at their next heartbeat


@receiver(user_login_failed)
def _login_failed(sender, credentials, request=None, **kwargs):
    audit(
        actor=None, action="login", outcome="denied", target=str(credentials.get("username", ""))[:150], request=request
    )


@receiver(post_save, sender=LogEntry)
def _admin_change(sender, instance: LogEntry, created, **kwargs):
    """Every data fix made in the admin (add, change, delete) is in the audit log too: here for the pages
    of no project (people), by the services for the others (tenancy/admin_scope.py), with the project."""
    model = instance.content_type.model_class() if instance.content_type_id else None
    if isinstance(admin.site._registry.get(model), ScopedAdmin):
        return
    if created:
        verb = {ADDITION: "add", CHANGE: "change", DELETION: "delete"}.get(instance.action_flag, "change")
        audit(
            actor=instance.user,
            action=f"admin:{verb}",
            target=f"{instance.content_type.app_label}.{instance.content_type.model} {instance.object_id}"[:200],
            via="admin",
            detail={"object": instance.object_repr[:200], "change": instance.get_change_message()[:1000]},
        )


@receiver(post_save, sender=settings.AUTH_USER_MODEL)
def _user_saved(sender, instance, created, **kwargs):
    """A deactivated user (admin, or any code path) loses their open sockets now, not at the next
    heartbeat; their sessions no longer authenticate (Django refuses inactive users) and their API
    tokens stop working (tenancy/tokens.py)."""
    if not created and not instance.is_active:
        access_changed(instance.id)
