"""Webhook intake storage: one transaction per delivery against the group commit the app uses,
side by side in one run (2000 enqueues per row, alternating, same process, same disk).

Run: .venv/bin/python -m bench.group_commit
"""

from __future__ import annotations

import asyncio
import tempfile
import time
from pathlib import Path

from bot.store import Store, open_store

N = 2000
PAYLOAD = {"action": "opened", "installation": {"id": 1}}
RAW = b'{"action":"opened","installation":{"id":1}}'


async def one_transaction_each(store: Store, guid: str) -> bool:
    """What intake did before: its own transaction for every delivery."""
    now = time.time()
    async with store.transaction() as db:
        changed = await db.execute(
            "INSERT OR IGNORE INTO deliveries(guid, event, action, installation_id, received_at)"
            " VALUES (?,?,?,?,?)", (guid, "issues", "opened", 1, now))
        if changed == 0:
            return False
        await db.execute(
            "INSERT INTO queue(guid, event, installation_id, payload, next_at, created_at)"
            " VALUES (?,?,?,?,?,?)", (guid, "issues", 1, RAW.decode(), now, now))
    return True


async def run(way: str, in_flight: int) -> tuple[float, float, float]:
    store = await open_store(Path(tempfile.mkdtemp()) / "index.sqlite3")
    latencies: list[float] = []
    gate = asyncio.Semaphore(in_flight)

    async def one(i: int) -> None:
        async with gate:
            started = time.perf_counter()
            if way == "group commit":
                await store.enqueue_delivery(f"d{i}", "issues", PAYLOAD, RAW)
            else:
                await one_transaction_each(store, f"d{i}")
            latencies.append((time.perf_counter() - started) * 1000)

    t0 = time.perf_counter()
    await asyncio.gather(*(one(i) for i in range(N)))
    elapsed = time.perf_counter() - t0
    await store.close()
    latencies.sort()
    return N / elapsed, latencies[len(latencies) // 2], latencies[int(len(latencies) * 0.99)]


async def main() -> None:
    print("command: .venv/bin/python -m bench.group_commit\n")
    print("| way | in flight | enqueues/s | p50 ms | p99 ms |")
    print("|---|---|---|---|---|")
    for in_flight in (1, 10, 50):
        for way in ("one transaction each", "group commit") * 2:
            rate, p50, p99 = await run(way, in_flight)
            print(f"| {way} | {in_flight} | {rate:.0f} | {p50:.2f} | {p99:.2f} |")


if __name__ == "__main__":
    asyncio.run(main())
