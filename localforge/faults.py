"""Fault injection: 5xx (before or after the write lands), delays, rate-limit refusals per route,
and dropped, duplicated or reordered webhook deliveries. Driven from Python or
POST /_forge/faults."""

from __future__ import annotations

import asyncio
import random
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

# fail: refuse before the write; after: write, then 502; lost: write and answer as usual, then
# lose the write (the repository's issues and comments as they were before it, with the
# timeline events it recorded; numbers and ids stay used), as a forge whose storage fails
# over to a replica that never had it: an acknowledged write the caller is not told is gone
FaultMode = Literal["fail", "after", "lost"]
FaultKind = Literal["error", "secondary_limit", "primary_limit", "timeout"]


@dataclass
class RouteFault:
    route: str = "*"  # "POST /repos/{owner}/{repo}/issues", "POST *", or "*"
    status: int = 502
    rate: float = 1.0
    count: int | None = None  # None: unlimited
    mode: FaultMode = "fail"
    kind: FaultKind = "error"
    delay: float = 0.0  # seconds before answering (with status 0: only a delay)
    retry_after: int = 60  # the Retry-After of a secondary_limit refusal
    # only requests by this account (its login: a user's, `<slug>[bot]` for an App's
    # installation, the slug for the App's JWT) / on this repository ("owner/name"); None: any
    actor: str | None = None
    repo: str | None = None
    fired: int = 0

    def matches(self, method: str, template: str, actor: str | None = None,
                repo: str | None = None) -> bool:
        if self.actor is not None and (actor or "").lower() != self.actor.lower():
            return False
        if self.repo is not None and (repo or "").lower() != self.repo.lower():
            return False
        if self.route in ("*", ""):
            return True
        want_method, _, want_path = self.route.partition(" ")
        if want_method not in ("*", method):
            return False
        return want_path in ("*", template)


@dataclass
class Hold:
    """Requests to `route` wait at the forge until `release()` (the next `count` of them, or all
    with None): a test holds a write in flight and knows when it is there (`arrived`)."""

    route: str
    count: int | None = 1
    repo: str | None = None  # only requests on this repository ("owner/name"); None: any
    arrived: asyncio.Event = field(default_factory=asyncio.Event)
    released: asyncio.Event = field(default_factory=asyncio.Event)
    caught: int = 0
    _more: asyncio.Event = field(default_factory=asyncio.Event, repr=False)

    def matches(self, method: str, template: str, repo: str | None = None) -> bool:
        return RouteFault(route=self.route, repo=self.repo).matches(
            method, template, repo=repo) and (self.count is None or self.caught < self.count)

    def release(self) -> None:
        self.released.set()

    async def caught_at_least(self, n: int) -> None:
        """Return once `n` requests are held here (a test meets its burst at the forge)."""
        while self.caught < n:
            self._more.clear()
            await self._more.wait()

    def _caught_one(self) -> None:
        self.caught += 1
        self.arrived.set()
        self._more.set()


@dataclass
class WebhookFault:
    rate: float = 0.0
    count: int = 0  # the next N deliveries, then `rate`
    senders: tuple[str, ...] = ()  # only of acts by these logins (lower); empty: any
    redeliveries: bool = True  # False: a redelivery goes through

    def fire(self, rng: random.Random, sender: str | None = None,
             redelivery: bool = False) -> bool:
        if self.senders and (sender or "").lower() not in self.senders:
            return False
        if redelivery and not self.redeliveries:
            return False
        if self.count > 0:
            self.count -= 1
            return True
        return self.rate > 0 and rng.random() < self.rate


@dataclass
class Faults:
    routes: list[RouteFault] = field(default_factory=list)
    holds: list[Hold] = field(default_factory=list)
    drop: WebhookFault = field(default_factory=WebhookFault)
    duplicate: WebhookFault = field(default_factory=WebhookFault)
    # a delivery put back behind those queued after it (once each): webhooks out of order
    reorder: WebhookFault = field(default_factory=WebhookFault)
    rng: random.Random = field(default_factory=random.Random)

    def add(self, route: str = "*", status: int = 502, rate: float = 1.0,
            count: int | None = None, mode: FaultMode = "fail", kind: FaultKind = "error",
            delay: float = 0.0, retry_after: int = 60, actor: str | None = None,
            repo: str | None = None) -> RouteFault:
        fault = RouteFault(route=route, status=status, rate=rate, count=count, mode=mode,
                           kind=kind, delay=delay, retry_after=retry_after, actor=actor,
                           repo=repo)
        self.routes.append(fault)
        return fault

    def delay(self, route: str, seconds: float) -> RouteFault:
        """Answer `route` only after `seconds` (no error)."""
        return self.add(route=route, status=0, delay=seconds)

    def hold(self, route: str, count: int | None = 1, repo: str | None = None) -> Hold:
        """Hold requests to `route` (on `repo`, "owner/name") until the returned hold is
        released."""
        held = Hold(route=route, count=count, repo=repo)
        self.holds.append(held)
        return held

    async def held(self, method: str, template: str, repo: str | None = None) -> None:
        """Where the API applies holds: wait while a hold catches this request (on `repo`,
        "owner/name", where known)."""
        for held in list(self.holds):
            if held.matches(method, template, repo) and not held.released.is_set():
                held._caught_one()
                await held.released.wait()
        self.holds = [h for h in self.holds
                      if not h.released.is_set() and (h.count is None or h.caught < h.count)]

    def drop_webhooks(self, rate: float = 0.0, count: int = 0, senders: tuple[str, ...] = (),
                      redeliveries: bool = True) -> None:
        """Drop deliveries (`senders`: only of what these logins did; `redeliveries`
        False: a redelivery of a dropped one goes through, as a test sends it when it
        chooses)."""
        self.drop = WebhookFault(rate=rate, count=count,
                                 senders=tuple(s.lower() for s in senders),
                                 redeliveries=redeliveries)

    def duplicate_webhooks(self, rate: float = 0.0, count: int = 0) -> None:
        self.duplicate = WebhookFault(rate=rate, count=count)

    def reorder_webhooks(self, rate: float = 0.0, count: int = 0) -> None:
        self.reorder = WebhookFault(rate=rate, count=count)

    def remove(self, fault: RouteFault) -> None:
        """Withdraw a fault (no error if it already ran out and was dropped)."""
        if fault in self.routes:
            self.routes.remove(fault)

    def seed(self, n: int) -> None:
        self.rng.seed(n)

    def clear(self) -> None:
        self.routes.clear()
        for held in self.holds:
            held.release()
        self.holds.clear()
        self.drop = WebhookFault()
        self.duplicate = WebhookFault()
        self.reorder = WebhookFault()

    def pick(self, method: str, template: str, actor: str | None = None,
             repo: str | None = None) -> tuple[float, RouteFault | None]:
        """The total delay to apply and the error fault (if any) firing for this request (by
        `actor`, the authenticated account's login, on `repo`, "owner/name", where known)."""
        delay = 0.0
        chosen: RouteFault | None = None
        for fault in list(self.routes):
            if not fault.matches(method, template, actor, repo):
                continue
            if fault.count is not None and fault.fired >= fault.count:
                continue
            if fault.rate < 1.0 and self.rng.random() >= fault.rate:
                continue
            if fault.status == 0:
                fault.fired += 1
                delay += fault.delay
                continue
            if chosen is None:
                fault.fired += 1
                delay += fault.delay
                chosen = fault
        self.routes = [f for f in self.routes if f.count is None or f.fired < f.count]
        return delay, chosen

    def configure(self, spec: dict[str, Any]) -> None:
        """Apply an HTTP control body (see README of the local forge in docs)."""
        if spec.get("clear"):
            self.clear()
        if "seed" in spec:
            self.seed(int(spec["seed"]))
        if "route" in spec:
            self.add(
                route=str(spec["route"]), status=int(spec.get("status", 502)),
                rate=float(spec.get("rate", 1.0)),
                count=None if spec.get("count") is None else int(spec["count"]),
                mode=spec.get("mode", "fail"), kind=spec.get("kind", "error"),
                delay=float(spec.get("delay", 0.0)),
                retry_after=int(spec.get("retry_after", 60)),
                actor=None if spec.get("actor") is None else str(spec["actor"]),
                repo=None if spec.get("repo") is None else str(spec["repo"]),
            )
        hooks = spec.get("webhooks") or {}
        for name in ("drop", "duplicate", "reorder"):
            if name in hooks:
                cfg = hooks[name] or {}
                setattr(self, name, WebhookFault(rate=float(cfg.get("rate", 0.0)),
                                                 count=int(cfg.get("count", 0))))

    def as_dict(self) -> dict[str, Any]:
        return {
            "routes": [asdict(f) for f in self.routes],
            "webhooks": {"drop": asdict(self.drop), "duplicate": asdict(self.duplicate),
                         "reorder": asdict(self.reorder)},
        }
