"""Reconciliation: webhooks the forge failed to deliver are asked for again.

GitHub never retries a failed delivery by itself. Every `interval` seconds this lists the App's
failed deliveries (newest first, with the App's JWT) and redelivers each one whose delivery id
the app has not recorded; redelivery keeps the id, so intake still handles it exactly once.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Callable
from typing import Any, Protocol

from bot.store import Store, deliveries


class Deliveries(Protocol):
    """The App-JWT calls reconciliation makes (GitHub's `AppForge`; Gitea's lists none)."""

    def iter_deliveries(self, status: str | None = None,
                        per_page: int = 100) -> AsyncIterator[dict[str, Any]]: ...

    async def redeliver(self, delivery_id: int) -> None: ...


log = logging.getLogger("vaultmail.reconcile")
MAX_SCAN = 1000  # failed deliveries looked at per round (GitHub keeps three days of them)


class Reconciler:
    def __init__(self, store: Store, app_forge: Callable[[], Deliveries],
                 interval: float = 300.0) -> None:
        self.store = store
        self.app_forge = app_forge  # App-JWT calls (deliveries, redelivery)
        self.interval = interval
        self._asked: dict[str, float] = {}  # delivery id -> when this process asked for it
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="vaultmail-reconcile")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.interval)
            try:
                if await self.store.is_leader():  # one replica at a time asks the forge
                    async with self.store.named_lock("reconcile"):
                        await self.run_once()
            except Exception as exc:  # the forge may be down; try again next round
                log.warning("reconciliation failed: %r", exc)

    async def _recorded(self, guid: str) -> bool:
        return await deliveries.delivery_recorded(self.store, guid)

    async def run_once(self) -> int:
        """Redeliver what was missed; returns how many deliveries were asked for again."""
        app = self.app_forge()
        asked = scanned = 0
        seen: set[str] = set()  # a delivery id lists once per failed attempt: ask once a round
        async for delivery in app.iter_deliveries(status="failure"):
            scanned += 1
            if scanned > MAX_SCAN:
                break
            guid = str(delivery["guid"])
            if guid in seen:
                continue
            seen.add(guid)
            recent = time.monotonic() - self._asked.get(guid, -1e18) < self.interval
            if recent or await self._recorded(guid):
                continue  # asked the last round, still in flight (a redelivery may fail too)
            await app.redeliver(int(delivery["id"]))
            self._asked[guid] = time.monotonic()
            asked += 1
            log.info("missed webhook redelivered", extra={
                "delivery_id": guid, "event": delivery.get("event"),
                "installation_id": delivery.get("installation_id")})
        return asked
