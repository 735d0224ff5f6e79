"""The forge's clock: wall time plus an offset tests can move forward.

Installation tokens, rate-limit windows, secondary limits and timestamps on issues, comments and
deliveries all run on this clock. App JWTs are checked against the wall clock (the app mints them
with `time.time()`), so advancing the forge clock never invalidates a freshly minted JWT.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime


class Clock:
    def __init__(self, offset: float = 0.0) -> None:
        self.offset = offset

    def now(self) -> float:
        return time.time() + self.offset

    def advance(self, seconds: float) -> float:
        """Move the clock forward by `seconds`; returns the new now()."""
        self.offset += float(seconds)
        return self.now()


def iso(ts: float) -> str:
    """Epoch seconds as GitHub's ISO 8601 UTC form, e.g. 2011-04-22T13:33:48Z."""
    return datetime.fromtimestamp(int(ts), UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_iso(text: str) -> float:
    """Parse an ISO 8601 timestamp (Z or offset; date-only allowed) to epoch seconds."""
    t = text.strip().replace("Z", "+00:00")
    dt = datetime.fromisoformat(t)
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=UTC)
    return dt.timestamp()
