"""The nav shows each person only the pages they may open: every link in it answers them 200, and the
pages that would answer 403 (Workers for a viewer, the admin for a non-staff member) are not in it."""

import re

import pytest

from tenancy.access import default_project, membership_grant


def _nav_html(client) -> str:
    return re.search(r"<nav>(.*?)</nav>", client.get("/runs/").content.decode(), re.S).group(1)


def _nav(client) -> dict[str, str]:
    """The nav's links: {name: url}."""
    return {name: url for url, name in re.findall(r'<a href="([^"]+)" id="nav-([a-z]+)"', _nav_html(client))}


@pytest.fixture
def person(db, django_user_model):
    def make(role: str | None, **flags):
        user = django_user_model.objects.create_user(username=f"p-{role}-{len(flags)}", password="x", **flags)
        if role:
            membership_grant(user=user, project=default_project(), role=role)
        return user

    return make


@pytest.mark.parametrize(
    "role,flags,shown",
    [
        ("viewer", {}, {"inbox", "runs", "approvals", "insight", "evals", "replays"}),
        ("reviewer", {}, {"inbox", "runs", "approvals", "insight", "evals", "replays"}),
        ("operator", {}, {"inbox", "runs", "start", "approvals", "insight", "evals", "workers", "replays"}),
        ("admin", {"is_staff": True},
         {"inbox", "runs", "start", "approvals", "insight", "evals", "workers", "admin", "replays"}),
        (None, {"is_staff": True, "is_superuser": True},
         {"inbox", "runs", "start", "approvals", "insight", "evals", "workers", "admin", "replays"}),
        (None, {}, {"inbox", "runs", "approvals", "insight", "evals", "replays"}),  # a member of nothing yet
    ],
)  # fmt: skip
def test_the_nav_offers_only_pages_that_open(person, client, role, flags, shown):
    client.force_login(person(role, **flags))
    links = _nav(client)
    assert set(links) == shown
    for name, url in links.items():
        assert client.get(url).status_code == 200, name


def test_a_viewer_is_not_offered_the_workers_page_that_refuses_them(person, client):
    client.force_login(person("viewer"))
    nav = _nav_html(client)
    assert 'href="/runs/"' in nav and 'href="/workers/"' not in nav and 'href="/admin/"' not in nav
    assert client.get("/workers/").status_code == 403  # still refused when typed in
