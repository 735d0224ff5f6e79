"""Write pacing: a minimum interval between writes and a content-creation budget.

GitHub asks integrations to wait at least one second between POST/PATCH/PUT/DELETE requests and
allows at most 80 content-creating requests a minute and 500 an hour (secondary limits).
:class:`WritePacer` spreads a burst over time instead of letting the forge refuse it. It is used
under the installation's write lock, so it needs no lock of its own.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Awaitable, Callable

Sleep = Callable[[float], Awaitable[None]]


class WritePacer:
    def __init__(
        self,
        *,
        min_interval: float = 1.0,
        content_per_minute: int = 80,
        content_per_hour: int = 500,
        slack: float = 1.0,
        monotonic: Callable[[], float] = time.monotonic,
        sleep: Sleep = asyncio.sleep,
    ) -> None:
        self.min_interval = min_interval
        self.content_per_minute = content_per_minute
        self.content_per_hour = content_per_hour
        # the forge counts a creation when it lands, a little after we sent it; waiting `slack`
        # seconds past each window keeps the two counts from disagreeing at the boundary
        self.slack = slack
        self._monotonic = monotonic
        self._sleep = sleep
        self._last_write: float | None = None
        self._content: deque[float] = deque()  # times of content creations within the last hour
        self.waited = 0.0  # total seconds spent waiting (for the request log / benchmarks)

    def delay(self, content: bool) -> float:
        """Seconds to wait before the next write (0 if it may go now)."""
        now = self._monotonic()
        until = now
        if self._last_write is not None and self.min_interval > 0:
            until = max(until, self._last_write + self.min_interval)
        if content:
            while self._content and self._content[0] <= now - 3600.0 - self.slack:
                self._content.popleft()
            if self.content_per_hour > 0 and len(self._content) >= self.content_per_hour:
                until = max(until, self._content[-self.content_per_hour] + 3600.0 + self.slack)
            if self.content_per_minute > 0:
                recent = [t for t in self._content if t > now - 60.0 - self.slack]
                if len(recent) >= self.content_per_minute:
                    until = max(until, recent[-self.content_per_minute] + 60.0 + self.slack)
        return max(0.0, until - now)

    async def wait(self, content: bool = False) -> float:
        """Wait for this write's turn and record it; returns the seconds waited."""
        waited = 0.0
        while (d := self.delay(content)) > 0:
            await self._sleep(d)
            waited += d
        now = self._monotonic()
        self._last_write = now
        if content:
            self._content.append(now)
        self.waited += waited
        return waited


__all__ = ["WritePacer"]
