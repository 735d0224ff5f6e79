"""The app's long-lived parts, built once at start-up and shared by intake, worker and tools."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from aiohttp import web
from gidgethub.routing import Router

from bot.app.notify import Notifier
from bot.app.settings import Settings
from bot.mail.signing import Keyring
from bot.office.source import OfficeSource
from bot.store import Store

if TYPE_CHECKING:
    from bot.forge.base import Forge
    from bot.forge.gitea import GiteaClient
    from bot.forge.github import ForgeClient


@dataclass
class Services:
    settings: Settings
    store: Store
    forge_client: ForgeClient | GiteaClient
    router: Router
    own_router: Router  # the few events the app caused that it still reads (recovery)
    app_slug: str
    offices: OfficeSource
    keyring: Keyring
    default_installation: int | None = None
    default_org: str | None = None
    background: set[asyncio.Task[None]] = field(default_factory=set)
    notifier: Notifier = field(default_factory=Notifier)
    _locks: dict[str, asyncio.Lock] = field(default_factory=dict)
    bot_user: str | None = None  # gitea: the bot is a plain user, not "<slug>[bot]"
    # set by whoever runs the worker: new deliveries are queued, look now
    wake_worker: Callable[[], None] = lambda: None

    def lock_for(self, key: str) -> asyncio.Lock:
        """One lock per mail (or other key): serialises the worker and tool calls on it."""
        lock = self._locks.get(key)
        if lock is None:
            if len(self._locks) > 10_000:  # drop idle locks; a held one is never dropped
                for k in [k for k, v in self._locks.items() if not v.locked()]:
                    del self._locks[k]
            lock = self._locks[key] = asyncio.Lock()
        return lock

    @property
    def bot_login(self) -> str:
        return self.bot_user or f"{self.app_slug}[bot]"

    def is_own_event(self, payload: dict[str, Any]) -> bool:
        sender = payload.get("sender") or {}
        return bool(sender.get("login") == self.bot_login)

    def forge_for(self, installation_id: int | None) -> Forge:
        inst = installation_id if installation_id is not None else self.default_installation
        if inst is None:
            raise LookupError("no installation id in the event and no default installation")
        return self.forge_client.installation(inst)


SERVICES_KEY = web.AppKey("services", Services)
