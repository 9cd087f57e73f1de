import secrets

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand

from agents.demo import load_demo_workflows
from runs.evals import demo_suite_load


class Command(BaseCommand):
    help = "Create the demo login (printed) and load the demo workflows and evaluation suite."

    def handle(self, **options):
        load_demo_workflows()
        demo_suite_load()
        path = settings.VAR_DIR / "demo-password"
        if not path.exists():
            path.write_text(secrets.token_urlsafe(12))
            path.chmod(0o600)
        password = path.read_text().strip()
        user, _ = get_user_model().objects.get_or_create(
            username="demo", defaults={"is_staff": True, "is_superuser": True}
        )
        user.set_password(password)
        user.is_staff = user.is_superuser = user.is_active = True
        user.save()
        self.stdout.write(f"demo login: username demo, password {password}")
