"""Whether the running task may still write under the named locks it holds: the fence before
a write that only a holder may make (a forge write under `Store.named_lock`).

A named lock on PostgreSQL is held by a session the server may end without this replica
hearing of it (its host cut off or frozen past the server's keepalive give-up): the server
lets the lock go, and another replica may take it. Each such session has a lease the server
renews only while the session is alive (bot.store.postgres); `check` passes while the lease
was renewed recently enough, asks the server otherwise (waiting for its answer however long
it takes: a slow database delays the write, never refuses it), and raises NamedLockLost only
once the server says the session is gone. A lock let go is out of the fence: a task started
inside it and outliving it is simply outside the lock. SQLite's locks are in-process and
cannot be lost: none is listed here."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from contextvars import ContextVar
from typing import Protocol


class NamedLockLost(ConnectionError):
    """The server ended a session holding a named lock while its holder worked (a killed
    backend, a database restart, a host cut off or frozen): the holder is stopped with this
    (where it awaits, or at the fence before its next write), as the database being away
    stops any work (retried later); another replica may take the lock."""


class Fence(Protocol):
    async def check(self) -> None:
        """Returns while the lock may be written under (or once it was let go); raises
        NamedLockLost once the server said its session is gone."""


# the named locks the running task holds (tasks it starts inside them copy the context)
_held: ContextVar[tuple[Fence, ...]] = ContextVar("vaultmail_named_locks", default=())


@contextlib.contextmanager
def holding(fence: Fence) -> Iterator[None]:
    """The block runs holding the lock `fence` stands for: `check` fences on it."""
    token = _held.set((*_held.get(), fence))
    try:
        yield
    finally:
        _held.reset(token)


async def check() -> None:
    """Raises NamedLockLost when a named lock the running task holds was lost. No I/O while
    each lock's lease is fresh (renewed in the background)."""
    for fence in _held.get():
        await fence.check()


__all__ = ["Fence", "NamedLockLost", "check", "holding"]
