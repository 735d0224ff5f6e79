"""The index's housekeeping: the leader prunes what is past its time every PRUNE_EVERY seconds
(`bot.store.prune` says what and for how long)."""

from __future__ import annotations

import asyncio
import logging
import time

from bot.app.background import Background
from bot.store.db import Store
from bot.store.prune import DAY, prune

log = logging.getLogger("vaultmail.prune")
PRUNE_EVERY = 3600.0


class Pruner(Background):
    task_name = "vaultmail-prune"

    def __init__(self, store: Store, keep_days: float, every: float = PRUNE_EVERY) -> None:
        self.store = store
        self.keep = keep_days * DAY
        self.every = every
        super().__init__()

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
