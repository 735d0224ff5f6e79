"""Long polls held per API token: at most `per_token` at once, the excess refused at once.

A long poll (`list_inbox` or `agent_chat` with `wait`) holds a request open for up to 50 s. One
client opening hundreds would hold them all; so each token may hold `PER_TOKEN` at a time, and
one more is answered at once with 429 `too_many_long_polls`, naming the cap.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
from collections import Counter
from collections.abc import Iterator

from bot.errors import TooManyRequests

PER_TOKEN = 4  # long polls one API token may hold at once


def token_key(token: str) -> str:
    """What identifies a token here (never the token itself)."""
    return hashlib.sha256(token.encode()).hexdigest()[:32]


def is_long_poll(raw: object) -> bool:
    """A call with a positive `wait` may sleep (an invalid one is refused by validation)."""
    wait = raw.get("wait") if isinstance(raw, dict) else None
    if isinstance(wait, bool) or not isinstance(wait, int | float | str):
        return False
    try:
        return float(wait) > 0  # validation takes "5" as 5
    except ValueError:
        return False


class LongPolls:
    def __init__(self, per_token: int = PER_TOKEN) -> None:
        self.per_token = per_token
        self._held: Counter[str] = Counter()
        self._watchers: list[tuple[str, int, asyncio.Future[None]]] = []

    def held(self, key: str) -> int:
        return self._held[key]

    async def until_held(self, key: str, n: int) -> None:
        """Return once `key` holds at least `n` long polls (tests meet here, not in a sleep)."""
        if self._held[key] >= n:
            return
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._watchers.append((key, n, future))
        await future

    def _wake(self) -> None:
        keep = []
        for key, n, future in self._watchers:
            if not future.done() and self._held[key] >= n:
                future.set_result(None)
            elif not future.done():
                keep.append((key, n, future))
        self._watchers = keep

    @contextlib.contextmanager
    def hold(self, key: str | None, tool: str, raw: object) -> Iterator[None]:
        """Count this call against its token while it runs, if it is a long poll."""
        if key is None or not is_long_poll(raw):
            yield
            return
        if self._held[key] >= self.per_token:
            raise TooManyRequests(
                f"{tool}: this API token already holds {self._held[key]} long polls (`wait`), "
                f"the most one token may hold at once is {self.per_token}; wait for one to "
                "return, or call without `wait`")
        self._held[key] += 1
        self._wake()
        try:
            yield
        finally:
            self._held[key] -= 1
            if self._held[key] <= 0:
                del self._held[key]
