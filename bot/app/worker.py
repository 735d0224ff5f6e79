"""Drains the durable queue through the handlers' routers.

Deliveries about one issue are handled one at a time, in the order they arrived (a lane each);
deliveries about different issues run side by side (up to `concurrency`), so one slow forge
round trip does not hold up the rest. Work is claimed as room frees up, not batch by batch, so
a claim never waits for the slowest delivery of the one before it. Deliveries about no issue
(installation, push, label) are barriers: everything before them finishes first, then they run
alone. A failing delivery is retried with exponential backoff and, after `max_attempts`,
becomes a dead letter that an operator lists and replays (`vaultmail dead-letters`). A
delivery about a vault's issue that is not mail yet (its `issues.opened` is missing: dropped,
to be redelivered) is parked rather than finished (`HandlerContext.park`), and runs again, in
its order, once the issue is adopted.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from collections import Counter, deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from gidgethub import sansio
from gidgethub.routing import Router

from bot import metrics
from bot.app.context import HandlerContext, change_key, named_change_key
from bot.app.logs import bound, delivery_context
from bot.app.org_signed import NotAsTheForgeSays, checked_event, org_signed
from bot.errors import VaultmailError
from bot.forge.errors import PutOff, RateLimited
from bot.forge.pacing import acting_for, waiting_at_most
from bot.store import QueueItem, Store, queue
from bot.store.idempotency import Settlement, Stray, resuming
from bot.store.sql import Connection

# (delivery, its bound logger) -> what its handlers receive; LookupError when nothing can act
ContextFactory = Callable[[QueueItem, logging.LoggerAdapter[logging.Logger]], HandlerContext]

log = logging.getLogger("vaultmail.worker")
# Deliveries run side by side, and held claimed at a time, per engine (measured:
# bench.probot_compare, bench.replicas). SQLite's one process commits what many deliveries
# hand in together, so 64 at once ran about 1.25x as many events a second as 16, and 128 more
# again. On PostgreSQL each delivery holds a pooled connection for its transactions, and 64
# halved what replicas answered webhooks with. While others run, a claim waits for room for
# REFILL (and for something to claim): one write transaction for many deliveries' finishes
# and claims, not one for each that finishes.
CONCURRENCY = {"sqlite": 128, "postgresql": 16}
BATCH = {"sqlite": 128, "postgresql": 64}
REFILL = {"sqlite": 32, "postgresql": 16}
# An issue whose lane holds this many claimed deliveries is left alone by claims until it holds
# fewer, and what its lane holds past them counts for no room: a storm about one issue (they run
# one at a time) neither fills the room nor holds other issues' deliveries back.
DEEP = {"sqlite": 32, "postgresql": 16}
# an office running 1/SHARE of the room or more is served after the others (Worker._sharing)
SHARE = 2
IDLE_LOOK = 5.0  # seconds at most between looks at an idle queue (SQLite: one process)
SHARED_IDLE_LOOK = 0.5  # ... shared with other replicas (PostgreSQL)
# The longest a delivery's forge write waits in line for its office's budget or a rate limit
# (a minute's window and its slack): its lane, the later deliveries about its issue, waits for
# it, and it holds one of the places others run in. Longer (the hour's creations spent, a
# primary limit's reset), the delivery is put off until then (PutOff: no attempt counted) and
# its place goes to others.
WAIT_AT_MOST = 65.0
STORE_RETRY, STORE_RETRY_MAX = 0.5, 5.0  # seconds between tries while the index is away


def issue_key(item: QueueItem) -> str | None:
    """The issue a delivery is about (its order matters only among those), or None: the key
    it is queued under, which the store's claims order by (not its payload's: a name before
    a rename)."""
    return item.issue_key


_OFFICE = "office:"  # a lane of an office's delivery about no issue (never an issue's key)


class Worker:
    def __init__(self, store: Store, router: Router, own_router: Router,
                 is_own_event: Callable[[dict[str, Any]], bool], make_context: ContextFactory,
                 *, max_attempts: int = 6, base_backoff: float = 2.0,
                 concurrency: int | None = None, wait_at_most: float = WAIT_AT_MOST) -> None:
        self.store = store
        self.router = router
        self.own_router = own_router  # the few events the app caused that it still reads
        self.is_own_event = is_own_event
        self.make_context = make_context
        self.max_attempts = max_attempts
        self.base_backoff = base_backoff
        self.wait_at_most = wait_at_most
        self.concurrency = CONCURRENCY[store.engine] if concurrency is None else concurrency
        self.batch = max(BATCH[store.engine], self.concurrency)  # claimed, not yet finished
        self.refill = min(REFILL[store.engine], self.batch)
        self.deep = DEEP[store.engine]
        self._gate = asyncio.Semaphore(self.concurrency)  # lanes running at once
        self._wake = asyncio.Event()
        self._arrived = False  # woken by intake since the last claim
        self._more = False  # the last claim took all it asked for: more may be due
        self._claimed_at = 0.0  # (time.monotonic) when the last claim ended
        self._stop_asked = asyncio.Event()
        self._stopping = False
        self._task: asyncio.Task[None] | None = None
        self._idle = asyncio.Event()
        # delivery id -> what this replica claimed and has not finished or let go of
        self._in_flight: dict[str, QueueItem] = {}
        self._lanes: dict[str, _Lane] = {}  # issue -> the deliveries about it, run in order
        # office -> its deliveries claimed while one of its about no issue waits or runs
        # (`_place`): run after it, in order
        self._waiting: dict[str, deque[QueueItem]] = {}
        self._claims = 0  # claims begun
        # issue cut short (a retry) -> claims begun by then: what those took about it was
        # taken while the retry was not yet recorded, and is let go of, not run past it
        self._held_back: dict[str, int] = {}
        self._finished: list[tuple[QueueItem, str]] = []  # handled, to record (see _turn)
        self._settling: list[Settlement] = []  # their results, recorded with them
        self._let_go: list[QueueItem] = []  # claimed, not run: let go of with the next claim
        # delivery id -> the forge-change key claimed for it with its claim (see _preclaim)
        self._preclaimed: dict[str, tuple[str, str]] = {}

    def wake(self) -> None:
        """New work arrived (intake, an unparked issue)."""
        self._arrived = True
        self._wake.set()

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="vaultmail-worker")

    async def stop(self, drain_timeout: float = 10.0) -> None:
        """Stop after draining what is due now (graceful shutdown), within drain_timeout."""
        self._stopping = True
        self._stop_asked.set()
        self.wake()
        if self._task is not None:
            try:
                await asyncio.wait_for(asyncio.shield(self._task), drain_timeout)
            except TimeoutError:
                log.warning("shutdown: queue not drained in time; it resumes at next start")
                self._task.cancel()  # what it was handling stays pending, no attempt counted
                await asyncio.wait([self._task])  # done before the store it writes to closes
                self._in_flight.clear()  # nothing runs now: their unused pre-claims let go of
                with contextlib.suppress(Exception):  # what did finish, recorded all the same
                    await self._record_finished(limit=0)

    async def idle(self, timeout: float = 30.0) -> None:
        """Wait until nothing is pending, retries included (for tests, demo and benchmarks)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self._idle.is_set() and await self.store.pending_count() == 0:
                return
            await asyncio.sleep(0.01)
        raise TimeoutError("worker still busy")

    async def _run(self) -> None:
        pause = STORE_RETRY
        try:
            while True:
                try:
                    if await self._turn():
                        return
                    pause = STORE_RETRY
                except Exception as exc:  # the database is away (a restart, a failover): go on
                    if self._stopping and not self._lanes:
                        return  # (what this replica holds is taken over once it is gone)
                    log.warning("worker could not claim or release deliveries (is the index"
                                " reachable?); trying again in %.1fs: %r", pause, exc)
                    with contextlib.suppress(TimeoutError):  # (not cut short by lanes ending)
                        await asyncio.wait_for(self._stop_asked.wait(), pause)
                    pause = min(STORE_RETRY_MAX, pause * 2)
        finally:  # (cancelled: what the lanes run stays pending, no attempt counted)
            lanes = [lane.task for lane in self._lanes.values()]
            for task in lanes:
                task.cancel()
            if lanes:
                await asyncio.wait(lanes)

    async def _turn(self) -> bool:
        """Claim what there is room for and start it, or wait for room or work; True once
        stopping with nothing due and nothing running."""
        store = self.store
        self._wake.clear()  # (before any look: a wake-up for what the look misses is kept)
        deep = [key for key, lane in self._lanes.items() if len(lane.items) >= self.deep]
        # what waits behind its office's delivery about no issue counts for no room either:
        # claims leave that office alone until it has run (else an office's backlog behind
        # its slow config reload filled the room, and every office waited for it)
        flying = len(self._in_flight) - sum(len(self._lanes[key].items) - self.deep
                                            for key in deep) \
            - sum(len(waiting) for waiting in self._waiting.values())
        if self._in_flight:
            # others run: claim once there is room for REFILL and something may be due (woken
            # by an arrival, or the last claim was full), not for each that finishes; and now
            # and then (a look: retries falling due, deliveries other replicas let go of)
            room = self.batch - flying
            look = self._claimed_at + self._longest_look() - time.monotonic()
            if room <= 0 or (look > 0 and (
                    room < self.refill or not (self._arrived or self._more))):
                await self._wait_for_work(None if room <= 0 else time.time() + look)
                return False
        if not self._in_flight and self._idle.is_set() and not self._stopping and not (
                self._finished or self._settling or self._preclaimed or self._let_go
                or store.has_stray() or store.has_carried()):
            # idle, nothing to record: a read says whether anything is due for this replica
            # before a write transaction claims it (else each idle replica wrote twice a
            # second on PostgreSQL)
            wakeup = await store.next_wakeup()
            if wakeup is None or wakeup > time.time():
                await self._wait_for_work(wakeup)
                return False
        # what finished is recorded in the next claim: one write for both (a crash before it
        # runs them again, as retries: ctx.retry)
        limit = self.batch - flying
        self._arrived = False
        self._claims += 1
        claim = self._claims
        items = await self._record_finished(limit=limit, deep=deep, offices=list(self._waiting))
        self._claimed_at = time.monotonic()  # (a look after a claim: a slow one is no look)
        self._more = len(items) >= limit
        if not items:
            if self._in_flight:
                return False
            if self._stopping:
                if not (store.has_carried() or self._settling or store.has_stray()):
                    return True
                # finishes or results whose rows another transaction holds: recorded before
                # the stop (else `leave` lets a finished delivery go, to run again)
                await self._wait_for_work(time.time() + queue.PARKED_POLL)
                return False
            self._idle.set()
            await self._wait_for_work(await store.next_wakeup())
            return False
        self._idle.clear()
        await self._start(items, claim)
        return False

    def _longest_look(self) -> float:
        # other replicas' work frees deliveries without waking this one: look often
        return IDLE_LOOK if self.store.engine == "sqlite" else SHARED_IDLE_LOOK

    async def _wait_for_work(self, wakeup: float | None) -> None:
        """Until woken, `wakeup` (when the next delivery this replica may take is due), or
        the longest a worker waits between looks."""
        longest = self._longest_look()
        delay = longest if wakeup is None else max(0.0, min(longest, wakeup - time.time()))
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._wake.wait(), delay)

    async def _record_finished(self, limit: int, deep: Sequence[str] = (),
                               offices: Sequence[str] = ()) -> list[QueueItem]:
        """Record what was finished, with the results of what those deliveries ran once
        (`_dispatch_once`), let go of what was claimed and not run, and claim up to `limit`
        more, leaving alone what is running and the issues `deep`: one transaction."""
        store = self.store
        finished, self._finished = self._finished, []
        # (one list, kept: a `once` still at work after its delivery was cut appends to it)
        settling = self._settling[:]
        self._settling.clear()
        let_go, self._let_go = self._let_go, []
        flying = self._in_flight
        # claimed with their deliveries, which no longer run and used them not: let go of,
        # with the claims of tries that failed while the store was away
        store.preclaims_unused([slot for guid, slot in self._preclaimed.items()
                                if guid not in flying])
        self._preclaimed = {g: slot for g, slot in self._preclaimed.items() if g in flying}
        stray = store.stray()
        preclaimed: dict[str, tuple[str, str]] = {}
        # the results and claims whose keys' rows another transaction held: the next write's
        held_settling: list[Settlement] = []
        held_stray: list[Stray] = []

        async def also(db: Connection) -> None:
            held_settling[:] = await store.settle_in(db, settling)
            held_stray[:] = await store.let_go_in(db, stray)

        async def then(db: Connection, items: list[QueueItem]) -> None:
            preclaimed.update(await self._preclaim(db, items))

        try:
            items, superseded = await store.finish_and_claim(
                finished, limit=limit, also=also if settling or stray else None,
                then=then if limit else None, excluding=[i.id for i in flying.values()],
                excluding_issues=deep, let_go=let_go, excluding_offices=offices,
                sharing=self._sharing() if limit else ())
        except BaseException:  # (the store is away: next turn)
            self._finished = finished + self._finished
            self._settling[:0] = settling
            self._let_go = let_go + self._let_go
            store.let_go_later(stray)
            raise
        store.settled([s for s in settling if s not in held_settling])
        self._settling[:0] = held_settling
        store.let_go_later(held_stray)
        self._preclaimed.update(preclaimed)
        for item in items:
            self._in_flight[item.guid] = item
        for item in superseded:
            _superseded(item)
        return items

    def _sharing(self) -> list[str]:
        """The offices running their share of this worker (half its room) or more: claims
        take another office's due deliveries before more of theirs, so one office's backlog
        never holds back a delivery of another's queued after it."""
        running: Counter[str] = Counter()  # the room each office takes, as `_turn` counts it
        for key, lane in self._lanes.items():  # (not what waits past a deep lane's DEEP, nor
            office = key.removeprefix(_OFFICE) if key.startswith(_OFFICE) \
                else queue.office_of_key(key)  # what waits behind its office's delivery)
            running[office] += min(len(lane.items), self.deep)
        share = max(1, self.batch // SHARE)
        return sorted(office for office, n in running.items() if n >= share)

    async def _preclaim(self, db: Connection, items: list[QueueItem]
                        ) -> dict[str, tuple[str, str]]:
        """In the transaction that claims `items`, the forge-change key each will be handled
        once under (`_dispatch_once`; the first of each key), claimed where no one has yet:
        a change seen for the first time, the usual case, then needs no transaction of its
        own for its claim. Returns delivery id -> (scope, key) of those claimed."""
        claimed: dict[str, tuple[str, str]] = {}
        first: dict[str, QueueItem] = {}
        for item in items:
            key = queued_change_key(item)
            if key is None or key in first:
                continue
            _, router, event = self._routed(item)
            if router.fetch(event):  # (no handler runs it: nothing to claim)
                first[key] = item
        # one statement, in the keys' order (`preclaim_in`): two replicas claiming
        # redeliveries of the same changes in another order would each wait for the other's
        # uncommitted row (a deadlock, which rolls back every office's finishes and results
        # riding the claim)
        for key in await self.store.preclaim_in(db, "forge", [(key, "") for key in first]):
            claimed[first[key].guid] = ("forge", key)
        return claimed

    def _routed(self, item: QueueItem) -> tuple[bool, Router, sansio.Event]:
        """Whether `item` is the app's own write coming back, the router its handlers are
        in (the app's own events have few), and the event they are given."""
        own = self.is_own_event(item.payload)
        return (own, self.own_router if own else self.router,
                sansio.Event(item.payload, event=item.event, delivery_id=item.guid))

    async def _start(self, items: list[QueueItem], claim: int) -> None:
        """Hand what claim number `claim` took to where each runs in order (`_place`); a
        suspect (a replica stopped holding it) or a delivery about no one office runs alone,
        after everything before it."""
        for cut in [k for k, by in self._held_back.items() if by < claim]:
            del self._held_back[cut]  # (this claim began after the retry was recorded)
        for item in items:
            if self._place(item):
                continue
            await self._drain()
            key = issue_key(item)
            if key is not None and key in self._held_back:  # (cut short meanwhile)
                self._let_go_of(item)
                continue
            try:
                await self._process_safely(item)
            finally:
                self._in_flight.pop(item.guid, None)

    def _place(self, item: QueueItem) -> bool:
        """Hand `item` to its issue's lane; or, about no issue (an office's config pushed),
        to a lane of its own that runs once its office's lanes before it end, its office's
        later deliveries waiting until it has run, other offices' running on beside it.
        False for one that runs alone after everything (see `_start`)."""
        key = issue_key(item)
        if key is not None and key in self._held_back:  # its issue was cut short: not
            self._let_go_of(item)  # run past the retry
            return True
        office = None if item.takeovers else queue.office_of(item.payload, key)
        if office is None:
            return False
        if (waiting := self._waiting.get(office)) is not None:
            waiting.append(item)  # behind its office's delivery about no issue, in order
            return True
        if key is None:
            self._waiting[office] = deque()
            before = [lane.task for k, lane in self._lanes.items()
                      if queue.office_of_key(k) == office]
            alone = self._lanes[_OFFICE + office] = _Lane(deque([item]))
            alone.task = asyncio.create_task(self._run_for_office(office, alone, before))
        elif (lane := self._lanes.get(key)) is not None:
            lane.items.append(item)
        else:
            lane = self._lanes[key] = _Lane(deque([item]))
            lane.task = asyncio.create_task(self._run_lane(key, lane))
        return True

    async def _run_for_office(self, office: str, lane: _Lane,
                              before: list[asyncio.Task[None]]) -> None:
        """Once the lanes of `office` before it end, run its delivery about no issue; then
        place what of its office waited for it (a retry of it holds nothing after it, as
        such a delivery never did)."""
        cancelled = False
        try:
            if before:
                await asyncio.wait(before)
            async with self._gate:
                item = lane.items.popleft()
                try:
                    await self._process_safely(item)
                finally:
                    self._in_flight.pop(item.guid, None)
        except asyncio.CancelledError:  # (stopping: what waited stays pending)
            cancelled = True
            raise
        finally:
            del self._lanes[_OFFICE + office]
            waiting = self._waiting.pop(office)
            if not cancelled:
                for later in waiting:
                    self._place(later)
            self._wake.set()

    def _let_go_of(self, item: QueueItem) -> None:
        """Claimed, not to be run now: let go of with the next claim."""
        self._in_flight.pop(item.guid, None)
        self._let_go.append(item)

    async def _drain(self) -> None:
        """Until every lane has run out."""
        while self._lanes:
            await asyncio.wait([lane.task for lane in self._lanes.values()])

    async def _run_lane(self, key: str, lane: _Lane) -> None:
        """Run the deliveries about issue `key` one at a time, in order, as they are added;
        after one that waits for a retry, let go of the rest (they wait behind it: the store
        holds them, in order)."""
        try:
            async with self._gate:
                while lane.items:
                    item = lane.items[0]
                    finished = await self._process_safely(item)
                    lane.items.popleft()
                    if finished:
                        self._in_flight.pop(item.guid, None)
                        continue
                    for left in (item, *lane.items):  # (the one that failed is let go of
                        self._let_go_of(left)  # too, if the store was away)
                    lane.items.clear()
                    self._held_back[key] = self._claims
                    waiting = self._waiting.get(queue.office_of_key(key), deque())
                    for later in [i for i in waiting if issue_key(i) == key]:
                        waiting.remove(later)  # (claimed behind its office's delivery
                        self._let_go_of(later)  # about no issue: not run past the retry)
        finally:
            del self._lanes[key]
            self._wake.set()  # room for more

    async def _process_safely(self, item: QueueItem) -> bool:
        """Process one delivery; True when it is finished, False when it waits for a retry
        (then later deliveries about its issue wait too)."""
        try:
            return await self.process(item)
        except Exception:  # the store itself failed: keep the worker alive, retry soon
            log.exception("worker could not record the outcome of a delivery",
                          extra={"delivery_id": item.guid})
            await asyncio.sleep(1.0)
            return False

    async def process(self, item: QueueItem) -> bool:
        action = item.payload.get("action")
        sender = item.payload.get("sender")
        login = sender.get("login") if isinstance(sender, dict) else None
        # its forge writes take the turns of whoever caused it (a handler's scene() names them
        # as the office knows them); reset when the delivery is done. An org-signed one's
        # sender is its org's admins' word until the forge says who (bot.app.org_signed, then
        # scene()): no one's till then, so they spend no one else's share of the budget
        actor = f"forge:{login}" if isinstance(login, str) and not org_signed(item.guid) \
            else None
        context = delivery_context(delivery_id=item.guid, installation_id=item.installation_id,
                                   event=item.event,
                                   action=action if isinstance(action, str) else None)
        with context, acting_for(actor), waiting_at_most(self.wait_at_most):
            return await self._process(item, bound(log))

    async def _process(self, item: QueueItem,
                       logger: logging.LoggerAdapter[logging.Logger]) -> bool:
        """Handle one delivery; True when it is finished (done, ignored, parked or dead), False
        when it waits for a retry. Whatever fails, a malformed payload included, fails this
        delivery alone and counts an attempt."""
        started = time.perf_counter()
        try:
            own, router, event = self._routed(item)
            if not router.fetch(event):  # ping, meta, events no handler wants, the app's own
                await self._finish(item, "ignored")
                metrics.deliveries(item.event, "ignored").inc()
                if own:
                    logger.debug("ignored: caused by the app itself")
                return True
            try:
                ctx = self.make_context(item, logger)
            except LookupError as exc:  # no installation to act through: nothing can be done
                await self._fail(item, repr(exc), None)
                metrics.deliveries(item.event, "dead").inc()
                logger.error("dead letter: %s", exc)
                return True
            if org_signed(item.guid):  # an org's admins' word: as the forge has it, or not
                try:
                    event = await checked_event(ctx, event)
                except NotAsTheForgeSays as exc:
                    await self._finish(item, "ignored")
                    metrics.deliveries(item.event, "ignored").inc()
                    logger.warning("refused: signed by its org, and the forge says "
                                   "otherwise: %s", exc)
                    return True
            first = await self._dispatch_once(item, router, event, ctx)
            if ctx.parked is not None:  # it waits for its issue's mail (see HandlerContext.park)
                # recorded now, not with the next claim: a redelivered `opened` of its issue
                # later in this batch adopts the issue and unparks what is parked by then
                if not await self.store.finish(item, "parked"):
                    _superseded(item)
                metrics.deliveries(item.event, "parked").inc()
                logger.info("parked until its issue is mail: %s", ctx.parked)
                return True
        except PutOff as exc:  # the forge's budget says when: put off, nothing failed
            wait = max(1.0, exc.retry_after if exc.retry_after is not None else 60.0)
            await self._fail(item, repr(exc), time.time() + wait, counted=False)
            metrics.deliveries(item.event, "put_off").inc()
            logger.info("put off %.0f s for the forge's budget (no attempt counted): %s",
                        wait, exc)
            return False
        except Exception as exc:  # a handler failed: retry later, then dead-letter
            attempt = item.attempts + 1
            if attempt >= self.max_attempts:
                await self._fail(item, repr(exc), None)
                metrics.deliveries(item.event, "dead").inc()
                logger.error("dead letter after %d attempts: %r", attempt, exc)
                return True
            metrics.deliveries(item.event, "retried").inc()
            delay = self.base_backoff * 2 ** (attempt - 1) * (0.5 + random.random())
            if isinstance(exc, RateLimited) and exc.retry_after:  # not before the forge says
                delay = max(delay, exc.retry_after)
            await self._fail(item, repr(exc), time.time() + delay)
            logger.warning("handler failed (attempt %d), retry in %.1fs: %r",
                           attempt, delay, exc)
            return False
        if first != item.guid:  # the same forge change, delivered again under a new id
            await self._finish(item, "ignored")
            metrics.deliveries(item.event, "ignored").inc()
            logger.info("ignored: already handled as delivery %s", first)
            return True
        await self._finish(item)
        metrics.handler_seconds(item.event).observe(
            time.perf_counter() - started)
        metrics.deliveries(item.event, "handled").inc()
        logger.info("handled")
        return True

    # A delivery's outcome is recorded only under the claim it ran under: one taken over
    # meanwhile (this replica was taken for dead) is the other replica's to finish.
    async def _finish(self, item: QueueItem, state: str = "done") -> None:
        self._finished.append((item, state))  # recorded with the next claim (see _turn)

    async def _fail(self, item: QueueItem, error: str, retry_at: float | None, *,
                    counted: bool = True) -> None:
        if not await self.store.fail(item, error, retry_at, counted=counted):
            _superseded(item)

    async def _dispatch_once(self, item: QueueItem, router: Router, event: sansio.Event,
                             ctx: HandlerContext) -> str:
        """Run the handlers; for a forge change that can reach the app again under another
        delivery id (Gitea's "Redeliver", a replayed capture), once per change: returns the
        delivery id that handled it."""
        key = queued_change_key(item)
        if key is None:
            await router.dispatch(event, ctx)
            return item.guid

        # what was handled, or begun, under a key this change has no more, as this delivery
        # spells it: releases before keyed it by its repository's name, and by the login its
        # payload names before their renames moved the keys with the office
        lefts = [left for left in dict.fromkeys((named_change_key(item.event, item.payload),
                                                 change_key(item.event, item.payload)))
                 if left is not None and left != key]

        async def handle() -> dict[str, Any]:
            began = None
            for left in lefts:
                there, done = await self.store.left_under("forge", left)
                if done is not None:
                    return done
                if there and began is None:
                    began = left
            if began is not None:  # left unfinished: go on from its try (its markers; looking
                ctx.source, ctx.retry = began, True  # first)
            with resuming() if began is not None else contextlib.nullcontext():
                await router.dispatch(event, ctx)
            if ctx.parked is not None:  # not done: handled again once its issue is mail
                raise _Parked(ctx.parked)
            return {"delivery": item.guid}

        try:
            # claimed with its batch (usually), its result recorded with the delivery's
            # finish: no write transaction of its own
            preclaimed = self._preclaimed.pop(item.guid, None) == ("forge", key)
            # (the keys it looks under first are read with its claim's fence: `peek`)
            done = await self.store.once("forge", key, "", handle, later=self._settling,
                                         preclaimed=preclaimed,
                                         peek=[("forge", left) for left in lefts])
        except _Parked:
            return item.guid
        return str(done["delivery"])


def queued_change_key(item: QueueItem) -> str | None:
    """`change_key` of a queued delivery, within its office under its name now: the office of
    the issue it is queued under (intake's `issue_now`, which follows an org's old login
    within the office that had it, and which a rename moves), so a change delivered before
    its org renamed itself and again after, naming either login, is one key. An org-signed
    delivery keeps the office whose webhook took it (its id's `<org>/`, which a rename moves
    with the office, as it moves the keys): its signer's word follows no rename into another
    office, and its own office's, whatever login the payload names."""
    if org_signed(item.guid):
        office: str | None = item.guid.partition("/")[0]
    else:
        office = None if item.issue_key is None else queue.office_of_key(item.issue_key)
    return change_key(item.event, item.payload, office)


@dataclass
class _Lane:
    """The claimed deliveries about one issue, in order, and the task running them."""

    items: deque[QueueItem]
    task: asyncio.Task[None] = field(init=False)


class _Parked(VaultmailError):
    """Ends a parked delivery's `once` unrecorded, so that it runs again when unparked
    (a refusal-like error: a claim that made no forge write is let go of)."""


def _superseded(item: QueueItem) -> None:
    metrics.deliveries(item.event, "superseded").inc()
    log.warning("outcome not recorded: another replica took the delivery over meanwhile"
                " (this one was taken for dead) and runs it again", extra={
                    "delivery_id": item.guid})
