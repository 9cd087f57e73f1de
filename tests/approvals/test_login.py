"""Login and logout pages, login throttling, and the audit of logins and admin data fixes."""

import pytest
from django.urls import reverse

from tenancy.models import AuditEvent


def test_login_page_logs_in_and_out(db, client, django_user_model):
    django_user_model.objects.create_user(username="dana", password="dana-pass-123")
    assert client.get("/login/").status_code == 200
    response = client.post("/login/", {"username": "dana", "password": "dana-pass-123"})
    assert response.status_code == 302 and response["Location"] == "/"
    assert client.post("/logout/").status_code == 302
    assert list(AuditEvent.objects.order_by("id").values_list("action", "outcome")) == [
        ("login", "done"),
        ("logout", "done"),
    ]


@pytest.fixture
def limit(settings):
    settings.AXES_FAILURE_LIMIT = 3


def _login(client, username, password, **meta):
    return client.post("/login/", {"username": username, "password": password}, **meta)


def test_repeated_failures_lock_the_username_out_even_with_the_right_password(db, client, django_user_model, limit):
    django_user_model.objects.create_user(username="eve-target", password="right-pass-123")
    for _ in range(3):
        _login(client, "eve-target", "guess")
    locked = _login(client, "eve-target", "right-pass-123")
    assert locked.status_code == 429 and "Too many failed logins" in locked.content.decode()
    assert "_auth_user_id" not in client.session
    assert AuditEvent.objects.filter(action="login", outcome="denied", target="eve-target").count() == 4
    # the same username from another address is not locked by what this one did
    assert _login(client, "eve-target", "right-pass-123", REMOTE_ADDR="192.0.2.77").status_code == 302


def test_one_password_sprayed_over_many_usernames_locks_the_address(db, client, django_user_model, limit):
    django_user_model.objects.create_user(username="frank", password="frank-pass-123")
    for name in ("ana", "bo", "cy"):  # one guess each: no username reaches the limit on its own
        _login(client, name, "Summer2026!")
    assert _login(client, "frank", "frank-pass-123").status_code == 429  # the address is paused
    assert _login(client, "frank", "frank-pass-123", REMOTE_ADDR="192.0.2.77").status_code == 302


def test_behind_a_proxy_each_client_counts_alone_and_a_forged_header_changes_nothing(
    db, client, django_user_model, limit, settings
):
    settings.WARDEN = {**settings.WARDEN, "TRUSTED_PROXY_COUNT": 1}
    django_user_model.objects.create_user(username="dana", password="dana-pass-123")
    proxy = {"REMOTE_ADDR": "10.0.0.2"}  # every request arrives from the proxy
    for n in range(3):  # client A, who puts a different address of its own in front of the proxy's each time
        _login(client, "dana", "guess", HTTP_X_FORWARDED_FOR=f"6.6.6.{n}, 203.0.113.5", **proxy)
    locked = _login(client, "dana", "dana-pass-123", HTTP_X_FORWARDED_FOR="6.6.6.9, 203.0.113.5", **proxy)
    assert locked.status_code == 429  # counted as 203.0.113.5, the address the proxy saw, whatever A wrote
    # client B, through the same proxy, is not locked out of the same account
    assert _login(client, "dana", "dana-pass-123", HTTP_X_FORWARDED_FOR="198.51.100.7", **proxy).status_code == 302
    assert AuditEvent.objects.filter(action="login", outcome="done").get().address == "198.51.100.7"


def test_without_a_proxy_a_client_cannot_choose_its_address(db, client, django_user_model, limit):
    django_user_model.objects.create_user(username="gil", password="gil-pass-123")
    for n in range(3):
        _login(client, "gil", "guess", HTTP_X_FORWARDED_FOR=f"6.6.6.{n}")
    assert _login(client, "gil", "gil-pass-123", HTTP_X_FORWARDED_FOR="6.6.6.99").status_code == 429


def test_an_admin_data_fix_is_audited(db, client, django_user_model):
    root = django_user_model.objects.create_superuser(username="root", password="root-pass-123", email="r@x.y")
    client.force_login(root)
    from tenancy.models import Project

    client.post(
        reverse("admin:tenancy_project_add"),
        {
            "slug": "payments",
            "name": "Payments",
            "governance": "four_eyes",
            "memberships-TOTAL_FORMS": "0",
            "memberships-INITIAL_FORMS": "0",
        },
    )
    assert Project.objects.filter(slug="payments").exists()
    event = AuditEvent.objects.get(action="admin:add")
    assert event.actor == root and event.target.startswith("tenancy.project ") and event.via == "admin"
