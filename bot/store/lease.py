"""Whether the running task still holds its named locks: the fence before a write that only
a holder may make (a forge write under `Store.named_lock`).

A named lock on PostgreSQL is held by sessions the server may end without this replica
hearing of it (its host cut off or frozen past the server's keepalive give-up): then another
replica may take the lock while the holder works on. The store probes a holder's sessions on
a short period and stops the holder when a probe fails or is late; `check` covers what a
probe cannot, a holder that runs on before its probe (a frozen process, woken): a lock whose
last good probe is older than its lease is taken for lost. SQLite's locks are in-process and
cannot be lost: none is listed here."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from contextvars import ContextVar
from typing import Protocol


class NamedLockLost(ConnectionError):
    """A session holding a named lock was cut, or could not be shown alive in time, while its
    holder worked (a killed backend, a database restart, a host cut off or frozen): the holder
    is stopped with this (where it awaits, or at the fence before its next write), as the
    database being away stops any work (retried later); another replica may take the lock."""


class Lease(Protocol):
    key: str

    def held(self) -> bool:
        """Whether the lock is known held now (its sessions shown alive within its lease)."""


# the named locks the running task holds (tasks it starts inside them copy the context)
_held: ContextVar[tuple[Lease, ...]] = ContextVar("vaultmail_named_locks", default=())


@contextlib.contextmanager
def holding(lease: Lease) -> Iterator[None]:
    """The block runs holding `lease`: `check` fences on it."""
    before = _held.get()
    _held.set((*before, lease))
    try:
        yield
    finally:
        _held.set(before)


def check() -> None:
    """Raises NamedLockLost when a named lock the running task holds is not known held now.
    Cheap: no I/O."""
    for lease in _held.get():
        if not lease.held():
            raise NamedLockLost(f"named lock {lease.key!r}: its sessions were not shown alive"
                                " within its lease; another replica may hold it now")


__all__ = ["Lease", "NamedLockLost", "check", "holding"]
