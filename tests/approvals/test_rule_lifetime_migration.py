"""Upgrading a database whose allow rules were made before rules had a lifetime: each gets the lifetime
the upgrade notes promised (WARDEN_ALLOW_RULE_MAX_DAYS from its creation), instead of an empty expiry the
gate reads as "never applies"."""

from datetime import timedelta

import pytest
from django.utils import timezone

from tests.migrating import as_it_was, migrated_back

# Every app as it is now, approvals just before the lifetime step (and what builds on it goes back too).
BEFORE = ("approvals", "0018_breaker_notification")


@pytest.mark.django_db(transaction=True)
def test_rules_made_before_the_lifetime_get_it_from_their_creation(settings):
    settings.WARDEN = {**settings.WARDEN, "ALLOW_RULE_MAX_DAYS": 30}
    now = timezone.now()
    with migrated_back(as_it_was(BEFORE)) as old:
        AllowRule = old.get_model("approvals", "AllowRule")
        user = old.get_model("auth", "User").objects.create(username="rita")
        project = old.get_model("tenancy", "Project").objects.create(slug="payments", name="Payments")

        def rule(tool, *, created_days_ago, expires_at=None):
            made = AllowRule.objects.create(project=project, tool=tool, created_by=user, expires_at=expires_at)
            # created_at is auto_now_add: back-date it as the installation's rows are.
            AllowRule.objects.filter(id=made.id).update(created_at=now - timedelta(days=created_days_ago))
            return made.id

        old_rule = rule("tickets.create", created_days_ago=40)
        young_rule = rule("crm.update", created_days_ago=5)
        dated_rule = rule("email.send", created_days_ago=2, expires_at=now + timedelta(days=3))

    from policy.models import AllowRule as NowRule

    rules = {rule.id: rule for rule in NowRule.objects.all()}
    assert rules[old_rule].expires_at == rules[old_rule].created_at + timedelta(days=30)
    assert rules[old_rule].expires_at < timezone.now()  # older than the lifetime: it has ended
    assert rules[young_rule].expires_at == rules[young_rule].created_at + timedelta(days=30)
    assert rules[young_rule].expires_at > timezone.now() + timedelta(days=24)  # applies again, until then
    assert rules[dated_rule].expires_at == now + timedelta(days=3)  # a rule made with a lifetime keeps it
    assert not NowRule.objects.filter(expires_at__isnull=True).exists()


@pytest.mark.django_db(transaction=True)
def test_the_lifetime_step_reverses_as_a_no_op():
    with migrated_back(as_it_was(BEFORE)):
        pass  # unapplying 0019 must not fail (nor clear the lifetimes), nor must applying it again
