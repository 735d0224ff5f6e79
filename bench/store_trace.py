"""Wall-clock spans of a vaultmail process, wrapped from outside (no product code changed): the
companion to py-spy's stacks for bench.probot_compare, where `vaultmail serve` is its own
process.

With BENCH_TRACE=/tmp/profiles/trace, bench.probot_compare starts `vaultmail serve` with
bench/trace_site on PYTHONPATH; its sitecustomize calls install(), which wraps
- the store's one write lock (`Store.transaction`): per transaction, who asked (the calling
  function), the wait for the lock and the time it was held;
- every hop to aiosqlite's connection thread (`Connection._execute`);
- the webhook handler, the worker's `_process` of one delivery, and each forge request
  (`_Caller._request`: a write includes its wait for the installation's turn, `pacer.turn`;
  `_Caller._attempts`: the request itself)
and appends the spans, as JSON lines of (name, start, end) in wall-clock seconds, to
`BENCH_TRACE.vm.jsonl` every half second. bench.probot_compare writes each cell's window
(first POST to last PATCH) to `BENCH_TRACE.cells.jsonl`; then

Run: .venv/bin/python -m bench.store_trace /tmp/profiles/trace
"""

from __future__ import annotations

import contextvars
import json
import sys
import threading
import time
from collections import defaultdict
from collections.abc import Awaitable, Callable
from typing import Any

WHO: contextvars.ContextVar[str] = contextvars.ContextVar("store_trace_who", default="?")
spans: list[tuple[str, float, float]] = []


def _timed(fn: Callable[..., Awaitable[Any]], name: str | Callable[..., str]
           ) -> Callable[..., Awaitable[Any]]:
    async def wrapper(*args: Any, **kwargs: Any) -> Any:
        t = time.time()
        try:
            return await fn(*args, **kwargs)
        finally:
            spans.append((name(*args, **kwargs) if callable(name) else name, t, time.time()))
    return wrapper


class TracedLock:
    def __init__(self, lock: Any) -> None:
        self.lock = lock
        self.since = 0.0

    async def __aenter__(self) -> None:
        t = time.time()
        await self.lock.acquire()
        self.since = time.time()
        spans.append((f"lock wait: {WHO.get()}", t, self.since))

    async def __aexit__(self, *exc: object) -> None:
        spans.append((f"lock held: {WHO.get()}", self.since, time.time()))
        self.lock.release()

    def locked(self) -> bool:
        return bool(self.lock.locked())


def install(path: str) -> None:
    import aiosqlite.core

    import bot.app.web as web
    import bot.app.worker as worker
    from bot.forge.caller import _Caller
    from bot.store.sqlite import SqliteStore as Store

    setattr(web, "receive_webhook",  # noqa: B010
            _timed(getattr(web, "receive_webhook"), "webhook handler"))  # noqa: B009
    setattr(worker.Worker, "_process",  # noqa: B010
            _timed(worker.Worker._process, "worker: one delivery"))
    setattr(aiosqlite.core.Connection, "_execute",  # noqa: B010
            _timed(aiosqlite.core.Connection._execute, "aiosqlite hop"))
    setattr(_Caller, "_request", _timed(  # noqa: B010
        _Caller._request, lambda self, method, *a, **k: f"forge {method} (turn + request)"))
    setattr(_Caller, "_attempts", _timed(  # noqa: B010
        _Caller._attempts, lambda self, method, *a, **k: f"forge {method} (request)"))
    transaction = Store.transaction

    def traced_transaction(self: Store, *keys: str) -> Any:
        if not isinstance(self._lock, TracedLock):
            self._lock = TracedLock(self._lock)  # type: ignore[assignment]
        WHO.set(_caller(sys._getframe(1)))
        return transaction(self, *keys)

    Store.transaction = traced_transaction  # type: ignore[method-assign]
    run_transaction = Store.run_transaction

    def traced_run(self: Store, body: Any, *keys: str) -> Any:
        if not isinstance(self._lock, TracedLock):
            self._lock = TracedLock(self._lock)  # type: ignore[assignment]
        WHO.set(_caller(sys._getframe(1)) + " (one trip)")
        return run_transaction(self, body, *keys)

    Store.run_transaction = traced_run  # type: ignore[method-assign]

    def dump() -> None:
        with open(path, "a") as f:
            while True:
                time.sleep(0.5)
                batch, spans[:] = spans[:], []  # the GIL makes the swap safe enough here
                f.write("".join(json.dumps(s) + "\n" for s in batch))
                f.flush()

    threading.Thread(target=dump, name="store-trace", daemon=True).start()


def _caller(frame: Any) -> str:
    """The function that asked for a transaction, past the store's own helpers."""
    while frame is not None and frame.f_code.co_name in (
            "__aenter__", "helper", "_write", "_run", "transaction", "traced_transaction"):
        frame = frame.f_back
    return str(frame.f_code.co_name) if frame is not None else "?"


def summarise(base: str) -> None:
    with open(f"{base}.cells.jsonl") as f:
        cells = [json.loads(line) for line in f]
    with open(f"{base}.vm.jsonl") as f:
        all_spans = [json.loads(line) for line in f]
    for cell in cells:
        first, last = cell["first"], cell["last"]
        span = last - first
        inside = [(n, max(a, first), min(b, last), b - a) for n, a, b in all_spans
                  if b > first and a < last]
        by: dict[str, list[float]] = defaultdict(list)
        clipped: dict[str, float] = defaultdict(float)
        for n, a, b, d in inside:
            if a >= first and b <= last:
                by[n].append(d)
            clipped[n] += b - a
        print(f"\n{cell['cell']} installations, {cell['events']} events over {span:.2f} s "
              f"({cell['events'] / span:.1f} events/s):")
        print("| span | n | p50 ms | p99 ms | total s in the window | share of the window |")
        print("|---|---:|---:|---:|---:|---:|")
        for n in sorted(clipped, key=lambda k: -clipped[k]):
            d = sorted(by[n])
            p50 = d[len(d) // 2] * 1000 if d else 0.0
            p99 = d[min(len(d) - 1, int(len(d) * 0.99))] * 1000 if d else 0.0
            print(f"| {n} | {len(d)} | {p50:.1f} | {p99:.1f} | {clipped[n]:.2f} | "
                  f"{clipped[n] / span * 100:.0f} % |")
        held = sum(v for k, v in clipped.items() if k.startswith("lock held"))
        print(f"write lock held {held:.2f} s of {span:.2f} s ({held / span * 100:.0f} %)")


if __name__ == "__main__":
    summarise(sys.argv[1])
