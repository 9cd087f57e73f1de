"""Webhooks, OTLP traces and Idempotency-Key records moved from the engine (runs) to the integrations app,
keeping their tables: a database made before the move keeps its rows and the permissions granted on them,
and the admin's old URLs land on the new ones for good."""

import pytest
from django.contrib.contenttypes.models import ContentType

from tests.migrating import granted_before, migrated_back

BEFORE = [("integrations", None), ("runs", "0025_eval_accepted_quarantine")]


@pytest.mark.django_db(transaction=True)
def test_rows_and_permissions_made_before_the_move_are_kept():
    with migrated_back(BEFORE) as old:
        # What an installation had before the move, written with the models of that time.
        granted_before(old, app_label="runs", model="webhookendpoint", codename="view_webhookendpoint")
        endpoint = old.get_model("runs", "WebhookEndpoint").objects.create(
            url="https://hooks.example.com/w", secret="s"
        )
        old.get_model("runs", "WebhookDelivery").objects.create(
            endpoint=endpoint,
            event="run.finished",
            payload={"event": "run.finished"},
            next_attempt_at="2026-01-01T00:00Z",
        )

    from django.contrib.auth.models import User as NowUser

    from integrations.models import WebhookDelivery, WebhookEndpoint

    pat = NowUser.objects.get(username="pat")
    assert pat.has_perm("integrations.view_webhookendpoint")  # the permission followed its model
    assert not ContentType.objects.filter(app_label="runs", model="webhookendpoint").exists()
    delivery = WebhookDelivery.objects.get()
    assert delivery.endpoint == WebhookEndpoint.objects.get(url="https://hooks.example.com/w")
    assert WebhookEndpoint._meta.db_table == "runs_webhookendpoint"  # the table kept its name


@pytest.mark.parametrize(
    "old, new",
    [
        ("/admin/runs/webhookendpoint/", "/admin/integrations/webhookendpoint/"),
        (
            "/admin/runs/webhookendpoint/3/change/?_changelist_filters=q",
            "/admin/integrations/webhookendpoint/3/change/?_changelist_filters=q",
        ),
        (
            "/admin/runs/webhookdelivery/?status__exact=failed",
            "/admin/integrations/webhookdelivery/?status__exact=failed",
        ),
        ("/admin/runs/otlptrace/", "/admin/integrations/otlptrace/"),
        ("/admin/runs/otlpexportcursor/", "/admin/integrations/otlpexportcursor/"),
        ("/admin/runs/idempotencykey/7/delete/", "/admin/integrations/idempotencykey/7/delete/"),
    ],
)
def test_old_admin_links_of_the_moved_models_redirect_for_good(admin_client, old, new):
    response = admin_client.get(old)
    assert response.status_code == 301
    assert response["Location"] == new


def test_the_new_admin_pages_answer_and_the_engines_stay(admin_client):
    assert admin_client.get("/admin/integrations/webhookendpoint/").status_code == 200
    assert admin_client.get("/admin/integrations/webhookdelivery/").status_code == 200
    assert admin_client.get("/admin/runs/run/").status_code == 200  # still the engine's
