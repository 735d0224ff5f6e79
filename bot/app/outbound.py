"""Outbound triggers: every ledger event, as a signed POST to each URL the office config names
under `webhooks:` (DESIGN §3.7), in ledger order, at least once.

Each URL has a durable cursor (the last sequence number it acknowledged), so a receiver that is
down gets everything once it is back, and a restart of the app loses nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import TYPE_CHECKING

from bot.app.signed_post import post_signed
from bot.store import ledger
from bot.store import outbound as cursors

if TYPE_CHECKING:
    from bot.app.services import Services

log = logging.getLogger("vaultmail.outbound")
POLL = 0.5  # seconds between looks at the ledger when nothing woke us
BATCH = 100
MAX_BACKOFF = 300.0

class LedgerForwarder:
    def __init__(self, services: Services) -> None:
        self.services = services
        self._task: asyncio.Task[None] | None = None
        self._wake = asyncio.Event()

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="vaultmail-outbound")

    def wake(self) -> None:
        self._wake.set()

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    async def _urls(self) -> list[str]:
        services = self.services
        urls: list[str] = []
        for org in sorted(services.installations):  # every installed office's webhooks
            office = await services.offices.get(services.forge_for_org(org), org)
            urls += [u for u in (office.webhooks if office else []) if u not in urls]
        return urls

    async def _run(self) -> None:
        while True:
            try:
                # one replica at a time sends, from the shared cursors; when it dies the
                # next oldest takes over where they stand
                if await self.services.store.is_leader():
                    for url in await self._urls():
                        await self.forward(url)
            except Exception as exc:  # keep forwarding whatever one bad round did
                log.warning("outbound round failed: %r", exc)
            self._wake.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), POLL)

    async def forward(self, url: str) -> int:
        """Send what `url` has not acknowledged yet; returns how many were sent."""
        # one sender of a cursor at a time, whichever replica believes it leads (a stalled
        # leader may wake to find a successor): read, send, advance under its lock
        async with self.services.store.named_lock(f"outbound:{url}"):
            return await self._forward(url)

    async def _forward(self, url: str) -> int:
        store = self.services.store
        row = await cursors.get_cursor(store, url)
        if row is not None and row["next_at"] > time.time():
            return 0
        cursor = int(row["seq"]) if row else 0
        sent = 0
        for entry in await ledger.entries(store, since=cursor, limit=BATCH):
            # signed with the key of the office the entry is about (its subject's org)
            about = entry.subject.split("/")[0] if "/" in entry.subject else None
            try:
                await post_signed(self.services.keyring.signer_for(
                    about or self.services.default_org), url, entry.as_json(), headers={
                    "X-Vaultmail-Event": entry.event, "X-Vaultmail-Delivery": str(entry.seq)})
            except Exception as exc:
                failures = (int(row["failures"]) if row else 0) + 1
                delay = min(MAX_BACKOFF, 0.5 * 2 ** failures)
                await self._save(url, cursor, failures, time.time() + delay, repr(exc))
                log.warning("outbound POST failed; retry in %.1fs", delay,
                            extra={"url": url, "seq": entry.seq, "error": repr(exc)})
                return sent
            cursor, sent = entry.seq, sent + 1
        if sent or row is None:
            await self._save(url, cursor, 0, 0.0, None)
        return sent

    async def _save(self, url: str, seq: int, failures: int, next_at: float,
                    error: str | None) -> None:
        await cursors.save_cursor(self.services.store, url, seq, failures, next_at, error)
