"""Websockets push to the browser; nothing is written through them (actions are CSRF-checked POSTs).

A socket needs a logged-in session, an allowed Origin (config/asgi.py) and the right to see what it
joins. ``scope["user"]`` is frozen at connect, so access is checked again when a membership changes
(``access.changed`` to the user's group) and on every heartbeat (logout, deactivation, a lost message).
"""

import asyncio
import json

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncWebsocketConsumer
from django.conf import settings
from django.contrib.auth import HASH_SESSION_KEY, SESSION_KEY, get_user_model
from django.utils.module_loading import import_string

from core.errors import WardenError
from dashboard import live, presence
from runs.models import Run
from tenancy.access import authorize, project_ids
from tenancy.models import Project

# Close codes: the browser does not reconnect to a socket it may not open.
DENIED = 4403


def _session_user(session_key: str | None, user_id: int):
    """The user if their session still holds this login (not logged out, expired or changed password)."""
    if not session_key:
        return None
    store = import_string(settings.SESSION_ENGINE + ".SessionStore")(session_key)
    data = store.load()
    if str(data.get(SESSION_KEY)) != str(user_id):
        return None
    user = get_user_model().objects.filter(id=user_id, is_active=True).first()
    if user is None or data.get(HASH_SESSION_KEY) != user.get_session_auth_hash():
        return None
    return user


def _may_view_run(user, run_id: int) -> bool:
    project_id = Run.objects.filter(id=run_id).values_list("project_id", flat=True).first()
    if project_id is None:
        return False
    try:
        authorize(user, project_id, "view", what=f"run {run_id} (live updates)")
    except WardenError:
        return False
    return True


def _visible_projects(user) -> list[int]:
    ids = project_ids(user, "view")
    return list(Project.objects.values_list("id", flat=True)) if ids is None else ids


class _Consumer(AsyncWebsocketConsumer):
    beat_seconds = 15.0
    groups_joined: list[str]

    async def connect(self):
        user = self.scope.get("user")
        if user is None or not user.is_authenticated:
            await self.refuse()
            return
        self.user_id = user.id
        self.session_key = getattr(self.scope.get("session"), "session_key", None)
        self.groups_joined = []
        if not await self.allowed(user):
            await self.refuse()
            return
        if live._in_memory(self.channel_layer):
            live.publisher.server_loop = asyncio.get_running_loop()
        # Join before the hello, so nothing falls between the number it reports and the first push.
        for group in [f"user-{user.id}", *self.data_groups()]:
            await self.join(group)
        await self.accept()
        await self.hello()
        self.beat = asyncio.create_task(self.heartbeat())

    async def refuse(self) -> None:
        # Accepted, then closed with our code: a refused handshake reaches the browser as 1006, which
        # looks like a network failure and would be retried forever.
        await self.accept()
        await self.close(code=DENIED)

    async def join(self, group: str) -> None:
        await self.channel_layer.group_add(group, self.channel_name)
        self.groups_joined.append(group)

    async def leave(self, group: str) -> None:
        await self.channel_layer.group_discard(group, self.channel_name)
        self.groups_joined.remove(group)

    async def disconnect(self, code):
        if getattr(self, "beat", None):
            self.beat.cancel()
        for group in list(getattr(self, "groups_joined", [])):
            await self.leave(group)

    async def receive(self, text_data=None, bytes_data=None):
        """Nothing is accepted from the browser."""

    async def push(self, event):
        await self.send(text_data=event["text"])

    async def access_changed(self, event):
        await self.recheck()

    async def heartbeat(self):
        while True:
            await asyncio.sleep(self.beat_seconds)
            if not await self.recheck():
                return
            await self.hello(beat=True)

    async def recheck(self) -> bool:
        user = await database_sync_to_async(_session_user)(self.session_key, self.user_id)
        if user is None or not await self.allowed(user):
            await self.close(code=DENIED)
            return False
        return True


class RunConsumer(_Consumer):
    """One run's page: its group carries that run's pushes."""

    async def allowed(self, user) -> bool:
        self.run_id = int(self.scope["url_route"]["kwargs"]["run_id"])
        return await database_sync_to_async(_may_view_run)(user, self.run_id)

    def data_groups(self) -> list[str]:
        return [presence.run_group(self.run_id)]

    async def hello(self, beat: bool = False):
        def current():
            presence.watching(presence.run_presence(self.run_id))
            return presence.seq_current(presence.run_seq_name(self.run_id))

        seq = await database_sync_to_async(current)()
        await self.send(text_data=json.dumps({"seq": seq, "beat" if beat else "hello": True}))


class _ProjectsConsumer(_Consumer):
    """A socket that joins one group per project the user may see (``group_of``), and follows their
    memberships at each re-check."""

    group_of = staticmethod(presence.list_group)

    async def allowed(self, user) -> bool:
        self.projects = await database_sync_to_async(_visible_projects)(user)
        if hasattr(self, "beat"):  # a re-check: follow the memberships as they are now
            wanted = set(self.data_groups())
            kind = self.group_of(0).removesuffix("0")  # "runs-", "inbox-": this socket's groups, not user-<id>
            for group in [g for g in self.groups_joined if g.startswith(kind) and g not in wanted]:
                await self.leave(group)
            for group in wanted - set(self.groups_joined):
                await self.join(group)
        return True

    def data_groups(self) -> list[str]:
        return [self.group_of(p) for p in self.projects]


class RunListConsumer(_ProjectsConsumer):
    """The runs list: one group per project the user may see, each with its own sequence."""

    group_of = staticmethod(presence.list_group)

    async def hello(self, beat: bool = False):
        def current():
            presence.watching(presence.LIST_PRESENCE)
            return {str(p): presence.seq_current(presence.list_seq_name(p)) for p in self.projects}

        seqs = await database_sync_to_async(current)()
        await self.send(text_data=json.dumps({"seqs": seqs, "beat" if beat else "hello": True}))


class InboxConsumer(_ProjectsConsumer):
    """Every page's nav: a nudge when something changes in one of the user's projects, after which the
    page fetches the user's count again (what the user may act on is decided there, not here)."""

    group_of = staticmethod(presence.inbox_group)

    async def hello(self, beat: bool = False):
        await database_sync_to_async(presence.watching)(presence.INBOX_PRESENCE)
        if not beat:
            await self.send(text_data=json.dumps({"hello": True}))
