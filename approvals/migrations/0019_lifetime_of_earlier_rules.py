from datetime import timedelta

from django.conf import settings
from django.db import migrations
from django.db.models import F


def lifetime_of_earlier_rules(apps, schema_editor):
    """Rules made before they had a lifetime (0011) kept expires_at empty, which the gate reads as "never
    applies". The upgrade notes promised them the longest lifetime counted from their creation: a rule
    older than that ends here, a younger one applies again until then."""
    AllowRule = apps.get_model("approvals", "AllowRule")
    days = settings.WARDEN["ALLOW_RULE_MAX_DAYS"]
    AllowRule.objects.filter(expires_at__isnull=True).update(expires_at=F("created_at") + timedelta(days=days))


class Migration(migrations.Migration):
    """The data step 0011 defined but never ran."""

    dependencies = [
        ("approvals", "0018_breaker_notification"),
    ]

    operations = [
        # Reversing leaves the lifetimes: an empty expiry is what the gate cannot honour.
        migrations.RunPython(lifetime_of_earlier_rules, migrations.RunPython.noop),
    ]
