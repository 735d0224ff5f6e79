"""Where a webhook answer's time goes under bench.intake's load: a wall-clock companion to the
py-spy profile (which shows what the threads do, not what an answer waits for).

Runs bench.intake's levels (default: row 3, `issues.opened` at 50 in flight) with the app's own
functions wrapped from outside (no product code changed), and while the load client posts
records:
- the webhook handler (`receive_webhook`), and within it `enqueue_delivery` (the answer waits
  for its delivery's group commit);
- every write transaction: who asked for it (the calling function), how long it waited for the
  store's one write lock, and how long it held it;
- every hop to aiosqlite's connection thread (`Connection._execute`): put on its queue until
  the loop resumes the caller;
- the event loop's lag (a 1 ms sleep, how late it wakes).

Run: .venv/bin/python -m bench.intake_trace [--levels 3]
"""

from __future__ import annotations

import asyncio
import contextvars
import sys
import time
from collections import defaultdict
from collections.abc import Awaitable, Callable
from typing import Any

import aiosqlite.core

import bench.common as common
import bench.intake as intake
import bot.app.web as web
from bench.common import ms, percentile
from bot.store.db import Store

RECORDING = False
WHO: contextvars.ContextVar[str] = contextvars.ContextVar("who", default="?")
handler: list[float] = []
enqueue: list[float] = []
lock_wait: dict[str, list[float]] = defaultdict(list)
lock_hold: dict[str, list[float]] = defaultdict(list)
held_at: list[tuple[float, float, str]] = []  # (taken, released, who) of every hold
hops: list[float] = []
lags: list[float] = []
stamps: list[float] = []  # when each counted webhook came in
window: list[float] = []  # the recording's start and end


def _timed(fn: Callable[..., Awaitable[Any]], into: list[float]) -> Callable[..., Awaitable[Any]]:
    async def wrapper(*args: Any, **kwargs: Any) -> Any:
        t = time.perf_counter()
        try:
            return await fn(*args, **kwargs)
        finally:
            if RECORDING:
                into.append(time.perf_counter() - t)
                if into is handler:
                    stamps.append(t)
    return wrapper


class TracedLock:
    def __init__(self, lock: asyncio.Lock) -> None:
        self.lock = lock
        self.since = 0.0

    async def __aenter__(self) -> None:
        t = time.perf_counter()
        await self.lock.acquire()
        self.since = time.perf_counter()
        if RECORDING:
            lock_wait[WHO.get()].append(self.since - t)

    async def __aexit__(self, *exc: object) -> None:
        if RECORDING:
            now = time.perf_counter()
            lock_hold[WHO.get()].append(now - self.since)
            held_at.append((self.since, now, WHO.get()))
        self.lock.release()


def _patch() -> None:
    setattr(web, "receive_webhook",  # noqa: B010
            _timed(getattr(web, "receive_webhook"), handler))  # noqa: B009
    setattr(Store, "enqueue_delivery", _timed(Store.enqueue_delivery, enqueue))  # noqa: B010
    setattr(aiosqlite.core.Connection, "_execute",  # noqa: B010
            _timed(aiosqlite.core.Connection._execute, hops))
    transaction = Store.transaction

    def traced_transaction(self: Store) -> Any:
        if not isinstance(self._lock, TracedLock):
            self._lock = TracedLock(self._lock)  # type: ignore[assignment]
        WHO.set(sys._getframe(1).f_code.co_name)
        return transaction(self)

    Store.transaction = traced_transaction  # type: ignore[method-assign]
    run_client = common.run_client

    async def recorded(module: str, spec: dict[str, Any]) -> dict[str, Any]:
        global RECORDING
        RECORDING = True
        window[:] = [time.perf_counter()]
        ticker = asyncio.create_task(_lag())
        try:
            return await run_client(module, spec)
        finally:
            RECORDING = False
            window.append(time.perf_counter())
            ticker.cancel()
            _print(spec)

    setattr(intake, "run_client", recorded)  # noqa: B010


async def _lag() -> None:
    while True:
        t = time.perf_counter()
        await asyncio.sleep(0.001)
        lags.append(time.perf_counter() - t - 0.001)


def _line(name: str, values: list[float]) -> str:
    return (f"| {name} | {len(values)} | {ms(percentile(values, 50))} | "
            f"{ms(percentile(values, 99))} | {ms(max(values, default=0.0))} | "
            f"{sum(values):.2f} |")


def _print(spec: dict[str, Any]) -> None:
    print(f"\n{spec['event']}, {spec['concurrency'] or spec['rate']} "
          f"{'in flight' if spec['concurrency'] else 'a second'}:")
    print("| what | n | p50 ms | p99 ms | max ms | total s |\n|---|---:|---:|---:|---:|---:|")
    print(_line("receive_webhook (the handler)", handler))
    print(_line("… of which enqueue_delivery (group commit)", enqueue))
    for who in sorted(lock_wait, key=lambda w: -sum(lock_hold[w])):
        print(_line(f"write lock wait: {who}", lock_wait[who]))
        print(_line(f"write lock held: {who}", lock_hold[who]))
    print(_line("aiosqlite hop (queue put → caller resumed)", hops))
    print(_line("event loop lag (1 ms sleep, how late)", lags))
    first, last = min(stamps), max(stamps)
    span = last - first
    inside = [(max(a, first), min(b, last), who) for a, b, who in held_at if b > first and a < last]
    held = sum(b - a for a, b, _ in inside)
    worker = sum(b - a for a, b, who in inside if who != "_commit_arrivals")
    print(f"recorded {window[1] - window[0]:.2f} s (the load client's start to its end); "
          f"webhooks came in over {span:.2f} s of it, and in those the write lock was held "
          f"{held:.2f} s ({held / span * 100:.0f} %): by the worker's transactions "
          f"{worker:.2f} s ({worker / span * 100:.0f} %), by intake's group commits "
          f"{held - worker:.2f} s")
    stamps.clear()
    held_at.clear()
    for values in (handler, enqueue, hops, lags, *lock_wait.values(), *lock_hold.values()):
        values.clear()


if __name__ == "__main__":
    _patch()
    chosen = [intake.LEVELS[2]]
    if "--levels" in sys.argv:
        chosen = [intake.LEVELS[int(i) - 1]
                  for i in sys.argv[sys.argv.index("--levels") + 1].split(",")]
    asyncio.run(intake.main(chosen))
