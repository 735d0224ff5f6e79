"""Wake-ups for long polls: `list_inbox` with `wait` sleeps here until something is new for it.

No busy loop and no task per waiter: each waiting call owns one asyncio.Event, registered under
every principal it waits for; whoever makes something new for a principal (a comment, a mail,
an answer) calls `notify`, which sets the events registered under it.
"""

from __future__ import annotations

import asyncio
from collections import defaultdict
from collections.abc import Iterable


class Notifier:
    def __init__(self) -> None:
        self._waiting: defaultdict[str, set[asyncio.Event]] = defaultdict(set)

    def notify(self, principals: Iterable[str]) -> None:
        for principal in set(principals):
            for event in self._waiting.pop(principal, ()):
                event.set()

    async def wait(self, principal: str, timeout: float) -> bool:
        """True when woken by something new, False on timeout (or cancellation upstream)."""
        return await self.wait_any([principal], timeout)

    async def wait_any(self, principals: Iterable[str], timeout: float) -> bool:
        """Like `wait`, woken by something new for any of `principals`."""
        event = asyncio.Event()
        keys = set(principals)
        for key in keys:
            self._waiting[key].add(event)
        try:
            async with asyncio.timeout(timeout):  # no extra task, unlike wait_for
                await event.wait()
            return True
        except TimeoutError:
            return False
        finally:
            for key in keys:
                waiting = self._waiting.get(key)
                if waiting is not None:
                    waiting.discard(event)
                    if not waiting:
                        del self._waiting[key]

    def waiting(self) -> int:
        """How many principal registrations are waiting (a wait on two counts twice)."""
        return sum(len(events) for events in self._waiting.values())
