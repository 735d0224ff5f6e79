"""Wake-ups for long polls: `list_inbox` with `wait` sleeps here until something is new for it.

No busy loop and no task per waiter: each waiting call owns one asyncio.Event, registered under
every key it waits for; whoever makes something new under a key calls `notify`, which sets the
events registered under it. A key is a principal (an agent's mail and chats, a chat's answer)
or an inbox box (`you:<owner>`, `agents:<owner>`: see `bot.items.inbox.wait_keys`), so that a
person's long poll wakes for their own box only, never for their agents'. Keys are an
office's: `notify` and `wait_any` take the org and key under it, so one office's
`agent:scout` never wakes (or cuts short the long poll of) another's.
"""

from __future__ import annotations

import asyncio
import logging
from collections import defaultdict
from collections.abc import Awaitable, Callable, Iterable

from bot import metrics

log = logging.getLogger("vaultmail.notify")


def _scoped(org: str, key: str) -> str:
    return f"{org.lower()}/{key}"


class Notifier:
    def __init__(self) -> None:
        self._waiting: defaultdict[str, set[asyncio.Event]] = defaultdict(set)
        self.closed = False  # shutting down: every wait answers at once with what is there
        # tells the other replicas (bot.app.replica: PostgreSQL's NOTIFY); None when alone
        self.publish: Callable[[list[str]], Awaitable[None]] | None = None
        self._publishing: set[asyncio.Task[None]] = set()

    def close(self) -> None:
        """On SIGTERM: wake every long poll now, and let no new one wait."""
        self.closed = True
        for events in self._waiting.values():
            for event in events:
                event.set()

    def notify(self, principals: Iterable[str], *, org: str) -> None:
        """Something is new under these keys of `org`'s office: wake who waits here and on
        every replica."""
        keys = {_scoped(org, p) for p in principals}
        self.wake(keys)
        if self.publish is not None and keys:
            task = asyncio.get_running_loop().create_task(self._publish(sorted(keys)))
            self._publishing.add(task)
            task.add_done_callback(self._publishing.discard)

    async def _publish(self, keys: list[str]) -> None:
        assert self.publish is not None
        try:
            await self.publish(keys)
        except Exception as exc:  # the other replicas' polls answer at their timeout
            log.warning("wake-up not sent to other replicas: %r", exc)

    def wake(self, principals: Iterable[str]) -> None:
        """Wake who waits here under these keys (what another replica told us, too)."""
        for principal in set(principals):
            for event in self._waiting.pop(principal, ()):
                event.set()

    def wake_everyone(self) -> None:
        """Wake every wait here (wake-ups from other replicas may have been missed: each
        looks again)."""
        self.wake(list(self._waiting))

    async def wait(self, principal: str, timeout: float, *, org: str) -> bool:
        """True when woken by something new, False on timeout (or cancellation upstream)."""
        return await self.wait_any([principal], timeout, org=org)

    async def wait_any(self, principals: Iterable[str], timeout: float, *, org: str) -> bool:
        """Like `wait`, woken by something new for any of `principals` of `org`'s office."""
        if self.closed:
            return False
        event = asyncio.Event()
        keys = {_scoped(org, p) for p in principals}
        for key in keys:
            self._waiting[key].add(event)
        metrics.LONG_POLLS.inc()
        try:
            async with asyncio.timeout(timeout):  # no extra task, unlike wait_for
                await event.wait()
            return not self.closed
        except TimeoutError:
            return False
        finally:
            metrics.LONG_POLLS.dec()
            for key in keys:
                waiting = self._waiting.get(key)
                if waiting is not None:
                    waiting.discard(event)
                    if not waiting:
                        del self._waiting[key]

    def waiting(self) -> int:
        """How many principal registrations are waiting (a wait on two counts twice)."""
        return sum(len(events) for events in self._waiting.values())
