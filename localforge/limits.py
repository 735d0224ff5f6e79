"""Rate limits as GitHub applies them: a primary hourly budget per token and secondary limits
on content creation (80 a minute, 500 an hour by default), all on the forge clock."""

from __future__ import annotations

import math
from collections import deque
from dataclasses import asdict, dataclass, field
from typing import Any

from .clock import Clock


@dataclass
class Limits:
    primary: int = 5000  # per token (installation, user, app) per hour
    unauthenticated: int = 60  # per hour
    search_per_minute: int = 30
    secondary_per_minute: int = 80  # content-creating requests
    secondary_per_hour: int = 500

    def update(self, values: dict[str, Any]) -> None:
        for key, value in values.items():
            if key not in asdict(self):
                raise KeyError(key)
            setattr(self, key, int(value))

    def as_dict(self) -> dict[str, int]:
        return asdict(self)


@dataclass
class Window:
    limit: int
    reset: float
    used: int = 0

    @property
    def remaining(self) -> int:
        return max(0, self.limit - self.used)


@dataclass
class RateTracker:
    limits: Limits
    clock: Clock
    windows: dict[tuple[str, str], Window] = field(default_factory=dict)
    creations: dict[str, deque[float]] = field(default_factory=dict)

    def window(self, key: str, resource: str = "core") -> Window:
        now = self.clock.now()
        if resource == "search":
            limit, span = self.limits.search_per_minute, 60.0
        elif key == "anonymous":
            limit, span = self.limits.unauthenticated, 3600.0
        else:
            limit, span = self.limits.primary, 3600.0
        w = self.windows.get((key, resource))
        if w is None or now >= w.reset:
            w = Window(limit=limit, reset=float(math.ceil(now + span)))
            self.windows[(key, resource)] = w
        w.limit = limit
        return w

    def spend(self, key: str, resource: str = "core") -> Window:
        w = self.window(key, resource)
        w.used += 1
        return w

    def secondary_retry_after(self, key: str) -> int | None:
        """Seconds to wait before another content creation is allowed, or None if allowed now."""
        now = self.clock.now()
        q = self.creations.setdefault(key, deque())
        while q and q[0] <= now - 3600:
            q.popleft()
        waits: list[float] = []
        in_minute = [t for t in q if t > now - 60]
        if len(in_minute) >= self.limits.secondary_per_minute:
            waits.append(in_minute[len(in_minute) - self.limits.secondary_per_minute] + 60 - now)
        if len(q) >= self.limits.secondary_per_hour:
            waits.append(q[len(q) - self.limits.secondary_per_hour] + 3600 - now)
        if not waits:
            return None
        return max(1, math.ceil(max(waits)))

    def record_creation(self, key: str) -> None:
        self.creations.setdefault(key, deque()).append(self.clock.now())
