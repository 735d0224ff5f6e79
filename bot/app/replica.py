"""This process as one replica among those sharing the store: it joins at start, says it is
alive every `HEARTBEAT` seconds (what it claims is held while it does), hears the other
replicas' wake-ups (PostgreSQL's LISTEN/NOTIFY) and leaves on a clean stop."""

from __future__ import annotations

import asyncio
import contextlib
import logging

from bot.app.notify import Notifier
from bot.store import Store
from bot.store.db import HEARTBEAT, ReplicaIdTaken
from bot.store.postgres import PostgresStore

log = logging.getLogger("vaultmail.replica")


class Presence:
    def __init__(self, store: Store, notifier: Notifier) -> None:
        self.store = store
        self.notifier = notifier
        self._task: asyncio.Task[None] | None = None

    async def start(self, replica_id: str | None, url: str | None) -> None:
        store = self.store
        # one process owns a SQLite index: whatever an earlier run held is free at once
        await store.join(replica_id, url, sole=store.engine == "sqlite")
        if isinstance(store, PostgresStore):
            await store.listen(self.notifier.wake, self.notifier.wake_everyone)
            self.notifier.publish = store.broadcast
            # (SQLite: one process, nobody to tell it is alive, and no write lock to take
            # every second)
            self._task = asyncio.create_task(self._beat(), name="vaultmail-heartbeat")
        log.info("replica joined", extra={"replica": store.replica_id, "engine": store.engine})

    async def _beat(self) -> None:
        while True:
            await asyncio.sleep(HEARTBEAT)
            try:
                await self.store.heartbeat()
            except ReplicaIdTaken as exc:  # not ready from now on: see bot.app.web, readyz
                log.error("replica retired: %s", exc,
                          extra={"replica": self.store.replica_id})
                return
            except Exception as exc:  # the database is away: the next beat tries again
                log.warning("heartbeat failed: %r", exc)

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        with contextlib.suppress(Exception):  # a store already gone: others take over later
            await self.store.leave()
