"""The production settings module (config/settings/production.py): Django's deploy checks pass at the
warning level, a missing secret key stops the start, and what it promises reaches the browser — HTTPS
redirect, HSTS, X-Frame-Options DENY, a CSP with frame-ancestors 'none' on our pages, Secure cookies."""

import json
import os
import subprocess
import sys

import pytest
from django.test import Client

from tests.conftest import ROOT

HOST = "warden.example.com"
SECRET_KEY = "production-test-key-" + "k3Y" * 20  # 50+ characters, many distinct: passes security.W009
# What SecurityMiddleware, the cookies and the CSP read; applied in this process for the request tests.
SECURITY_SETTINGS = [
    "DEBUG",
    "ALLOWED_HOSTS",
    "CSRF_TRUSTED_ORIGINS",
    "SECURE_SSL_REDIRECT",
    "SECURE_HSTS_SECONDS",
    "SECURE_HSTS_INCLUDE_SUBDOMAINS",
    "SECURE_HSTS_PRELOAD",
    "SECURE_PROXY_SSL_HEADER",
    "SECURE_CONTENT_TYPE_NOSNIFF",
    "SECURE_REFERRER_POLICY",
    "SECURE_CROSS_ORIGIN_OPENER_POLICY",
    "SESSION_COOKIE_SECURE",
    "SESSION_COOKIE_HTTPONLY",
    "CSRF_COOKIE_SECURE",
    "CSRF_COOKIE_HTTPONLY",
    "X_FRAME_OPTIONS",
]
DUMP = f"""
import json, django
django.setup()
from django.conf import settings
names = {SECURITY_SETTINGS!r} + ["MIDDLEWARE", "CONTENT_SECURITY_POLICY"]
dump = {{name: getattr(settings, name) for name in names}}
dump["SANDBOX_TOOLS"] = settings.WARDEN["SANDBOX_TOOLS"]
dump["DRILL_FAULTS"] = settings.WARDEN["DRILL_FAULTS"]
print(json.dumps(dump, default=str))
"""


def production_env(tmp_path, **extra) -> dict:
    """This session's environment (DATABASE_URL / REDIS_URL: the same mode), with production's variables."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("DJANGO_")}
    env.update(
        DJANGO_SETTINGS_MODULE="config.settings.production",
        DJANGO_SECRET_KEY=SECRET_KEY,
        DJANGO_ALLOWED_HOSTS=HOST,
        DJANGO_CSRF_TRUSTED_ORIGINS=f"https://{HOST}",
        WARDEN_VAR_DIR=str(tmp_path),
        PYTHONUNBUFFERED="1",
    )
    env.update(extra)
    return env


def run(args: list[str], env: dict) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)


@pytest.fixture(scope="module")
def production(tmp_path_factory) -> dict:
    """The production module's security settings, read in a process of their own (behind a TLS proxy)."""
    env = production_env(tmp_path_factory.mktemp("production"), DJANGO_SECURE_PROXY_SSL_HEADER="1")
    done = run(["-c", DUMP], env)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.splitlines()[-1])


def test_the_deploy_checks_pass_at_the_warning_level(tmp_path):
    done = run(["manage.py", "check", "--deploy", "--fail-level", "WARNING"], production_env(tmp_path))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "System check identified no issues" in done.stdout, done.stdout + done.stderr
    assert not (tmp_path / "secret_key").exists()  # the key came from the environment, none was generated


def test_without_a_secret_key_production_refuses_to_start_and_says_why(tmp_path):
    env = production_env(tmp_path)
    del env["DJANGO_SECRET_KEY"]
    done = run(["manage.py", "check"], env)
    assert done.returncode != 0
    assert "ImproperlyConfigured: DJANGO_SECRET_KEY is not set" in done.stderr, done.stderr
    assert not (tmp_path / "secret_key").exists()


def test_production_keeps_the_pages_csp_and_middleware(production, settings):
    assert production["DEBUG"] is False and production["ALLOWED_HOSTS"] == [HOST]
    assert production["CSRF_TRUSTED_ORIGINS"] == [f"https://{HOST}"]
    assert production["MIDDLEWARE"] == settings.MIDDLEWARE  # what the request test below runs through
    assert production["CONTENT_SECURITY_POLICY"] == json.loads(
        json.dumps(settings.CONTENT_SECURITY_POLICY, default=str)
    )
    assert production["CONTENT_SECURITY_POLICY"]["DIRECTIVES"]["frame-ancestors"] == ["'none'"]
    # The sandbox effects listing shows every project's effects: not in production unless asked for.
    assert production["SANDBOX_TOOLS"] is False
    assert production["DRILL_FAULTS"] is False  # no run's input may crash a worker there


def test_responses_under_production_settings_carry_the_security_headers(production, settings, operator):
    for name in SECURITY_SETTINGS:
        setattr(settings, name, production[name])
    browser = Client(HTTP_HOST=HOST)  # a new client loads the middleware with these settings
    https = {"HTTP_X_FORWARDED_PROTO": "https"}  # as the TLS-terminating proxy says

    plain = browser.get("/login/?next=/runs/")
    assert plain.status_code == 301 and plain["Location"] == f"https://{HOST}/login/?next=/runs/"

    login_page = browser.get("/login/", **https)
    assert login_page.status_code == 200
    assert login_page["Strict-Transport-Security"] == "max-age=31536000; includeSubDomains; preload"
    assert login_page["X-Frame-Options"] == "DENY"
    assert login_page["X-Content-Type-Options"] == "nosniff"
    assert login_page["Referrer-Policy"] == "same-origin"
    assert "frame-ancestors 'none'" in login_page["Content-Security-Policy"]
    csrf_cookie = browser.cookies["csrftoken"]
    assert csrf_cookie["secure"] and csrf_cookie["httponly"]

    token = login_page.context["csrf_token"]
    logged_in = browser.post(
        "/login/", {"username": "olivia", "password": "operator-pass-123", "csrfmiddlewaretoken": token}, **https
    )
    assert logged_in.status_code == 302
    session_cookie = browser.cookies["sessionid"]
    assert session_cookie["secure"] and session_cookie["httponly"] and session_cookie["samesite"] == "Lax"

    for path in ("/runs/", "/approvals/", "/api/v1/runs", "/admin/"):
        response = browser.get(path, **https)
        assert response.status_code in (200, 302, 401), (path, response.status_code)
        assert response["X-Frame-Options"] == "DENY", path
        assert response["Strict-Transport-Security"].startswith("max-age=31536000"), path
        if not path.startswith("/admin/"):  # the admin keeps Django's own pages, outside our CSP (base.py)
            assert "frame-ancestors 'none'" in response["Content-Security-Policy"], path
