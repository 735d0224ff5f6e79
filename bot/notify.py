"""Wake-ups for long polls: `list_inbox` with `wait` sleeps here until something is new for it.

No busy loop: each waiting call awaits one asyncio.Event per principal; whoever makes something
new for a principal (a comment, a mail, an answer) calls `notify`.
"""

from __future__ import annotations

import asyncio
from collections import defaultdict
from collections.abc import Iterable


class Notifier:
    def __init__(self) -> None:
        self._events: defaultdict[str, asyncio.Event] = defaultdict(asyncio.Event)
        self._waiters: defaultdict[str, int] = defaultdict(int)

    def notify(self, principals: Iterable[str]) -> None:
        for principal in set(principals):
            event = self._events.pop(principal, None)
            if event is not None:
                event.set()  # wakes everyone waiting on this principal, once

    async def wait(self, principal: str, timeout: float) -> bool:
        """True when woken by something new, False on timeout (or cancellation upstream)."""
        event = self._events[principal]
        self._waiters[principal] += 1
        try:
            await asyncio.wait_for(event.wait(), timeout)
            return True
        except TimeoutError:
            return False
        finally:
            self._waiters[principal] -= 1
            if not self._waiters[principal]:
                del self._waiters[principal]
                if self._events.get(principal) is event and not event.is_set():
                    del self._events[principal]

    async def wait_any(self, principals: Iterable[str], timeout: float) -> bool:
        """Like `wait`, woken by something new for any of `principals`."""
        waits = [asyncio.ensure_future(self.wait(p, timeout)) for p in set(principals)]
        try:
            done, _ = await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
            return any(task.result() for task in done)
        finally:
            for task in waits:
                task.cancel()
            await asyncio.gather(*waits, return_exceptions=True)

    def waiting(self) -> int:
        return sum(self._waiters.values())
