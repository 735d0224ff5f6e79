"""Connection, schema and transactions for the index."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sqlite3
import threading
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from functools import partial
from pathlib import Path
from typing import Any

import aiosqlite

from bot.store.idempotency import SCHEMA as IDEMPOTENCY_SCHEMA
from bot.store.idempotency import IdempotencyMixin
from bot.store.queue import QueueItem, QueueMixin

log = logging.getLogger("vaultmail.store")

# SQLite's own checkpoints run inside whichever commit crosses the WAL's size, on the one
# connection every write waits for, and fsync the database file: a 20-70 ms stall for the
# webhook answers queued behind it (bench.intake). The Checkpointer does them from a
# connection of its own instead; SQLite's remains only as a backstop, at 10x the default.
AUTOCHECKPOINT_PAGES = 1000
CHECKPOINT_EVERY = 0.05  # seconds between background checkpoints while writes come in

SCHEMA = """
CREATE TABLE IF NOT EXISTS deliveries (
    guid TEXT PRIMARY KEY,
    event TEXT NOT NULL,
    action TEXT,
    installation_id INTEGER,
    received_at REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS queue (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    guid TEXT NOT NULL,
    event TEXT NOT NULL,
    installation_id INTEGER,
    issue_key TEXT,                           -- owner/repo#N the delivery is about, if any
    payload TEXT NOT NULL,
    state TEXT NOT NULL DEFAULT 'pending',   -- pending | done | dead | ignored
    attempts INTEGER NOT NULL DEFAULT 0,
    next_at REAL NOT NULL,
    last_error TEXT,
    created_at REAL NOT NULL,
    finished_at REAL
);
CREATE INDEX IF NOT EXISTS queue_due ON queue(state, next_at, id);
"""


class Checkpointer:
    """PASSIVE WAL checkpoints on a second connection, in a thread: they never take the write
    lock, so the app's connection keeps committing while pages are copied and synced."""

    def __init__(self, path: str) -> None:
        self._path = path
        self._conn: sqlite3.Connection | None = None
        self._guard = threading.Lock()  # one checkpoint or close at a time, whichever thread
        self._dirty = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self.checkpoints = 0
        self.checkpointed = asyncio.Event()  # set after each round (tests wait on it)

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name="wal-checkpoint")

    def wrote(self) -> None:
        self._dirty.set()

    async def _run(self) -> None:
        while True:
            await self._dirty.wait()
            self._dirty.clear()
            try:
                await asyncio.to_thread(self._checkpoint)
            except sqlite3.Error as exc:  # busy or locked now: the next round tries again
                log.debug("background checkpoint skipped: %s", exc)
            else:
                self.checkpointed.set()
            await asyncio.sleep(CHECKPOINT_EVERY)

    def _checkpoint(self) -> None:
        with self._guard:
            if self._conn is None:
                self._conn = sqlite3.connect(self._path, timeout=1.0, check_same_thread=False)
            self._conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchall()
            self.checkpoints += 1

    def _close(self) -> None:
        with self._guard:
            if self._conn is not None:
                self._conn.close()
                self._conn = None

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        await asyncio.to_thread(self._close)


class Store(QueueMixin, IdempotencyMixin):
    """One aiosqlite connection; writes go through `transaction()` under one lock."""

    def __init__(self, db: aiosqlite.Connection) -> None:
        self._db = db
        self._lock = asyncio.Lock()
        self._arrivals = []
        self._arrivals_writer = None
        self._finishes = []
        self._finishes_writer = None
        self._handed_over = {}
        self._running = {}
        self._checkpointer: Checkpointer | None = None
        self._reads: list[tuple[str, tuple[Any, ...], bool, asyncio.Future[Any]]] = []
        self._reads_queued = False

    @classmethod
    async def open(cls, path: str | Path) -> Store:
        if str(path) != ":memory:":
            Path(path).parent.mkdir(parents=True, exist_ok=True)
        db = await aiosqlite.connect(str(path))
        db.row_factory = aiosqlite.Row
        await db.execute("PRAGMA journal_mode=WAL")
        await db.execute("PRAGMA synchronous=NORMAL")
        await db.execute("PRAGMA foreign_keys=ON")
        await db.executescript(SCHEMA)
        await db.executescript(IDEMPOTENCY_SCHEMA)
        await db.commit()
        store = cls(db)
        await store._migrate_extra()
        if str(path) != ":memory:":
            await db.execute(f"PRAGMA wal_autocheckpoint={AUTOCHECKPOINT_PAGES}")
            store._checkpointer = Checkpointer(str(path))
            store._checkpointer.start()
        return store

    async def _migrate_extra(self) -> None:
        """Hook for schema parts owned by other modules (index, ledger), and the columns they
        added later, so a data directory from an older version opens as it is."""
        for schema in _EXTRA_SCHEMAS:
            await self._db.executescript(schema)
        for table, columns in _EXTRA_COLUMNS.items():
            async with self._db.execute(f"PRAGMA table_info({table})") as cur:
                have = {row[1] for row in await cur.fetchall()}
            for name, decl in columns.items():
                if name not in have:
                    await self._db.execute(f"ALTER TABLE {table} ADD COLUMN {name} {decl}")
        await self._db.commit()

    async def close(self) -> None:
        if self._checkpointer is not None:
            await self._checkpointer.close()
        await self._db.close()

    async def check_writable(self) -> None:
        """Raises when the index cannot take a write (readiness): takes the write lock, then
        lets it go without changing anything."""
        async with self.transaction() as db:
            await db.execute("SELECT 1")

    @asynccontextmanager
    async def transaction(self) -> AsyncIterator[aiosqlite.Connection]:
        """Serialised write transaction: commit on success, roll back on error."""
        async with self._lock:
            await self._db.execute("BEGIN IMMEDIATE")
            try:
                yield self._db
            except BaseException:
                await self._db.rollback()
                raise
            await self._db.commit()
            if self._checkpointer is not None:
                self._checkpointer.wrote()

    # Reads go to the connection's thread in batches: every read asked for in one turn of the
    # event loop (up to READ_BATCH) is executed, fetched and closed there in one hop, and
    # answered by one wake-up of the loop, instead of the three hops of aiosqlite's cursor
    # each (execute, fetch, close). When a thousand long polls wake at once, each reading its
    # inbox, those hops were most of the event loop's time (bench.inbox, profiled).
    async def fetchall(self, sql: str, params: tuple[Any, ...] = ()) -> list[aiosqlite.Row]:
        rows: list[aiosqlite.Row] = await self._read(sql, params, True)
        return rows

    async def fetchone(self, sql: str, params: tuple[Any, ...] = ()) -> aiosqlite.Row | None:
        row: aiosqlite.Row | None = await self._read(sql, params, False)
        return row

    def _read(self, sql: str, params: tuple[Any, ...], every: bool) -> asyncio.Future[Any]:
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Any] = loop.create_future()
        self._reads.append((sql, params, every, future))
        if not self._reads_queued:
            self._reads_queued = True
            loop.call_soon(self._send_reads)
        return future

    def _send_reads(self) -> None:
        self._reads_queued = False
        while self._reads:
            batch, self._reads = self._reads[:READ_BATCH], self._reads[READ_BATCH:]
            done: asyncio.Future[list[tuple[bool, Any]]] = (
                asyncio.get_running_loop().create_future())
            done.add_done_callback(partial(_answer, batch))
            queries = [(sql, params, every) for sql, params, every, _ in batch]
            if not self._db._running or self._db._connection is None:  # as aiosqlite says
                done.set_exception(ValueError("Connection closed"))
            else:
                self._db._tx.put_nowait((done, partial(_fetch_all, self._db, queries)))

    @staticmethod
    def now() -> float:
        return time.time()


READ_BATCH = 256  # reads in one hop at most: a write queued behind waits for no more


def _fetch_all(db: aiosqlite.Connection,
               queries: list[tuple[str, tuple[Any, ...], bool]]) -> list[tuple[bool, Any]]:
    """In the connection's thread: each query's rows (all, or the first), or its error."""
    out: list[tuple[bool, Any]] = []
    for sql, params, every in queries:
        try:
            cur = db._conn.execute(sql, params)
            try:
                out.append((True, cur.fetchall() if every else cur.fetchone()))
            finally:
                cur.close()
        except Exception as exc:  # noqa: BLE001 - handed to the read that made it
            out.append((False, exc))
    return out


def _answer(batch: list[tuple[str, tuple[Any, ...], bool, asyncio.Future[Any]]],
            done: asyncio.Future[list[tuple[bool, Any]]]) -> None:
    if done.cancelled() or done.exception() is not None:
        exc = None if done.cancelled() else done.exception()
        for *_, future in batch:
            if not future.done():
                future.set_exception(exc or asyncio.CancelledError())
        return
    for (*_, future), (ok, value) in zip(batch, done.result(), strict=True):
        if future.done():  # the reader was cancelled meanwhile
            continue
        if ok:
            future.set_result(value)
        else:
            future.set_exception(value)


_EXTRA_SCHEMAS: list[str] = []
_EXTRA_COLUMNS: dict[str, dict[str, str]] = {}


def register_schema(sql: str) -> None:
    """Let a store module add its tables; applied idempotently at open."""
    _EXTRA_SCHEMAS.append(sql)


def register_columns(table: str, columns: dict[str, str]) -> None:
    """Columns added to a table after its first release: added at open where missing."""
    _EXTRA_COLUMNS.setdefault(table, {}).update(columns)


register_columns("queue", {"issue_key": "TEXT"})

__all__ = ["QueueItem", "Store", "register_schema"]
