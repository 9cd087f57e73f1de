"""Login and logout pages, login throttling, and the audit of logins and admin data fixes."""

from django.urls import reverse

from approvals.models import AuditEvent


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


def test_repeated_failures_lock_the_username_out_even_with_the_right_password(db, client, django_user_model, settings):
    settings.WARDEN = {**settings.WARDEN, "LOGIN_FAILURES_LIMIT": 3, "LOGIN_LOCKOUT_SECONDS": 60}
    django_user_model.objects.create_user(username="eve-target", password="right-pass-123")
    for _ in range(3):
        client.post("/login/", {"username": "eve-target", "password": "guess"})
    locked = client.post("/login/", {"username": "eve-target", "password": "right-pass-123"})
    assert locked.status_code == 200 and "_auth_user_id" not in client.session  # the form again, not logged in
    assert AuditEvent.objects.filter(action="login", outcome="denied", target="eve-target").count() == 4
    # another username from the same address is not affected
    django_user_model.objects.create_user(username="frank", password="frank-pass-123")
    assert client.post("/login/", {"username": "frank", "password": "frank-pass-123"}).status_code == 302


def test_an_admin_data_fix_is_audited(db, client, django_user_model):
    root = django_user_model.objects.create_superuser(username="root", password="root-pass-123", email="r@x.y")
    client.force_login(root)
    from approvals.models import Project

    client.post(
        reverse("admin:approvals_project_add"),
        {
            "slug": "payments",
            "name": "Payments",
            "memberships-TOTAL_FORMS": "0",
            "memberships-INITIAL_FORMS": "0",
        },
    )
    assert Project.objects.filter(slug="payments").exists()
    event = AuditEvent.objects.get(action="admin:add")
    assert event.actor == root and event.target.startswith("approvals.project ") and event.via == "admin"
