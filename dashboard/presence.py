"""Who watches what, and the sequence numbers of what they were sent.

Pages and sockets announce their viewers here (a short-lived key in the shared cache); the publisher
(``dashboard.live``) sends only what someone watches, numbered per run and per project, so a browser
that sees a gap re-renders from the database.
"""

from django.core.cache import cache

from core.cache import tolerant
from tenancy.models import Project

PRESENCE_SECONDS = 60
LIST_PRESENCE = "watch:runs"
INBOX_PRESENCE = "watch:inbox"  # any page's nav: someone's "needs you" count is open


def inbox_group(project_id: int) -> str:
    return f"inbox-{project_id}"


def run_group(run_id: int) -> str:
    return f"run-{run_id}"


def list_group(project_id: int) -> str:
    return f"runs-{project_id}"


def run_presence(run_id: int) -> str:
    return f"watch:run:{run_id}"


def run_seq_name(run_id: int) -> str:
    return f"run-{run_id}"


def list_seq_name(project_id: int) -> str:
    return f"project-{project_id}"


def seq_current(name: str) -> int:
    return tolerant(lambda: cache.get(f"seq:{name}", 0), 0)


def seq_next(name: str) -> int:
    key = f"seq:{name}"
    try:
        return cache.incr(key)
    except ValueError:
        cache.add(key, 0, timeout=None)
        return cache.incr(key)


def list_seqs(project_ids: list[int] | None) -> dict[str, int]:
    """The runs list's sequence number per project (``None``: every project, for a superuser)."""
    if project_ids is None:
        project_ids = list(Project.objects.values_list("id", flat=True))
    keys = {f"seq:{list_seq_name(p)}": str(p) for p in project_ids}
    found = tolerant(lambda: cache.get_many(list(keys)), {})
    return {p: found.get(k, 0) for k, p in keys.items()}


def watching(*keys: str) -> None:
    """Announce a viewer (a page being rendered, an open socket) so changes are published."""
    tolerant(lambda: cache.set_many(dict.fromkeys(keys, 1), timeout=PRESENCE_SECONDS), None)
