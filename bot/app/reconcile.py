"""Reconciliation: webhooks the forge failed to deliver are asked for again.

GitHub never retries a failed delivery by itself. Every `interval` seconds a round lists the
App's failed deliveries (newest first, with the App's JWT, following the `Link` cursor) down to
where the last complete listing reached, notes those whose guid the app has not recorded
(`bot.store.deliveries`), and asks the forge to deliver them again, oldest first: a comment's
`/close` must not arrive before the `issues.opened` it is about. Redelivery keeps the guid, so
intake still handles each once.

A guid is asked for again only when its redelivery failed too (a newer failed attempt of it is
listed), after a growing pause. A redelivery intake answers without recording (the app's own
events no handler reads) stays listed as failed, and is not asked for a second time.

A listing longer than a round's bound goes on from its cursor the next round; meanwhile only
guids an earlier listing reached are asked for, so none jumps ahead of an older one not yet
listed.

A round learns of a miss only after the fact (every `interval`), so an issue's later
deliveries have usually been handled by then: one about a vault's issue whose `issues.opened`
is the miss finds no mail, and is parked in the queue until the redelivered `opened` adopts the
issue (`handlers.mail.wait_for_mail`); the adoption takes the issue as the forge has it then
(closed, relabelled, edited). Later deliveries about a mail whose earlier one is missing are
ordered by forge time instead (`bot.store.moves`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol

from bot.app.background import Background
from bot.forge.errors import NotFound, ValidationFailed
from bot.store import Store
from bot.store import deliveries as store_deliveries
from bot.store.deliveries import Failed


class Deliveries(Protocol):
    """The App-JWT calls reconciliation makes (GitHub's `AppForge`; Gitea's lists none)."""

    def iter_deliveries(self, status: str | None = None,
                        per_page: int = 100) -> AsyncIterator[dict[str, Any]]: ...

    async def redeliver(self, delivery_id: int) -> None: ...


log = logging.getLogger("vaultmail.reconcile")
WINDOW = 3 * 86400.0  # github.com redelivers deliveries of the past 3 days, no older
OVERLAP = 600.0  # listed again below the mark: attempts finish out of id order (10 s timeout)
PER_PAGE = 100  # GitHub's most
LIST_PER_ROUND = 5000  # failed deliveries listed per round (50 requests)
ASK_PER_ROUND = 300  # redeliveries per round: GitHub takes 180 writes a minute per endpoint
MAX_PAUSE = 3600.0  # the longest wait before asking again for a redelivery that failed


@dataclass
class _Listing:
    """A listing of failed deliveries, newest first, that may take several rounds."""

    items: AsyncIterator[dict[str, Any]]
    top: tuple[int, float] | None = None  # the newest delivery it listed (id, time)


def _time(text: str) -> float:
    return datetime.fromisoformat(text).timestamp()


class Reconciler(Background):
    task_name = "vaultmail-reconcile"

    def __init__(self, store: Store, app_forge: Callable[[], Deliveries],
                 interval: float = 300.0, *, per_page: int = PER_PAGE,
                 list_per_round: int = LIST_PER_ROUND, ask_per_round: int = ASK_PER_ROUND,
                 clock: Callable[[], float] = time.time) -> None:
        self.store = store
        self.app_forge = app_forge  # App-JWT calls (deliveries, redelivery)
        self.interval = interval
        self.per_page = per_page
        self.list_per_round = list_per_round
        self.ask_per_round = ask_per_round
        self.clock = clock  # wall time, as the forge's `delivered_at`
        self._listing: _Listing | None = None
        super().__init__()

    async def stop(self) -> None:
        await super().stop()
        await self._drop_listing()

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.interval)
            try:
                if await self.store.is_leader():  # one replica at a time asks the forge
                    await self.run_once()
            except Exception as exc:  # the forge may be down; try again next round
                log.warning("reconciliation failed: %r", exc)

    def _pause(self, asks: int) -> float:
        """How long after its `asks`-th redelivery a guid waits to be asked for again, should
        that fail too: the next round first, then ever longer."""
        return min(self.interval * float(2 ** (asks - 1) - 1), MAX_PAUSE)

    async def run_once(self) -> int:
        """Redeliver what was missed; returns how many deliveries were asked for again."""
        async with self.store.named_lock("reconcile"):  # one round at a time: one listing
            return await self._round()

    async def _round(self) -> int:
        app = self.app_forge()
        now = self.clock()
        await store_deliveries.forget_missed(self.store, now - WINDOW)
        mark = await store_deliveries.reconcile_mark(self.store)
        complete = await self._list(app, now, mark)
        # while a listing goes on, what it has not reached yet may be older than what it found
        upto = None if complete else (mark[0] if mark else -1)
        due = await store_deliveries.due_missed(self.store, now, self.ask_per_round, upto)
        asked = 0
        for missed in due:
            if await store_deliveries.delivery_recorded(self.store, missed.guid):
                continue  # arrived meanwhile (a late attempt, someone's redelivery)
            fields = {"delivery_id": missed.guid, "forge_delivery": missed.delivery_id,
                      "event": missed.event, "installation_id": missed.installation_id,
                      "asks": missed.asks + 1}
            try:
                await app.redeliver(missed.delivery_id)
            except (NotFound, ValidationFailed) as exc:  # too old, or gone: for good
                log.warning("missed webhook not redelivered: %s", exc.message, extra=fields)
            else:
                asked += 1
                log.info("missed webhook redelivered", extra=fields)
            await store_deliveries.asked(self.store, missed.guid, missed.delivery_id, now,
                                         now + self._pause(missed.asks + 1))
        return asked

    async def _list(self, app: Deliveries, now: float, mark: tuple[int, float] | None) -> bool:
        """Go on with the listing of failed deliveries, down to where the last complete one
        reached (less OVERLAP) or to the redelivery window, noting those not recorded; at most
        `list_per_round` of them. Returns whether it got there."""
        if self._listing is None:
            self._listing = _Listing(app.iter_deliveries(status="failure",
                                                         per_page=self.per_page))
        listing = self._listing
        floor = now - WINDOW if mark is None else max(mark[1] - OVERLAP, now - WINDOW)
        batch: list[Failed] = []
        reached, last = False, None
        try:
            for _ in range(self.list_per_round):
                item = await anext(listing.items, None)
                if item is None:
                    reached = True
                    break
                at = _time(str(item["delivered_at"]))
                if at < floor:
                    reached = True
                    break
                failed = Failed(str(item["guid"]), int(item["id"]), at, item.get("event"),
                                item.get("installation_id"))
                if listing.top is None:
                    listing.top = (failed.delivery_id, at)
                batch.append(failed)
                last = failed.delivery_id
                if len(batch) >= self.per_page:
                    await store_deliveries.note_failed(self.store, batch)
                    batch = []
            await store_deliveries.note_failed(self.store, batch)
        except BaseException:
            await self._drop_listing()  # the next round lists from the newest again
            raise
        if not reached:
            log.info("failed deliveries: listing goes on next round",
                     extra={"listed_to": last, "mark": mark[0] if mark else None})
            return False
        # a listing begun before another replica's later one must not move the mark back
        if listing.top is not None and (mark is None or listing.top[0] > mark[0]):
            await store_deliveries.save_reconcile_mark(self.store, *listing.top)
        await self._drop_listing()
        return True

    async def _drop_listing(self) -> None:
        listing, self._listing = self._listing, None
        if listing is not None and isinstance(listing.items, AsyncGenerator):
            await listing.items.aclose()
