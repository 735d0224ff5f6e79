"""The store's query layer on its hot path, against SQLAlchemy Core and the layer it replaced
(issue 22, "Each engine written for itself"). Run by hand:

    git worktree add /tmp/qlbefore <the commit before>   # the old translator and adapter
    .venv/bin/python -m bench.query_layer [--events 2000] [--rounds 3] [--before /tmp/qlbefore]

One event is the hot path's statements in the transactions the store makes them in, each
engine's own text: a queue claim (the next pending id, the claim's UPDATE ... RETURNING), an
idempotency claim (read the key, insert it), the mail and its ledger entry (the recipient's and
the chain's keys held, the mail's upsert, the chain's head, the entry's INSERT ... RETURNING),
then the idempotency result and the queue's finish. Events run one after another on one
connection's worth of work, so what differs between the columns is the layer, not the
database: (a) this store's layer (`Connection.fetchone/execute/insert`), (b) SQLAlchemy Core
2.x `text()` on its aiosqlite and asyncpg drivers, (c) the tree before (aiosqlite's cursors,
PostgreSQL through the regex translator and the aiosqlite-shaped adapter), run from a checkout
of it. Each cell runs in a process of its own, alternating layers round by round; the table
gives the median round. Prints a markdown table and the command that made it.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
LAYERS = {"new": "this store's layer", "sqlalchemy": "SQLAlchemy Core", "old": "the tree before"}
# statements an event (BEGIN, COMMIT and the store's own first statement of a transaction
# aside): PostgreSQL's three more are the keys held (an idempotency key, a mailbox, a chain)
STATEMENTS = {"sqlite": 9, "postgresql": 12}

# SQLite's dialect (what the tree before wrote, and what SQLite runs); PostgreSQL's, where
# the two differ, beside it
NEXT = ("SELECT MIN(id) AS id FROM queue INDEXED BY queue_claim_office WHERE state='pending'"
        " AND id>=?", "SELECT MIN(id) AS id FROM queue WHERE state='pending' AND id>=?")
CLAIM = ("UPDATE queue SET lease_owner=?, lease_seq=lease_seq+1 WHERE id=? AND state='pending'"
         " RETURNING id, guid, payload, lease_seq",)
IDEM_READ = ("SELECT fingerprint, result, owner, attempts FROM idempotency WHERE scope=?"
             " AND key=?",)
IDEM_CLAIM = ("INSERT INTO idempotency(scope, key, fingerprint, claimed_at, owner)"
              " VALUES (?,?,?,?,?)",)
HOLD = ("SELECT pg_advisory_xact_lock(hashtextextended(?, 0))",)  # PostgreSQL only
MAIL = ("INSERT INTO mails(mail_id, vault, number, subject, body, from_principal, to_principal,"
        " sent, hops, in_reply_to, thread_id, key_id, body_sha256, state, tampered,"
        " other_labels, agent_turns, org, updated_at) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,"
        "?,?,vm_now()) ON CONFLICT(mail_id) DO UPDATE SET state=excluded.state,"
        " updated_at=vm_now()",)
HEAD = ("SELECT hash FROM ledger WHERE chain=? ORDER BY seq DESC LIMIT 1",)
ENTRY = ("INSERT INTO ledger(time, event, actor, subject, data, prev_hash, hash, org, chain)"
         " VALUES (?,?,?,?,?,?,?,?,?)",)
RESULT = ("UPDATE idempotency SET result=?, done_at=? WHERE scope=? AND key=? AND owner=?"
          " AND result IS NULL",)
FINISH = ("UPDATE queue SET state='done', finished_at=?, lease_owner=NULL WHERE id=?"
          " AND state='pending' AND lease_owner=? AND lease_seq=?",)


def _text(stmt: tuple[str, ...], postgres: bool) -> str:
    return stmt[-1] if postgres else stmt[0]


class Layer:
    """One way of sending the statements, inside transactions."""

    postgres: bool

    def transaction(self) -> Any: ...
    async def one(self, db: Any, stmt: tuple[str, ...], params: tuple[Any, ...]) -> Any: ...
    async def run(self, db: Any, stmt: tuple[str, ...], params: tuple[Any, ...]) -> int: ...
    async def insert(self, db: Any, stmt: tuple[str, ...], params: tuple[Any, ...],
                     column: str) -> int: ...
    async def close(self) -> None: ...


class New(Layer):
    """This tree's layer: `Connection.fetchone`, `execute`, `insert`, a `Sql` per engine."""

    def __init__(self, store: Any) -> None:
        from bot.store.sql import Sql
        self.store, self.postgres, self._sql = store, store.engine == "postgresql", Sql

    def _stmt(self, stmt: tuple[str, ...]) -> Any:
        return self._sql(stmt[0], stmt[-1]) if len(stmt) > 1 else stmt[0]

    def transaction(self) -> Any:
        return self.store.transaction()

    async def one(self, db: Any, stmt: tuple[str, ...], params: tuple[Any, ...]) -> Any:
        return await db.fetchone(self._stmt(stmt), params)

    async def run(self, db: Any, stmt: tuple[str, ...], params: tuple[Any, ...]) -> int:
        return int(await db.execute(self._stmt(stmt), params))

    async def insert(self, db: Any, stmt: tuple[str, ...], params: tuple[Any, ...],
                     column: str) -> int:
        return int(await db.insert(stmt[0] + f" RETURNING {column}", params))

    async def close(self) -> None:
        await self.store.close()


class Old(Layer):
    """The tree before: aiosqlite's connection and cursors on SQLite; on PostgreSQL its
    adapter, which translates SQLite's dialect and appends RETURNING for `lastrowid`."""

    def __init__(self, store: Any) -> None:
        self.store, self.postgres = store, store.engine == "postgresql"

    def transaction(self) -> Any:
        return self.store.transaction()

    async def one(self, db: Any, stmt: tuple[str, ...], params: tuple[Any, ...]) -> Any:
        async with db.execute(stmt[0], params) as cur:
            return await cur.fetchone()

    async def run(self, db: Any, stmt: tuple[str, ...], params: tuple[Any, ...]) -> int:
        cur = await db.execute(stmt[0], params)
        return int(cur.rowcount)

    async def insert(self, db: Any, stmt: tuple[str, ...], params: tuple[Any, ...],
                     column: str) -> int:
        cur = await db.execute(stmt[0], params)
        return int(cur.lastrowid or 0)

    async def close(self) -> None:
        await self.store.close()


class Alchemy(Layer):
    """SQLAlchemy Core 2.x: `text()` statements (compiled once, kept), named parameters, on
    the aiosqlite or asyncpg driver; a transaction is `engine.begin()` (SQLite: BEGIN
    IMMEDIATE, as the store's, one writer)."""

    def __init__(self, url: str) -> None:
        from sqlalchemy import event
        from sqlalchemy.ext.asyncio import create_async_engine
        self.postgres = url.startswith("postgres")
        if self.postgres:
            self.engine = create_async_engine(url.replace("postgresql://",
                                                          "postgresql+asyncpg://"))
        else:
            self.engine = create_async_engine(f"sqlite+aiosqlite:///{url}")
            sync = self.engine.sync_engine

            @event.listens_for(sync, "connect")
            def _connect(dbapi: Any, _record: Any) -> None:
                dbapi.isolation_level = None  # SQLAlchemy says BEGIN, not the driver
                dbapi.create_function("vm_now", 0, time.time)
                cursor = dbapi.cursor()  # as the store's connection: WAL, commits not synced
                cursor.execute("PRAGMA synchronous=NORMAL")
                cursor.execute("PRAGMA foreign_keys=ON")
                cursor.close()

            @event.listens_for(sync, "begin")
            def _begin(conn: Any) -> None:
                conn.exec_driver_sql("BEGIN IMMEDIATE")
        self._texts: dict[tuple[str, ...], Any] = {}

    def _stmt(self, stmt: tuple[str, ...]) -> Any:
        known = self._texts.get(stmt)
        if known is None:
            from sqlalchemy import text
            raw, n, out = _text(stmt, self.postgres), 0, []
            for ch in raw:  # `?` -> :p1, :p2 (no quoted `?` in these statements)
                if ch == "?":
                    n += 1
                    out.append(f":p{n}")
                else:
                    out.append(ch)
            known = self._texts[stmt] = text("".join(out))
        return known

    @staticmethod
    def _params(params: tuple[Any, ...]) -> dict[str, Any]:
        return {f"p{i}": v for i, v in enumerate(params, 1)}

    def transaction(self) -> Any:
        return self.engine.begin()

    async def one(self, db: Any, stmt: tuple[str, ...], params: tuple[Any, ...]) -> Any:
        return (await db.execute(self._stmt(stmt), self._params(params))).first()

    async def run(self, db: Any, stmt: tuple[str, ...], params: tuple[Any, ...]) -> int:
        return int((await db.execute(self._stmt(stmt), self._params(params))).rowcount)

    async def insert(self, db: Any, stmt: tuple[str, ...], params: tuple[Any, ...],
                     column: str) -> int:
        result = await db.execute(self._stmt((stmt[0] + f" RETURNING {column}",)),
                                  self._params(params))
        return int(result.scalar_one())

    async def close(self) -> None:
        await self.engine.dispose()


async def _seed(url: str, events: int) -> None:
    """The queue's pending rows the events claim (written through asyncpg or sqlite3: not
    part of what is measured)."""
    now = time.time()
    rows = [(f"g{i}", "issues", 1, f"acme/x#{i % 50}", "{}", "pending", now, now)
            for i in range(events)]
    sql = ("INSERT INTO queue(guid, event, installation_id, issue_key, payload, state,"
           " next_at, created_at) VALUES (?,?,?,?,?,?,?,?)")
    if url.startswith("postgres"):
        import asyncpg
        conn = await asyncpg.connect(url)
        try:
            await conn.executemany(sql.replace("?", "${}").format(*range(1, 9)), rows)
        finally:
            await conn.close()
    else:
        import sqlite3
        conn = sqlite3.connect(url)
        with conn:
            conn.executemany(sql, rows)
        conn.close()


async def _event(layer: Layer, n: int, me: str, start: int) -> int:
    """One delivery's hot path; returns where the next claim looks from."""
    pg = layer.postgres
    scope, key = "tool:mail_send:agent:a", f"k{n}"
    async with layer.transaction() as db:  # the claim
        row = await layer.one(db, NEXT, (start,))
        ident = int(row[0])
        claimed = await layer.one(db, CLAIM, (me, ident))
        lease = int(claimed[3])
    async with layer.transaction() as db:  # the idempotency claim
        if pg:
            await layer.one(db, HOLD, (f"idem:{scope}:{key}",))
        if await layer.one(db, IDEM_READ, (scope, key)) is None:
            await layer.run(db, IDEM_CLAIM, (scope, key, "fp", time.time(), me))
    async with layer.transaction() as db:  # the mail and its ledger entry
        if pg:
            await layer.one(db, HOLD, ("mailbox:acme/agent:scout",))
            await layer.one(db, HOLD, ("ledger:acme",))
        await layer.run(db, MAIL, (
            f"m{n}", "acme/scout-vault", n, "Hello", "body", "agent:a", "agent:scout",
            "2026-01-01T00:00:00Z", 0, None, f"m{n}", "k", "h", "mail:new", 0, "[]", 0, "acme"))
        head = await layer.one(db, HEAD, ("acme",))
        prev = head[0] if head else "0" * 64
        data = json.dumps({"mail_id": f"m{n}"})
        await layer.insert(db, ENTRY, (time.time(), "mail.sent", "agent:a", f"acme/x#{n}", data,
                                       prev, f"{n:064x}", "acme", "acme"), "seq")
    async with layer.transaction() as db:  # the result and the finish
        await layer.run(db, RESULT, ('{"ok":true}', time.time(), scope, key, me))
        await layer.run(db, FINISH, (time.time(), ident, me, lease))
    return ident + 1


async def one_cell(layer_name: str, url: str, events: int) -> dict[str, float]:
    """In this process: migrate, seed, then run `events` events through `layer_name`."""
    import bot.store
    from bot.store import open_store
    print(f"# {layer_name}: {bot.store.__file__}", file=sys.stderr)
    store = await open_store(url)
    await _seed(url, events)
    layer: Layer
    if layer_name == "sqlalchemy":
        await store.close()
        layer = Alchemy(url)
    else:
        layer = New(store) if layer_name == "new" else Old(store)
    me = "bench-replica"
    try:
        for n in range(min(50, events // 10)):  # warm: statements prepared, caches filled
            await _event(layer, n, me, 0)
        start, warm = 0, min(50, events // 10)
        began, cpu = time.perf_counter(), time.process_time()
        for n in range(warm, events):
            start = await _event(layer, n, me, start)
        wall, cpu = time.perf_counter() - began, time.process_time() - cpu
    finally:
        await layer.close()
    done = events - warm
    per_event = STATEMENTS["postgresql" if layer.postgres else "sqlite"]
    return {"events_s": done / wall, "us_statement": wall / (done * per_event) * 1e6,
            "cpu_us_statement": cpu / (done * per_event) * 1e6}


def _spawn(layer: str, url: str, events: int, before: Path) -> dict[str, float]:
    root = before if layer == "old" else REPO
    env = {**os.environ, "PYTHONPATH": str(root)}
    out = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--cell", layer,
                          "--url", url, "--events", str(events)],
                         cwd=root, env=env, check=True, capture_output=True, text=True)
    figures: dict[str, float] = json.loads(out.stdout.strip().splitlines()[-1])
    return figures


async def _database(engine: str, tmp: Path, tag: str) -> str:
    if engine == "sqlite":
        return str(tmp / f"{tag}.sqlite3")
    sys.path.insert(0, str(REPO))
    from tests import pg
    return await pg.fresh_database()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--events", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--engines", default="sqlite,postgresql")
    parser.add_argument("--layers", default="new,sqlalchemy,old")
    parser.add_argument("--before", type=Path, default=Path("/tmp/qlbefore"),
                        help="a checkout of the tree before (git worktree add PATH COMMIT)")
    parser.add_argument("--cell", help=argparse.SUPPRESS)
    parser.add_argument("--url", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.cell:
        print(json.dumps(asyncio.run(one_cell(args.cell, args.url, args.events))))
        return
    layers = args.layers.split(",")
    if "old" in layers and not (args.before / "bot" / "store" / "sql.py").exists():
        sys.exit(f"{args.before}: no checkout of the tree before (git worktree add"
                 f" {args.before} <commit>), or leave out --layers old")
    results: dict[tuple[str, str], list[dict[str, float]]] = {}
    tmp = Path(tempfile.mkdtemp(prefix="query-layer-"))
    for engine in args.engines.split(","):
        for r in range(args.rounds):
            order = layers[r % len(layers):] + layers[:r % len(layers)]  # alternate who's first
            for layer in order:
                url = asyncio.run(_database(engine, tmp, f"{layer}{r}"))
                got = _spawn(layer, url, args.events, args.before)
                results.setdefault((engine, layer), []).append(got)
                print(f"# {engine} {layer} round {r + 1}: {got['events_s']:.0f} events/s,"
                      f" {got['us_statement']:.0f} µs a statement", file=sys.stderr)
    print(f"command: .venv/bin/python -m bench.query_layer --events {args.events}"
          f" --rounds {args.rounds} --engines {args.engines} --layers {args.layers}"
          f" --before {args.before}")
    print("\n9 statements an event on SQLite, 12 on PostgreSQL, in 4 transactions, one event at"
          " a time; median of the rounds (range); ratio: the layer's events/s ÷ this store's\n")
    print("| engine | layer | events/s | µs a statement (wall) | CPU µs a statement | ratio |")
    print("|---|---|---|---|---|---|")
    for engine in args.engines.split(","):
        base = statistics.median(c["events_s"] for c in results.get((engine, "new"), [])
                                 ) if (engine, "new") in results else None
        for layer in layers:
            cells = results[(engine, layer)]
            eps = [c["events_s"] for c in cells]
            us = [c["us_statement"] for c in cells]
            cpu = [c["cpu_us_statement"] for c in cells]
            ratio = f"{statistics.median(eps) / base:.2f}" if base else "-"
            print(f"| {engine} | {LAYERS[layer]} | {statistics.median(eps):,.0f}"
                  f" ({min(eps):,.0f}-{max(eps):,.0f}) | {statistics.median(us):.0f}"
                  f" ({min(us):.0f}-{max(us):.0f}) | {statistics.median(cpu):.0f} | {ratio} |")


if __name__ == "__main__":
    main()
