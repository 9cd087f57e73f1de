import secrets

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand

from agents.demo import load_demo_workflows
from approvals.policies import demo_waivers_load
from evals.demo import demo_suite_load
from tenancy.access import default_project, membership_grant


def _password(name: str) -> str:
    """One password per demo login, made once and kept in the var directory (readable by its owner only)."""
    path = settings.VAR_DIR / name
    if not path.exists():
        path.write_text(secrets.token_urlsafe(12))
        path.chmod(0o600)
    return path.read_text().strip()


class Command(BaseCommand):
    help = (
        "Create the two demo logins (printed): demo, who starts runs and may use the admin, and reviewer, "
        "who decides approvals; load the demo workflows, the demo project's waivers and evaluation suite."
    )

    def handle(self, **options):
        load_demo_workflows()
        demo_waivers_load()  # the drills send their e-mails unattended: said explicitly, in the demo project
        demo_suite_load()
        users = get_user_model().objects
        password = _password("demo-password")
        user, _ = users.get_or_create(username="demo", defaults={"is_staff": True, "is_superuser": True})
        user.set_password(password)
        user.is_staff = user.is_superuser = user.is_active = True
        user.save()
        # A second person: the one who starts a run may not approve its own proposals (separation of duties).
        reviewer_password = _password("demo-reviewer-password")
        reviewer, _ = users.get_or_create(username="reviewer")
        reviewer.set_password(reviewer_password)
        reviewer.is_active = True
        reviewer.is_staff = reviewer.is_superuser = False
        reviewer.save()
        membership_grant(user=reviewer, project=default_project(), role="reviewer")
        self.stdout.write(f"demo login: username demo, password {password}")
        self.stdout.write("  starts runs (try incident-fanout with propose mode) and may use the admin")
        self.stdout.write(f"reviewer login: username reviewer, password {reviewer_password}")
        self.stdout.write("  decides approvals: log in from a private window at /approvals/")
