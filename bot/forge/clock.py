"""Time sources for the forge client.

Token and JWT lifetimes are reckoned on a :class:`Clock` (wall-clock epoch seconds), so tests can
hand the local forge's clock in and move time with ``forge.clock.advance(...)``.
"""

from __future__ import annotations

import time
from typing import Protocol, runtime_checkable


@runtime_checkable
class Clock(Protocol):
    """Anything with ``now()`` returning epoch seconds (UTC)."""

    def now(self) -> float: ...


class SystemClock:
    """The real wall clock."""

    def now(self) -> float:
        return time.time()


__all__ = ["Clock", "SystemClock"]
