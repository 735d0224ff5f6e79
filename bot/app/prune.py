"""The index's housekeeping: the leader prunes what is past its time every PRUNE_EVERY seconds
(`bot.store.prune` says what and for how long)."""

from __future__ import annotations

import asyncio
import logging
import time

from bot.store.db import Store
from bot.store.prune import DAY, prune

log = logging.getLogger("vaultmail.prune")
PRUNE_EVERY = 3600.0


class Pruner:
    def __init__(self, store: Store, keep_days: float, every: float = PRUNE_EVERY) -> None:
        self.store = store
        self.keep = keep_days * DAY
        self.every = every
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="vaultmail-prune")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    async def run_once(self) -> dict[str, int]:
        deleted = await prune(self.store, now=time.time(), keep=self.keep)
        if any(deleted.values()):
            log.info("index pruned", extra={"deleted": deleted, "keep_days": self.keep / DAY})
        return deleted

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.every)
            try:
                if await self.store.is_leader():  # one replica prunes for all
                    await self.run_once()
            except Exception as exc:  # the next round tries again
                log.warning("pruning failed: %r", exc)
