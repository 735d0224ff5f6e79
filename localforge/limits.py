"""Rate limits as GitHub applies them, all on the forge clock: a primary hourly budget per token,
and the secondary limits of GitHub's "Rate limits for the REST API" page, per user or
installation: at most 100 requests in flight, at most 900 points a minute per endpoint (GET,
HEAD, OPTIONS 1 point; POST, PATCH, PUT, DELETE 5), and content creation at most 80 a minute and
500 an hour. A secondary limit set to 0 is off."""

from __future__ import annotations

import math
from collections import Counter, deque
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
    oauth_tokens_per_hour: int = 2000  # POST /login/oauth/access_token, per App
    concurrent_requests: int = 100  # in flight at once, REST and GraphQL together
    endpoint_points_per_minute: int = 900  # per endpoint ("GET /repos/{owner}/{repo}/issues")

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


READ_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})


def points(method: str) -> int:
    """What one request costs on its endpoint's minute budget (GitHub: reads 1, writes 5)."""
    return 1 if method.upper() in READ_METHODS else 5


@dataclass
class RateTracker:
    limits: Limits
    clock: Clock
    windows: dict[tuple[str, str], Window] = field(default_factory=dict)
    creations: dict[str, deque[float]] = field(default_factory=dict)
    hits: dict[str, deque[float]] = field(default_factory=dict)
    in_flight: dict[str, int] = field(default_factory=dict)
    points: dict[tuple[str, str], deque[tuple[float, int]]] = field(default_factory=dict)
    # secondary-limit refusals the forge made (not injected faults), by limit
    refused: Counter[str] = field(default_factory=Counter)

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
        if 0 < self.limits.secondary_per_minute <= len(in_minute):
            waits.append(in_minute[len(in_minute) - self.limits.secondary_per_minute] + 60 - now)
        if 0 < self.limits.secondary_per_hour <= len(q):
            waits.append(q[len(q) - self.limits.secondary_per_hour] + 3600 - now)
        if not waits:
            return None
        return max(1, math.ceil(max(waits)))

    def record_creation(self, key: str) -> None:
        self.creations.setdefault(key, deque()).append(self.clock.now())

    # -- the other secondary limits: requests in flight, points per endpoint ------------------

    def enter(self, key: str) -> bool:
        """Count a request in flight for `key`; False (and not counted) past the limit."""
        limit = self.limits.concurrent_requests
        n = self.in_flight.get(key, 0)
        if 0 < limit <= n:
            self.refused["concurrent_requests"] += 1
            return False
        self.in_flight[key] = n + 1
        return True

    def leave(self, key: str) -> None:
        n = self.in_flight.get(key, 0) - 1
        if n > 0:
            self.in_flight[key] = n
        else:
            self.in_flight.pop(key, None)

    def take_points(self, key: str, method: str, route: str) -> int | None:
        """Spend this request's points on its endpoint: None if within the minute's budget
        (and spent), else the seconds until enough points are free (nothing spent)."""
        budget = self.limits.endpoint_points_per_minute
        if budget <= 0:
            return None
        cost = points(method)
        now = self.clock.now()
        q = self.points.setdefault((key, route), deque())
        while q and q[0][0] <= now - 60:
            q.popleft()
        used = sum(c for _, c in q)
        if used + cost <= budget:
            q.append((now, cost))
            return None
        self.refused["endpoint_points_per_minute"] += 1
        # free enough of the oldest points for this request to fit
        need = used + cost - budget
        for at, c in q:
            need -= c
            if need <= 0:
                return max(1, math.ceil(at + 60 - now))
        return 60

    def take(self, key: str, limit: int, span: float = 3600.0) -> int | None:
        """Count one request against `limit` per `span` seconds for `key` (a sliding window):
        None if it is allowed (and counted), else the seconds until one is."""
        now = self.clock.now()
        q = self.hits.setdefault(key, deque())
        while q and q[0] <= now - span:
            q.popleft()
        if len(q) >= limit:
            return max(1, math.ceil(q[len(q) - limit] + span - now))
        q.append(now)
        return None
