"""One office's backlog against another office's deliveries queued after it: how long the
second office waits, with the worker shared between offices (`Worker._sharing`) and without.

acme queues `--backlog` deliveries (each about an issue of its own, so nothing but the worker's
room orders them); then globex queues `--others`. Each delivery's handler takes `--work`
milliseconds (a forge round trip). The worker (the app's, on SQLite or on PostgreSQL) runs
them all; reported per cell: globex's waits (from its queueing, committed, to its handler's
start), p50 and the longest, when acme's last delivery began, and deliveries handled a second,
sharing on and off side by side in one run (off: the claims as they were before, the oldest
due first whoever's they are).

Run: .venv/bin/python -m bench.office_share [--backlog 2000] [--others 20] [--work 50]
     [--engines sqlite,postgresql] [--rounds 2]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import tempfile
import time
from pathlib import Path

from gidgethub import sansio
from gidgethub.routing import Router

from bench.common import ms, percentile
from bot.app.context import HandlerContext
from bot.app.worker import Worker
from bot.store import open_store
from tests import pg
from tests.test_worker_lanes import context as _context
from tests.test_worker_lanes import office_comment as _comment


async def _cell(engine: str, sharing: bool, backlog: int, others: int,
                work: float) -> dict[str, float]:
    url = await pg.fresh_database(migrated=True) if engine == "postgresql" else ""
    with tempfile.TemporaryDirectory() as tmp:
        store = await open_store(url or Path(tmp) / "index.sqlite3")
        if url:
            await store.join("bench")
        queued: dict[str, float] = {}
        started: dict[str, float] = {}
        router = Router()

        @router.register("issue_comment")
        async def handle(event: sansio.Event, ctx: HandlerContext) -> None:
            started[event.delivery_id] = time.monotonic()
            # (a forge round trip: `work` on average, from half of it to half as much again)
            await asyncio.sleep(work * random.Random(event.delivery_id).uniform(0.5, 1.5))

        worker = Worker(store, router, Router(), lambda payload: False, _context)
        if not sharing:
            worker._sharing = list  # type: ignore[method-assign]  # (the claims before it)

        async def enqueue(org: str, n: int) -> None:
            payload = _comment(org, n)
            guid = f"{org}-{n}"
            await store.enqueue_delivery(guid, "issue_comment", payload,
                                         json.dumps(payload).encode())
            queued[guid] = time.monotonic()  # (committed: what waits now is the worker's)

        try:
            await asyncio.gather(*(enqueue("acme", n) for n in range(1, backlog + 1)))
            began = time.monotonic()
            worker.start()
            await asyncio.gather(*(enqueue("globex", n) for n in range(1, others + 1)))
            await worker.idle(timeout=600)
            ended = time.monotonic()
        finally:
            await worker.stop(drain_timeout=5.0)
            await store.close()
            if url:
                await pg.drop_database(url)
    waits = sorted(started[g] - queued[g] for g in started if g.startswith("globex"))
    return {"globex_p50": percentile(waits, 50), "globex_max": waits[-1],
            "acme_done": max(started[g] for g in started if g.startswith("acme")) - began,
            "per_s": (backlog + others) / (ended - began)}


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backlog", type=int, default=2000)
    parser.add_argument("--others", type=int, default=20)
    parser.add_argument("--work", type=float, default=50.0, help="milliseconds a delivery")
    parser.add_argument("--engines", default="sqlite,postgresql")
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    print(f"$ .venv/bin/python -m bench.office_share --backlog {args.backlog} --others "
          f"{args.others} --work {args.work:g} --engines {args.engines} --rounds {args.rounds}")
    print("| engine | round | sharing | globex wait p50 (ms) | globex wait max (ms) |"
          " acme's last began | handled/s |")
    print("|---|---|---|---|---|---|---|")
    for engine in args.engines.split(","):
        for n in range(1, args.rounds + 1):
            order = (True, False) if n % 2 else (False, True)  # flipped each round
            for sharing in order:
                r = await _cell(engine, sharing, args.backlog, args.others,
                                args.work / 1000.0)
                print(f"| {engine} | {n} | {'on' if sharing else 'off'} | "
                      f"{ms(r['globex_p50'])} | {ms(r['globex_max'])} | "
                      f"{r['acme_done']:.2f} s | {r['per_s']:.0f} |", flush=True)


if __name__ == "__main__":
    asyncio.run(main())
