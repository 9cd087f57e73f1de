"""Lower layers name the dashboard's pages through core.links, which the dashboard provides at start-up:
the URLs are the ones webhooks, notifications, e-mails and the admin's "View on site" always carried."""

import pytest
from django.conf import settings

from core import links
from runs.models import Run


def test_the_dashboard_provides_the_urls_lower_layers_send(monkeypatch):
    monkeypatch.setitem(settings.WARDEN, "BASE_URL", "https://warden.example.com/")
    assert links.run_url(7) == "https://warden.example.com/runs/7/"
    assert links.run_path(7) == "/runs/7/"
    assert links.approval_url(12) == "https://warden.example.com/approvals/#request-12"
    token = "eyJuIjoiYWJjIn0:1t2u3v:Zm9vYmFy-_"  # the shape of a signed token
    assert links.decision_link_url(token) == f"https://warden.example.com/approvals/link/{token}"
    assert links.breakers_url() == "https://warden.example.com/inbox/?kind=breaker"


def test_a_url_nobody_provided_is_an_error(monkeypatch):
    monkeypatch.setattr(links, "_pages", None)
    with pytest.raises(RuntimeError, match="provides"):
        links.run_url(1)


def test_a_run_is_viewed_on_site_at_its_page():
    assert Run(pk=5).get_absolute_url() == "/runs/5/"
