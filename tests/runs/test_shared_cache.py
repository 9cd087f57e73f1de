"""The shared cache (Redis) holds breakers, rate windows, sequence numbers and viewers: while it is
unreachable, runs go on and pages render from the database (core/cache.py)."""

from django.test import override_settings

from runs.models import Run
from runs.services import run_start
from tests.runs.test_engine import effects, finished

UNREACHABLE = {
    "default": {
        "BACKEND": "django.core.cache.backends.redis.RedisCache",
        "LOCATION": "redis://127.0.0.1:1/0",  # nothing listens there: every call is refused at once
        "OPTIONS": {"socket_connect_timeout": 1, "socket_timeout": 1},
    }
}


@override_settings(CACHES=UNREACHABLE)
def test_a_run_with_side_effects_completes_while_the_shared_cache_is_unreachable(demo_tx, worker):
    run = finished(run_start(workflow="incident-fanout"))
    assert run.status == Run.Status.COMPLETED, run.status_reason
    assert effects("email.send").count() == 5


@override_settings(CACHES=UNREACHABLE)
def test_the_dashboard_renders_while_the_shared_cache_is_unreachable(demo, operator, client):
    run = run_start(workflow="deploy-review")
    client.force_login(operator)
    for url in (f"/runs/{run.id}/", f"/runs/{run.id}/live", "/runs/"):
        assert client.get(url).status_code == 200, url
    client.logout()  # and one can log in: the throttle's counter is skipped, the password still checked
    assert client.post("/login/", {"username": "olivia", "password": "wrong"}).status_code == 200
    assert client.post("/login/", {"username": "olivia", "password": "operator-pass-123"}).status_code == 302
