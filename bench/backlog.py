"""Claiming from a large backlog (issue 29): what one claim costs, and deliveries handled a
second, with 1,000, 10,000 and 100,000 deliveries pending, on SQLite and PostgreSQL; and
webhook intake's p99 while a large backlog drains.

The backlog: `issues` deliveries about N/4 issues of one repository, each issue's deliveries
spread through it (so a claim meets earlier deliveries about the issues it takes), one in ten
about no issue; all due, none claimed, written straight into the queue.

- claim: the store joined as the one replica; `due_items(64)` as the worker calls it, timed,
  then its deliveries finished and as many new ones queued (not timed: the backlog stays at
  N), `--claims` times: median and p99 of one claim.
- handled: a `Worker` with no handler (each delivery is finished as `ignored`: the queue's
  claim and finish alone) drains the backlog of N for at most `--drain` seconds; deliveries
  finished a second.
- intake: the embedded app (SQLite), a load client in its own process POSTing signed
  `issues.opened` (bench.intake's client and payload), 50 in flight, 1,500 deliveries: with an
  empty queue, then while the worker drains a backlog of `--intake-backlog` deliveries about
  issues (no handler takes them: claimed and finished as `ignored`).

Run: .venv/bin/python -m bench.backlog [--sizes 1000,10000,100000] [--engines sqlite,postgresql]
     [--claims 100] [--drain 10] [--intake-backlog 100000] [--no-intake]
     (PostgreSQL: tests/pg.py starts a throwaway cluster from Debian's packages, or set
     VAULTMAIL_TEST_PG=postgresql://USER@HOST:PORT/postgres; skipped when there is neither)
Target (issue 29): one claim costs the same with 1,000 or 100,000 pending.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from gidgethub.routing import Router

from bench.common import ms, percentile, run_client
from bench.intake import WARMUP, _non_vault_payload
from bot.app.embedded import start_embedded
from bot.app.worker import BATCH, Worker
from bot.store import Store, open_store
from tests import pg

FILL_CHUNK = 5000  # rows written a transaction while filling
REPO = "acme/website"


def _backlog_rows(n: int, first: int, issues: int) -> list[tuple[Any, ...]]:
    """n queue rows about `issues` issues: (guid, event, installation_id, issue_key, payload,
    next_at, created_at)."""
    now = time.time()
    rows = []
    for i in range(first, first + n):
        payload: dict[str, Any] = {"action": "bench_backlog", "installation": {"id": 1},
                                   "sender": {"login": "marco"}}
        key = None
        if i % 10 != 9:  # one in ten is about no issue
            number = 1 + (i * 7919) % issues  # an issue's deliveries spread through the queue
            payload["issue"] = {"number": number}
            payload["repository"] = {"full_name": REPO}
            key = f"{REPO}#{number}"
        rows.append((f"backlog-{i}", "issues", 1, key, json.dumps(payload), now - 1, now - 1))
    return rows


async def _fill(store: Store, n: int, first: int = 0, issues: int | None = None) -> None:
    """n deliveries from the `first`-th of a backlog about `issues` issues (n/4)."""
    for start in range(first, first + n, FILL_CHUNK):
        rows = _backlog_rows(min(FILL_CHUNK, first + n - start), start,
                             issues or max(1, n // 4))
        async with store.transaction() as db:
            await db.executemany(
                "INSERT INTO deliveries(guid, event, action, installation_id, received_at)"
                " VALUES (?,?,?,?,?)", [(r[0], r[1], "bench_backlog", r[2], r[6]) for r in rows])
            await db.executemany(
                "INSERT INTO queue(guid, event, installation_id, issue_key, payload, next_at,"
                " created_at) VALUES (?,?,?,?,?,?,?)", rows)


async def _open(engine: str) -> tuple[Store, str]:
    if engine == "sqlite":
        store = await open_store(Path(tempfile.mkdtemp(prefix="bench-backlog-")) / "i.sqlite3")
        await store.join(sole=True)
        return store, ""
    url = await pg.fresh_database()
    store = await open_store(url)
    await store.join("bench-backlog")
    return store, url


async def _claims(store: Store, n: int, count: int, budget: float) -> list[float]:
    """Times of `count` claims (fewer if they take more than `budget` seconds in all), with
    n pending before each: what one took is finished and as many new arrive (not timed)."""
    times: list[float] = []
    started = time.perf_counter()
    arrived = n
    while len(times) < count and (not times or time.perf_counter() - started < budget):
        t = time.perf_counter()
        items = await store.due_items(limit=BATCH[store.engine])
        times.append(time.perf_counter() - t)
        await asyncio.gather(*(store.finish(item, "ignored") for item in items))
        await _fill(store, len(items), arrived, max(1, n // 4))
        arrived += len(items)
    return times


async def _handled(store: Store, seconds: float) -> tuple[int, float]:
    """Deliveries a handler-less worker finishes in at most `seconds` (until the queue is
    empty), and the seconds it took."""
    def no_context(*_: Any) -> Any:
        raise LookupError("no handler runs in this benchmark")

    before = await _count(store, "state='ignored'")
    worker = Worker(store, Router(), Router(), lambda payload: False, no_context)
    start = time.perf_counter()
    worker.start()
    with contextlib.suppress(TimeoutError):
        await worker.idle(timeout=seconds)
    elapsed = time.perf_counter() - start
    await worker.stop(drain_timeout=0.01)  # cut short: what is left stays pending
    return await _count(store, "state='ignored'") - before, elapsed


async def _count(store: Store, where: str) -> int:
    row = await store.fetchone(f"SELECT COUNT(*) AS n FROM queue WHERE {where}")
    return int(row["n"]) if row else 0


async def claim_rows(engines: list[str], sizes: list[int], claims: int, drain: float,
                     budget: float) -> list[list[str]]:
    rows: list[list[str]] = []
    for engine in engines:
        if engine == "postgresql":
            try:
                pg.cluster_url()
            except (RuntimeError, OSError) as exc:
                print(f"PostgreSQL skipped: {exc}", file=sys.stderr)
                continue
        for n in sizes:
            store, url = await _open(engine)
            try:
                t = time.perf_counter()
                await _fill(store, n)
                filled = time.perf_counter() - t
                times = await _claims(store, n, claims, budget)
                handled, elapsed = await _handled(store, drain)  # from n pending still
            finally:
                await store.close()
                if url:
                    await pg.drop_database(url)
            rows.append([engine, f"{n:,}", f"{len(times)}", ms(percentile(times, 50)),
                         ms(percentile(times, 99)), f"{handled:,} in {elapsed:.1f} s",
                         f"{handled / elapsed:,.0f}", f"{filled:.1f}"])
            print("  " + " | ".join(rows[-1]), file=sys.stderr, flush=True)
    return rows


async def intake_rows(backlog: int) -> list[list[str]]:
    embedded = await start_embedded(data_dir=Path(tempfile.mkdtemp(prefix="bench-backlog-")),
                                    port=0, forge_port=0)
    rows: list[list[str]] = []
    try:
        store = embedded.services.store
        issue = await _non_vault_payload(embedded)
        spec = {"urls": [embedded.app_url + "/webhook"],
                "secret": embedded.services.settings.webhook_secret, "event": "issues",
                "payloads": [issue], "concurrency": 50, "rate": None, "count": 1500,
                "warmup": WARMUP}
        for pending in (0, backlog):
            await embedded.settle()
            await embedded.worker.idle(timeout=300)
            if pending:
                await _fill(store, pending)
                embedded.worker.wake()
            done = await _count(store, "state<>'pending'")
            start = time.perf_counter()
            result = await run_client("bench.intake", spec)
            elapsed = time.perf_counter() - start
            handled = await _count(store, "state<>'pending'") - done
            left = await store.pending_count()
            lat: list[float] = result["latencies"]
            bad = {s: n for s, n in result["statuses"].items() if s != "202"}
            rows.append([f"{pending:,}", f"{len(lat)}", ms(percentile(lat, 50)),
                         ms(percentile(lat, 99)), ms(max(lat)),
                         f"{handled / elapsed:,.0f}",
                         f"{left:,}", str(bad or "-")])
            print("  " + " | ".join(rows[-1]), file=sys.stderr, flush=True)
            if pending:  # what is left is not worth draining
                async with store.transaction() as db:
                    await db.execute("UPDATE queue SET state='ignored' WHERE state='pending'")
    finally:
        await embedded.stop()
    return rows


def _table(head: list[str], rows: list[list[str]]) -> None:
    print("| " + " | ".join(head) + " |")
    print("|" + "|".join("---" for _ in head) + "|")
    for row in rows:
        print("| " + " | ".join(row) + " |")


async def main(args: argparse.Namespace) -> None:
    logging.getLogger("vaultmail").setLevel(logging.ERROR)
    sizes = [int(s) for s in args.sizes.split(",")]
    claims = await claim_rows(args.engines.split(","), sizes, args.claims, args.drain,
                              args.claim_budget)
    intake = [] if args.no_intake else await intake_rows(args.intake_backlog)
    print(f"command: .venv/bin/python -m bench.backlog{''.join(f' {a}' for a in sys.argv[1:])}"
          "\n")
    _table(["engine", "pending", "claims", "claim p50 ms", "claim p99 ms",
            "handled (worker, no handler)", "handled/s", "fill s"], claims)
    if intake:
        print()
        _table(["backlog draining", "answers", "intake p50 ms", "intake p99 ms", "max ms",
                "queue handled/s meanwhile", "still pending after", "answers other than 202"],
               intake)
    print(f"\none claim = due_items(limit={BATCH['sqlite']} on SQLite, {BATCH['postgresql']} on "
          "PostgreSQL: the worker's); handled meanwhile: with no backlog, the load's own"
          " deliveries (each reads the office config); with one, the backlog's (no handler)."
          " 2-core machine shared with other work.")


if __name__ == "__main__":
    if "--client" in sys.argv:  # (the load client is bench.intake's)
        raise SystemExit("bench.backlog has no client of its own")
    parser = argparse.ArgumentParser(prog="bench.backlog")
    parser.add_argument("--sizes", default="1000,10000,100000")
    parser.add_argument("--engines", default="sqlite,postgresql")
    parser.add_argument("--claims", type=int, default=100)
    parser.add_argument("--claim-budget", type=float, default=60.0,
                        help="seconds of claims at most per cell (at least one is made)")
    parser.add_argument("--drain", type=float, default=10.0)
    parser.add_argument("--intake-backlog", type=int, default=100_000)
    parser.add_argument("--no-intake", action="store_true")
    asyncio.run(main(parser.parse_args()))
