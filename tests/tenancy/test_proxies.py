"""Requests through a reverse proxy WARDEN_TRUSTED_PROXY_COUNT does not name are noted for the doctor:
which headers, from which peer (the proxy), when; at most once a minute per process, never the client's
address, never when the proxy is named or when no proxy is there."""

import json

import pytest

from tenancy import proxies


@pytest.fixture
def noted(settings, tmp_path):
    settings.VAR_DIR = tmp_path
    proxies._last_noted[0] = float("-inf")
    return tmp_path / proxies.SIGHTING_FILE


def test_a_request_through_an_unnamed_proxy_is_noted_once_a_minute(db, client, noted):
    client.get("/healthz", HTTP_X_REAL_IP="203.0.113.9", HTTP_FORWARDED="for=203.0.113.9")
    note = json.loads(noted.read_text())
    assert note["headers"] == ["Forwarded", "X-Real-Ip"] and note["peer"] == "127.0.0.1"
    assert "203.0.113.9" not in noted.read_text()
    assert proxies.sighting_last()["at"].tzinfo is not None

    noted.unlink()
    client.get("/healthz", HTTP_X_FORWARDED_FOR="203.0.113.9")  # within the minute: not written again
    assert not noted.exists()
    proxies._last_noted[0] -= proxies.SIGHTING_INTERVAL_SECONDS
    client.get("/healthz", HTTP_X_FORWARDED_FOR="203.0.113.9")
    assert json.loads(noted.read_text())["headers"] == ["X-Forwarded-For"]


def test_a_direct_request_or_a_named_proxy_is_not_noted(db, client, noted, settings):
    client.get("/healthz")
    settings.WARDEN = {**settings.WARDEN, "TRUSTED_PROXY_COUNT": 1}
    client.get("/healthz", HTTP_X_FORWARDED_FOR="203.0.113.9")
    assert not noted.exists() and proxies.sighting_last() is None


def test_a_note_that_cannot_be_written_fails_no_request(db, client, settings, tmp_path):
    settings.VAR_DIR = tmp_path / "missing"  # no such directory
    proxies._last_noted[0] = float("-inf")
    assert client.get("/healthz", HTTP_X_FORWARDED_FOR="203.0.113.9").status_code == 200
    assert proxies.sighting_last() is None
