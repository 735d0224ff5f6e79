"""Connection, schema and transactions for the index."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import aiosqlite

from bot.store.queue import QueueItem, QueueMixin

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


class Store(QueueMixin):
    """One aiosqlite connection; writes go through `transaction()` under one lock."""

    def __init__(self, db: aiosqlite.Connection) -> None:
        self._db = db
        self._lock = asyncio.Lock()
        self._arrivals = []

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
        await db.commit()
        store = cls(db)
        await store._migrate_extra()
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
        await self._db.close()

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

    async def fetchall(self, sql: str, params: tuple[Any, ...] = ()) -> list[aiosqlite.Row]:
        async with self._db.execute(sql, params) as cur:
            return list(await cur.fetchall())

    async def fetchone(self, sql: str, params: tuple[Any, ...] = ()) -> aiosqlite.Row | None:
        async with self._db.execute(sql, params) as cur:
            row: aiosqlite.Row | None = await cur.fetchone()
            return row

    @staticmethod
    def now() -> float:
        return time.time()


_EXTRA_SCHEMAS: list[str] = []
_EXTRA_COLUMNS: dict[str, dict[str, str]] = {}


def register_schema(sql: str) -> None:
    """Let a store module add its tables; applied idempotently at open."""
    _EXTRA_SCHEMAS.append(sql)


def register_columns(table: str, columns: dict[str, str]) -> None:
    """Columns added to a table after its first release: added at open where missing."""
    _EXTRA_COLUMNS.setdefault(table, {}).update(columns)


__all__ = ["QueueItem", "Store", "register_schema"]
