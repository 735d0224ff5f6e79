"""Group commit: requests that each need a small write of their own, made together.

A caller hands its request in and waits until the write transaction that makes it has
committed, as it would for a transaction of its own; requests handed in while one such
transaction waits for its turn or commits are made together in the next one, each by the
same statements it would have run alone, one after the other. One write transaction for
several callers instead of one each (the idempotency results, the forge write budget's
places: `bot.store.idempotency`, `bot.store.budget`).
"""

from __future__ import annotations

import asyncio
import contextvars
from collections.abc import Awaitable, Callable
from typing import Generic, TypeVar

T = TypeVar("T")
R = TypeVar("R")


class GroupCommit(Generic[T, R]):
    """`await group(request)`: `request`'s answer, once the transaction that made it (with
    whatever others were waiting) committed. `run(requests)` makes them in one transaction
    and answers each, in order; when it fails, each request fails with its error."""

    def __init__(self, run: Callable[[list[T]], Awaitable[list[R]]]) -> None:
        self._run = run
        self._pending: list[tuple[T, asyncio.Future[R]]] = []
        self._writer: asyncio.Task[None] | None = None
        self.transactions = 0  # committed (tests count them)

    async def __call__(self, request: T) -> R:
        loop = asyncio.get_running_loop()
        done: asyncio.Future[R] = loop.create_future()
        self._pending.append((request, done))
        if self._writer is None:
            # its own context: nothing of the first caller's (a claim it holds, its
            # delivery's log fields) belongs to the others' writes
            self._writer = loop.create_task(self._write(), context=contextvars.Context())
        return await done

    async def _write(self) -> None:
        try:
            while self._pending:
                # a caller that left before its turn came (cancelled: its task is stopping)
                # has nothing made, as it would not have had alone
                batch = [(r, d) for r, d in self._pending if not d.done()]
                self._pending.clear()
                if not batch:
                    continue
                try:
                    answers = await self._run([r for r, _ in batch])
                except BaseException as exc:
                    for _, done in batch:
                        if done.done():
                            continue
                        if isinstance(exc, Exception):
                            done.set_exception(exc)
                        else:
                            done.cancel()
                    if not isinstance(exc, Exception):
                        raise
                    continue
                self.transactions += 1
                for (_, done), answer in zip(batch, answers, strict=True):
                    if not done.done():
                        done.set_result(answer)
        finally:
            self._writer = None
            for _, done in self._pending:  # (stopped: whoever still waits is told so)
                if not done.done():
                    done.cancel()
            self._pending.clear()
