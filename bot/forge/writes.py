"""Whether the work in hand has written to the forge yet.

`bot.store.idempotency` frees a caller's key when its work is refused, so the caller can fix
the call and retry with the same key. That is only right while nothing is on the forge: a
refusal after a write (a reply posted, then its copy refused) must keep the key claimed, so
the retry resumes and finds what the first try wrote instead of writing it again. The forge
caller notes every write it sends; `counting()` lets the work's owner ask afterwards.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from contextvars import ContextVar

# a list, not an int: tasks started inside the work copy the context, and must count into it
_made: ContextVar[list[int] | None] = ContextVar("vaultmail_forge_writes", default=None)


def note() -> None:
    """A write (POST, PATCH, PUT, DELETE) is about to be sent to the forge."""
    made = _made.get()
    if made is not None:
        made[0] += 1


@contextlib.contextmanager
def counting() -> Iterator[list[int]]:
    """Count the forge writes made inside the block; read `[0]` of what it yields."""
    made = [0]
    token = _made.set(made)
    try:
        yield made
    finally:
        _made.reset(token)
