"""The durable work queue of webhook deliveries, with dedupe by delivery id and dead letters."""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from contextlib import AbstractAsyncContextManager

    import aiosqlite


BATCH = 500  # deliveries written in one transaction at most


@dataclass(eq=False)
class _Arrival:
    guid: str
    event: str
    payload: dict[str, Any]
    raw: bytes
    done: asyncio.Future[bool]

    @property
    def action(self) -> str | None:
        action = self.payload.get("action")
        return action if isinstance(action, str) else None

    @property
    def installation_id(self) -> int | None:
        inst = (self.payload.get("installation") or {}).get("id")
        return inst if isinstance(inst, int) else None


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

    _arrivals: list[_Arrival]  # deliveries waiting for the next group commit

    if TYPE_CHECKING:
        def transaction(self) -> AbstractAsyncContextManager[aiosqlite.Connection]: ...
        async def fetchone(self, sql: str,
                           params: tuple[Any, ...] = ()) -> aiosqlite.Row | None: ...
        async def fetchall(self, sql: str,
                           params: tuple[Any, ...] = ()) -> list[aiosqlite.Row]: ...

    async def enqueue_delivery(
        self, guid: str, event: str, payload: dict[str, Any], raw: bytes
    ) -> bool:
        """Record a delivery and queue it; False when this delivery id was seen before.

        Deliveries arriving together are written in one transaction (group commit), and each
        caller is answered only once its delivery is committed: durable before the 2xx, with
        a handful of statements per batch instead of per delivery."""
        pending = self._arrivals
        arrival = _Arrival(guid, event, payload, raw, asyncio.get_running_loop().create_future())
        pending.append(arrival)
        if len(pending) == 1:  # the first of a batch starts its writer
            asyncio.get_running_loop().create_task(self._write_arrivals())
        return await arrival.done

    async def _write_arrivals(self) -> None:
        pending = self._arrivals
        await asyncio.sleep(0)  # let deliveries that arrived together join this batch
        batch = pending[:BATCH]
        del pending[:BATCH]
        if pending:
            asyncio.get_running_loop().create_task(self._write_arrivals())
        try:
            fresh = await self._insert_arrivals(batch)
        except Exception as exc:
            for a in batch:
                if not a.done.done():
                    a.done.set_exception(exc)
            return
        for a in batch:
            if not a.done.done():
                a.done.set_result(a in fresh)

    async def _insert_arrivals(self, batch: list[_Arrival]) -> set[_Arrival]:
        now = time.time()
        guids = list({a.guid for a in batch})
        async with self.transaction() as db:
            marks = ",".join("?" for _ in guids)
            async with db.execute(f"SELECT guid FROM deliveries WHERE guid IN ({marks})",
                                  guids) as cur:
                seen = {row[0] for row in await cur.fetchall()}
            fresh: set[_Arrival] = set()
            for a in batch:  # the first arrival of an id not seen before is the one queued
                if a.guid not in seen:
                    seen.add(a.guid)
                    fresh.add(a)
            rows = [a for a in batch if a in fresh]
            await db.executemany(
                "INSERT INTO deliveries(guid, event, action, installation_id, received_at)"
                " VALUES (?,?,?,?,?)",
                [(a.guid, a.event, a.action, a.installation_id, now) for a in rows])
            await db.executemany(
                "INSERT INTO queue(guid, event, installation_id, payload, next_at, created_at)"
                " VALUES (?,?,?,?,?,?)",
                [(a.guid, a.event, a.installation_id, a.raw.decode("utf-8"), now, now)
                 for a in rows])
        return fresh

    async def next_due(self, now: float | None = None) -> QueueItem | None:
        row = await self.fetchone(
            "SELECT * FROM queue WHERE state='pending' AND next_at<=? ORDER BY id LIMIT 1",
            (time.time() if now is None else now,),
        )
        return _item(row) if row else None

    async def due_items(self, limit: int, now: float | None = None) -> list[QueueItem]:
        """The oldest due deliveries, in arrival order."""
        rows = await self.fetchall(
            "SELECT * FROM queue WHERE state='pending' AND next_at<=? ORDER BY id LIMIT ?",
            (time.time() if now is None else now, limit))
        return [_item(r) for r in rows]

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
