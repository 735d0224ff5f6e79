"""The durable work queue of webhook deliveries, with dedupe by delivery id and dead letters."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from contextlib import AbstractAsyncContextManager

    import aiosqlite


@dataclass(frozen=True)
class QueueItem:
    id: int
    guid: str
    event: str
    installation_id: int | None
    payload: dict[str, Any]
    attempts: int
    state: str
    last_error: str | None


def _item(row: Any) -> QueueItem:
    return QueueItem(
        id=row["id"],
        guid=row["guid"],
        event=row["event"],
        installation_id=row["installation_id"],
        payload=json.loads(row["payload"]),
        attempts=row["attempts"],
        state=row["state"],
        last_error=row["last_error"],
    )


class QueueMixin:
    """The queue's half of Store (see bot.store.db)."""

    if TYPE_CHECKING:
        def transaction(self) -> AbstractAsyncContextManager[aiosqlite.Connection]: ...
        async def fetchone(self, sql: str,
                           params: tuple[Any, ...] = ()) -> aiosqlite.Row | None: ...
        async def fetchall(self, sql: str,
                           params: tuple[Any, ...] = ()) -> list[aiosqlite.Row]: ...

    async def enqueue_delivery(
        self, guid: str, event: str, payload: dict[str, Any], raw: bytes
    ) -> bool:
        """Record a delivery and queue it; False when this delivery id was seen before."""
        action = payload.get("action") if isinstance(payload, dict) else None
        inst = (payload.get("installation") or {}).get("id") if isinstance(payload, dict) else None
        now = time.time()
        async with self.transaction() as db:
            cur = await db.execute(
                "INSERT OR IGNORE INTO deliveries"
                "(guid, event, action, installation_id, received_at) VALUES (?,?,?,?,?)",
                (guid, event, action, inst, now),
            )
            if cur.rowcount == 0:
                return False
            await db.execute(
                "INSERT INTO queue(guid, event, installation_id, payload, next_at, created_at)"
                " VALUES (?,?,?,?,?,?)",
                (guid, event, inst, raw.decode("utf-8"), now, now),
            )
        return True

    async def next_due(self, now: float | None = None) -> QueueItem | None:
        row = await self.fetchone(
            "SELECT * FROM queue WHERE state='pending' AND next_at<=? ORDER BY id LIMIT 1",
            (time.time() if now is None else now,),
        )
        return _item(row) if row else None

    async def next_wakeup(self) -> float | None:
        row = await self.fetchone("SELECT MIN(next_at) AS t FROM queue WHERE state='pending'")
        return float(row["t"]) if row and row["t"] is not None else None

    async def pending_count(self) -> int:
        row = await self.fetchone("SELECT COUNT(*) AS n FROM queue WHERE state='pending'")
        return int(row["n"]) if row else 0

    async def finish(self, item_id: int, state: str = "done") -> None:
        async with self.transaction() as db:
            await db.execute(
                "UPDATE queue SET state=?, finished_at=? WHERE id=?", (state, time.time(), item_id)
            )

    async def fail(self, item_id: int, error: str, retry_at: float | None) -> None:
        """Count a failed attempt; with no retry time the item becomes a dead letter."""
        state = "pending" if retry_at is not None else "dead"
        async with self.transaction() as db:
            await db.execute(
                "UPDATE queue SET attempts=attempts+1, last_error=?, state=?, next_at=? WHERE id=?",
                (error[:2000], state, retry_at or time.time(), item_id),
            )

    async def dead_letters(self) -> list[QueueItem]:
        rows = await self.fetchall("SELECT * FROM queue WHERE state='dead' ORDER BY id")
        return [_item(r) for r in rows]

    async def replay(self, item_id: int | None = None) -> int:
        """Put dead letters (one, or all) back in the queue; returns how many."""
        where, params = ("state='dead'", ()) if item_id is None else (
            "state='dead' AND id=?", (item_id,))
        async with self.transaction() as db:
            cur = await db.execute(
                f"UPDATE queue SET state='pending', attempts=0, next_at=? WHERE {where}",
                (time.time(), *params),
            )
            return int(cur.rowcount)

    async def processed_count(self, guid: str) -> int:
        row = await self.fetchone(
            "SELECT COUNT(*) AS n FROM queue WHERE guid=? AND state='done'", (guid,))
        return int(row["n"]) if row else 0
