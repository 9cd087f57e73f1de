"""Where the presentation layer shows a thing, for the layers below it that must name it in a message: a
webhook's run URL, a notification's or an e-mail's link, the admin's "View on site".

Lower layers pass ids and never spell a page's URL; the dashboard provides its pages once, at start-up
(``provide`` in dashboard/apps.py). A URL asked for before anyone provided them raises, as core.hooks does.
Absolute URLs start with ``WARDEN["BASE_URL"]``, the address people and receivers reach Warden at.
"""

from typing import Protocol

from django.conf import settings


class Pages(Protocol):
    """The paths of the pages lower layers link to."""

    def run(self, run_id: int) -> str: ...

    def approval(self, request_id: int) -> str: ...  # a request's card in the reviewer queue

    def decision_link(self, token: str) -> str: ...  # a signed one-time decision link

    def breakers(self) -> str: ...  # the inbox, listing the open breakers


_pages: Pages | None = None


def provide(pages: Pages) -> None:
    global _pages
    _pages = pages


def _provided() -> Pages:
    if _pages is None:
        raise RuntimeError("no app provides the pages' URLs (core.links.provide, in dashboard/apps.py)")
    return _pages


def absolute(path: str) -> str:
    return f"{settings.WARDEN['BASE_URL'].rstrip('/')}{path}"


def run_path(run_id: int) -> str:
    return _provided().run(run_id)


def run_url(run_id: int) -> str:
    return absolute(run_path(run_id))


def approval_url(request_id: int) -> str:
    return absolute(_provided().approval(request_id))


def decision_link_url(token: str) -> str:
    return absolute(_provided().decision_link(token))


def breakers_url() -> str:
    return absolute(_provided().breakers())
