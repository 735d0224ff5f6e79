"""Write pacing: a minimum interval between writes, a content-creation budget, and fair turns.

GitHub asks integrations to wait at least one second between POST/PATCH/PUT/DELETE requests and
allows at most 80 content-creating requests a minute and 500 an hour (secondary limits).
:class:`WritePacer` spreads a burst over time instead of letting the forge refuse it, and shares
that budget fairly between the principals the writes are made for:

* **turns**: one write at a time per installation, and when several wait, the principal served
  least recently goes next (round-robin), so an agent with a hundred writes queued cannot make a
  person's single write wait behind all of them;
* **shares**: no one principal may take more than ``principal_share`` of the minute's or the
  hour's creations, so a burst from one leaves room for everybody else's next write;
* **endpoint points**: GitHub allows at most 900 points a minute per REST endpoint, a write
  costing 5, so at most 180 writes a minute to one endpoint (`PATCH .../issues/{n}`, whatever
  the issue); a write waits for its endpoint's window (``endpoint_points_per_minute``, 0 off);
* **kinds**: each write waits for its own budgets only, never for a turn: a creation waiting
  for the hour's budget holds no label move, not even one of its own principal's (the turn
  goes to the first of a principal's writes that may go), and the wait is seen
  (:func:`budget_waits`: /readyz's detail and ``vaultmail_forge_budget_wait_seconds``).

The principal a write is made for travels in the :data:`writes_for` context variable: the tool
layer sets it to the caller, the worker to the event's actor (see :func:`acting_for`; for an
org-signed delivery, no one until the forge vouched for its sender: bot.app.worker). Writes
made for no one (the app's own housekeeping) are turned and paced, but have no share cap.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import itertools
import math
import time
import weakref
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any

from .errors import PutOff

Sleep = Callable[[float], Awaitable[None]]

writes_for: ContextVar[str | None] = ContextVar("vaultmail_writes_for", default=None)


@contextlib.contextmanager
def _setting(var: ContextVar[Any], value: Any) -> Iterator[None]:
    token = var.set(value)
    try:
        yield
    finally:
        var.reset(token)


def acting_for(principal: str | None) -> contextlib.AbstractContextManager[None]:
    """Make the forge writes in this block count as `principal`'s (for fair turns and shares)."""
    return _setting(writes_for, principal)


# The longest a forge write made here may wait for budget or a rate limit: beyond it the write
# is not made and PutOff says when it could be (`retry_after`), so that its caller can do
# other work meanwhile. The worker sets it: a delivery of one office waiting an hour for that
# office's budget would hold the batch every other office's deliveries are in; it is put off
# instead (bot.app.worker). None (tools, the CLI): wait, up to ForgeConfig.max_wait.
wait_at_most: ContextVar[float | None] = ContextVar("vaultmail_wait_at_most", default=None)


def waiting_at_most(seconds: float | None) -> contextlib.AbstractContextManager[None]:
    return _setting(wait_at_most, seconds)


def without_wait_limit() -> contextvars.Context:
    """A copy of this context for work that outlives the delivery it starts in (a run's
    dispatch, a fetch shared by every caller): under no delivery's `wait_at_most`."""
    context = contextvars.copy_context()
    context.run(wait_at_most.set, None)
    return context


def too_long(wait: float) -> bool:
    """Whether a wait of `wait` seconds is longer than this context may wait."""
    cap = wait_at_most.get()
    return cap is not None and wait > cap


WRITE_POINTS = 5  # what GitHub counts a POST, PATCH, PUT or DELETE on its endpoint's budget
BUDGET_WAIT = 5.0  # a write waiting longer than this for its budget is told of (/readyz)

# The writes waiting for their place in the forge's budget the replicas share now: (until, on
# time.monotonic), for /readyz's detail and the metric, so an hour's wait is seen; with the
# pacers, whose queued writes wait for this process's own budget (`WritePacer.budget_waits`).
_BUDGET_WAITS: dict[int, float] = {}
_PACERS: weakref.WeakSet[WritePacer] = weakref.WeakSet()


@contextlib.contextmanager
def budget_wait(seconds: float) -> Iterator[None]:
    key = id(asyncio.current_task())
    _BUDGET_WAITS[key] = time.monotonic() + seconds
    try:
        yield
    finally:
        _BUDGET_WAITS.pop(key, None)


def budget_waits() -> tuple[int, float]:
    """How many writes wait for the forge's budget now (the shared one, or a pacer's), and the
    longest wait left (s)."""
    now = time.monotonic()
    count, longest = len(_BUDGET_WAITS), max((u - now for u in _BUDGET_WAITS.values()),
                                             default=0.0)
    for pacer in list(_PACERS):
        n, most = pacer.budget_waits()
        count, longest = count + n, max(longest, most)
    return count, longest


@dataclass
class _Waiter:
    seq: int
    content: bool
    enqueued: float
    granted: asyncio.Future[None] = field(repr=False)
    endpoint: str | None = None


class WritePacer:
    def __init__(
        self,
        *,
        min_interval: float = 1.0,
        content_per_minute: int = 80,
        content_per_hour: int = 500,
        principal_share: float = 0.75,
        endpoint_points_per_minute: int = 0,
        slack: float = 1.0,
        monotonic: Callable[[], float] = time.monotonic,
        sleep: Sleep = asyncio.sleep,
    ) -> None:
        if not 0.0 < principal_share <= 1.0:
            raise ValueError(f"principal_share must be in (0, 1], not {principal_share!r}")
        self.min_interval = min_interval
        self.content_per_minute = content_per_minute
        self.content_per_hour = content_per_hour
        self.principal_share = principal_share
        self.endpoint_points_per_minute = endpoint_points_per_minute
        # the forge counts a creation when it lands, a little after we sent it; waiting `slack`
        # seconds past each window keeps the two counts from disagreeing at the boundary
        self.slack = slack
        self._monotonic = monotonic
        self._sleep = sleep
        self._last_write: float | None = None
        self._content: deque[float] = deque()  # times of content creations within the last hour
        self._mine: dict[str, deque[float]] = {}  # ... and per principal
        self._points: dict[str, deque[float]] = {}  # endpoint -> its writes' times, last minute
        self.waited = 0.0  # total seconds spent waiting (for the request log / benchmarks)
        # turns: who waits, whose write is under way, who was served when
        self._queues: dict[str | None, deque[_Waiter]] = {}
        self._busy = False
        # principal -> number of its last grant, kept while it waits or writes
        self._served: dict[str | None, int] = {}
        self._grants = itertools.count()
        self._seq = itertools.count()
        self._timer: asyncio.Task[None] | None = None
        self._timer_at = math.inf
        self._watchers: list[tuple[int, asyncio.Future[None]]] = []
        _PACERS.add(self)

    # -- the budget --------------------------------------------------------------------------

    def share(self, budget: int) -> int:
        """How many of a window's `budget` creations one principal may take."""
        return max(1, math.floor(budget * self.principal_share))

    def _window_wait(self, times: deque[float], limit: int, span: float, now: float) -> float:
        """The time until fewer than `limit` of `times` fall within the last `span` seconds."""
        # (`times` ascend: fewer than `limit` fall within the window unless the limit-th
        # from the end does; not a pass over the window's every write, per write)
        if limit <= 0 or len(times) < limit or times[-limit] <= now - span - self.slack:
            return now
        return times[-limit] + span + self.slack

    def _expire(self, times: deque[float], now: float) -> None:
        while times and times[0] <= now - 3600.0 - self.slack:
            times.popleft()

    def _endpoint_wait(self, endpoint: str | None, now: float) -> float:
        """When a write to `endpoint` fits its minute's points again."""
        budget = self.endpoint_points_per_minute // WRITE_POINTS
        times = self._points.get(endpoint) if endpoint is not None else None
        if budget <= 0 or times is None:
            return now
        while times and times[0] <= now - 60.0 - self.slack:
            times.popleft()
        if not times:
            del self._points[endpoint]  # type: ignore[arg-type]
            return now
        return self._window_wait(times, budget, 60.0, now)

    def delay(self, content: bool, principal: str | None = None,
              endpoint: str | None = None) -> float:
        """Seconds to wait before the next write (0 if it may go now)."""
        now = self._monotonic()
        until = self._endpoint_wait(endpoint, now)
        if self._last_write is not None and self.min_interval > 0:
            until = max(until, self._last_write + self.min_interval)
        if content:
            self._expire(self._content, now)
            until = max(until,
                        self._window_wait(self._content, self.content_per_hour, 3600.0, now),
                        self._window_wait(self._content, self.content_per_minute, 60.0, now))
            mine = self._mine.get(principal) if principal is not None else None
            if mine is not None:
                self._expire(mine, now)
                if not mine:
                    del self._mine[principal]  # type: ignore[arg-type]
                elif self.principal_share < 1.0:
                    if self.content_per_hour > 0:
                        until = max(until, self._window_wait(
                            mine, self.share(self.content_per_hour), 3600.0, now))
                    if self.content_per_minute > 0:
                        until = max(until, self._window_wait(
                            mine, self.share(self.content_per_minute), 60.0, now))
        return max(0.0, until - now)

    def _record(self, content: bool, principal: str | None,
                endpoint: str | None = None) -> None:
        now = self._monotonic()
        self._last_write = now
        if endpoint is not None and self.endpoint_points_per_minute > 0:
            self._points.setdefault(endpoint, deque()).append(now)
        if content:
            self._content.append(now)
            if principal is not None:
                self._mine.setdefault(principal, deque()).append(now)

    async def wait(self, content: bool = False, principal: str | None = None,
                   endpoint: str | None = None) -> float:
        """Wait until this write may go and record it; returns the seconds waited.

        This paces only; :meth:`turn` also takes the installation's one write slot, fairly."""
        waited = 0.0
        while (d := self.delay(content, principal, endpoint)) > 0:
            await self._sleep(d)
            waited += d
        self._record(content, principal, endpoint)
        self.waited += waited
        return waited

    # -- turns -------------------------------------------------------------------------------

    @contextlib.asynccontextmanager
    async def turn(self, content: bool = False, principal: str | None = None,
                   endpoint: str | None = None) -> AsyncIterator[float]:
        """Hold the write slot for one write (and its retries), given fairly and once pacing
        lets this principal's write (to `endpoint`, "METHOD /path/{template}") go; yields the
        seconds waited for it.

        `principal` defaults to :data:`writes_for`."""
        who = writes_for.get() if principal is None else principal
        waited = await self._acquire(content, who, endpoint)
        try:
            yield waited
        finally:
            self._release(who)

    def waiting(self) -> int:
        """How many writes wait for their turn."""
        return sum(len(q) for q in self._queues.values())

    def budget_waits(self) -> tuple[int, float]:
        """How many queued writes wait for budget (not only for the slot), and the longest
        wait left of them (s)."""
        waits = [self.delay(w.content, p, w.endpoint)
                 for p, queue in list(self._queues.items()) for w in list(queue)]
        waits = [d for d in waits if d > 0]
        return len(waits), max(waits, default=0.0)

    def budget_wait(self) -> float:
        """The longest wait for budget left of a queued write (s)."""
        return self.budget_waits()[1]

    async def until_waiting(self, n: int) -> None:
        """Return once at least `n` writes wait for their turn (benchmarks and tests meet here
        instead of sleeping)."""
        if self.waiting() >= n:
            return
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._watchers.append((n, future))
        await future

    async def _acquire(self, content: bool, principal: str | None,
                       endpoint: str | None = None) -> float:
        now = self._monotonic()
        if too_long(wait := self.delay(content, principal, endpoint)):
            raise PutOff(f"this write's budget allows it in {wait:.0f} s: put off until then",
                         retry_after=wait)
        if not self._busy and not self._queues and wait <= 0:
            self._grant(content, principal, endpoint)
            return 0.0
        waiter = _Waiter(next(self._seq), content, now,
                         asyncio.get_running_loop().create_future(), endpoint)
        self._queues.setdefault(principal, deque()).append(waiter)
        self._served.setdefault(principal, -1)
        self._wake_watchers()
        self._dispatch()
        cap = wait_at_most.get()  # behind others' writes too: in line no longer than that
        timer = None if cap is None else asyncio.get_running_loop().call_later(
            cap, self._put_off, principal, waiter, endpoint, cap)
        try:
            await waiter.granted
        except asyncio.CancelledError:
            granted = waiter.granted
            if not granted.done() or granted.cancelled():
                self._drop(principal, waiter)
                self._dispatch()
            elif granted.exception() is None:
                self._release(principal)  # granted, but its caller went away: pass it on
            # (else put off at that moment: out of the line already)
            raise
        finally:
            if timer is not None:
                timer.cancel()
        waited = max(0.0, self._monotonic() - waiter.enqueued)
        self.waited += waited
        return waited

    def _put_off(self, principal: str | None, waiter: _Waiter, endpoint: str | None,
                 cap: float) -> None:
        """A write in line longer than its context may wait: out of the line, told when."""
        if waiter.granted.done():
            return
        self._drop(principal, waiter)
        wait = max(1.0, self.delay(waiter.content, principal, endpoint))
        waiter.granted.set_exception(PutOff(
            f"in line for the write budget longer than {cap:.0f} s: put off {wait:.0f} s",
            retry_after=wait))
        self._dispatch()

    def _grant(self, content: bool, principal: str | None,
               endpoint: str | None = None) -> None:
        self._busy = True
        self._holder = principal
        self._record(content, principal, endpoint)
        self._served[principal] = next(self._grants)

    def _release(self, principal: str | None) -> None:
        self._busy = False
        if principal not in self._queues:
            self._served.pop(principal, None)
        self._dispatch()

    def _drop(self, principal: str | None, waiter: _Waiter) -> None:
        queue = self._queues.get(principal)
        if queue is not None and waiter in queue:
            queue.remove(waiter)
            if not queue:
                del self._queues[principal]
                if not (self._busy and self._holder == principal):
                    self._served.pop(principal, None)

    def _wake_watchers(self) -> None:
        count = self.waiting()
        keep = []
        for n, future in self._watchers:
            if future.done():
                continue
            if count >= n:
                future.set_result(None)
            else:
                keep.append((n, future))
        self._watchers = keep

    def _dispatch(self) -> None:
        """Give the free slot to the waiting principal served least recently whose next write
        pacing allows now; else wake up when the soonest one may go."""
        if not self._queues and self._timer is not None:
            self._timer.cancel()  # nobody waits for budget any more
            self._timer, self._timer_at = None, math.inf
        if self._busy or not self._queues:
            return
        order = sorted(self._queues, key=lambda p: (self._served.get(p, -1),
                                                    self._queues[p][0].seq))
        soonest = math.inf
        for principal in order:
            queue = self._queues[principal]
            for gone in [w for w in queue if w.granted.done()]:  # cancelled, not yet dropped
                queue.remove(gone)
            if not queue:
                del self._queues[principal]
                continue
            # the principal's first write that its budgets let go now: a creation waiting
            # for the hour's budget holds none of its label moves (each kind its own budget)
            ready = None
            for waiter in queue:
                d = self.delay(waiter.content, principal, waiter.endpoint)
                if d <= 0:
                    ready = waiter
                    break
                soonest = min(soonest, d)
            if ready is None:
                continue
            queue.remove(ready)
            if not queue:
                del self._queues[principal]
            self._grant(ready.content, principal, ready.endpoint)
            ready.granted.set_result(None)
            return
        if soonest < math.inf:
            self._schedule(soonest)

    def _schedule(self, seconds: float) -> None:
        at = self._monotonic() + seconds
        if self._timer is not None and not self._timer.done():
            if self._timer_at <= at:
                return  # already waking up in time
            self._timer.cancel()
        self._timer_at = at
        self._timer = asyncio.ensure_future(self._wake_after(seconds))

    async def _wake_after(self, seconds: float) -> None:
        await self._sleep(seconds)
        self._timer_at = math.inf
        self._timer = None
        self._dispatch()


__all__ = ["WritePacer", "acting_for", "budget_wait", "budget_waits", "too_long", "wait_at_most",
           "waiting_at_most", "without_wait_limit", "writes_for"]
