"""The outbound webhook cursors (`bot.app.outbound`): per URL, the last ledger seq it
acknowledged and its backoff."""

from __future__ import annotations

from bot.store.db import Row, Store, register_schema

register_schema("""
CREATE TABLE IF NOT EXISTS outbound_cursors (
    url TEXT PRIMARY KEY,
    seq INTEGER NOT NULL DEFAULT 0,
    failures INTEGER NOT NULL DEFAULT 0,
    next_at REAL NOT NULL DEFAULT 0,
    last_error TEXT
);
""")


async def get_cursor(store: Store, url: str) -> Row | None:
    """The cursor row of `url`, or None before its first save."""
    return await store.fetchone("SELECT * FROM outbound_cursors WHERE url=?", (url,))


async def save_cursor(store: Store, url: str, seq: int, failures: int, next_at: float,
                      error: str | None) -> None:
    """Write the cursor of `url` (insert or update)."""
    async with store.transaction() as db:
        await db.execute(
            "INSERT INTO outbound_cursors(url, seq, failures, next_at, last_error)"
            " VALUES (?,?,?,?,?) ON CONFLICT(url) DO UPDATE SET seq=excluded.seq,"
            " failures=excluded.failures, next_at=excluded.next_at,"
            " last_error=excluded.last_error",
            (url, seq, failures, next_at, error))
