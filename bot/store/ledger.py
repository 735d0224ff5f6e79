"""The office's append-only, hash-chained ledger (DESIGN §3.7).

Each entry's hash covers the previous entry's hash and the entry's canonical JSON, so any edit
or deletion in the middle breaks every hash after it (`verify_chain`).
"""

from __future__ import annotations

import hashlib
import json
import time
from dataclasses import dataclass
from typing import Any

from bot.store.db import Connection, Row, Store, register_schema

register_schema("""
CREATE TABLE IF NOT EXISTS ledger (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    time REAL NOT NULL,
    event TEXT NOT NULL,
    actor TEXT NOT NULL,
    subject TEXT NOT NULL,
    data TEXT NOT NULL,
    prev_hash TEXT NOT NULL,
    hash TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS ledger_event ON ledger(event);
""")

GENESIS = "0" * 64
EVENTS = frozenset({
    "mail.sent", "mail.opened", "mail.replied", "mail.closed", "mail.loop_guard",
    "mail.tampered", "run.queued", "run.refused", "run.denied", "run.finished", "comment.added",
    "comment.answered", "comment.resolved", "office.config_refused",
})


@dataclass(frozen=True)
class Entry:
    seq: int
    time: float
    event: str
    actor: str
    subject: str
    data: dict[str, Any]
    hash: str

    def as_json(self) -> dict[str, Any]:
        return {"seq": self.seq, "time": _iso(self.time), "event": self.event,
                "actor": self.actor, "subject": self.subject, "data": self.data,
                "hash": self.hash}


def _iso(t: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t))


def _digest(prev: str, t: float, event: str, actor: str, subject: str, data: str) -> str:
    canon = json.dumps([prev, round(t, 6), event, actor, subject, data], separators=(",", ":"))
    return hashlib.sha256(canon.encode()).hexdigest()


async def append(db: Connection, event: str, actor: str, subject: str,
                 data: dict[str, Any] | None = None) -> int:
    """Append inside the caller's transaction (so the entry commits with what it records)."""
    if event not in EVENTS:
        raise ValueError(f"unknown ledger event {event!r}")
    async with db.execute("SELECT hash FROM ledger ORDER BY seq DESC LIMIT 1") as cur:
        row = await cur.fetchone()
    prev = row[0] if row else GENESIS
    t = time.time()
    blob = json.dumps(data or {}, sort_keys=True, separators=(",", ":"))
    cur2 = await db.execute(
        "INSERT INTO ledger(time, event, actor, subject, data, prev_hash, hash)"
        " VALUES (?,?,?,?,?,?,?)",
        (t, event, actor, subject, blob, prev, _digest(prev, t, event, actor, subject, blob)),
    )
    return int(cur2.lastrowid or 0)


async def record(store: Store, event: str, actor: str, subject: str,
                 data: dict[str, Any] | None = None) -> int:
    async with store.transaction() as db:
        return await append(db, event, actor, subject, data)


async def recorded(store: Store, event: str, subject: str, field: str, value: str) -> bool:
    """Whether an `event` about `subject` with `data[field] == value` is in the ledger: what
    a retry asks to learn if an earlier try already did its part."""
    row = await store.fetchone(
        "SELECT 1 FROM ledger WHERE event=? AND subject=? AND json_extract(data, ?)=? LIMIT 1",
        (event, subject, f"$.{field}", value))
    return row is not None


def _entry(r: Any) -> Entry:
    return Entry(r["seq"], r["time"], r["event"], r["actor"], r["subject"],
                 json.loads(r["data"]), r["hash"])


async def entries(store: Store, *, since: int = 0, limit: int = 1000,
                  event: str | None = None) -> list[Entry]:
    sql, params = "SELECT * FROM ledger WHERE seq>?", [since]
    if event:
        sql += " AND event=?"
        params.append(event)  # type: ignore[arg-type]
    rows = await store.fetchall(sql + " ORDER BY seq LIMIT ?", (*params, limit))
    return [_entry(r) for r in rows]


async def verify_chain(store: Store) -> int | None:
    """The first sequence number whose hash does not hold, or None when the chain is intact."""
    prev = GENESIS
    for r in await store.fetchall("SELECT * FROM ledger ORDER BY seq"):
        if r["prev_hash"] != prev or r["hash"] != _digest(
                prev, r["time"], r["event"], r["actor"], r["subject"], r["data"]):
            return int(r["seq"])
        prev = r["hash"]
    return None


async def scan_newest(store: Store, *, event: str | None, actor: str | None,
                      since: float | None, until: float | None, before: int | None,
                      about: str | None, scanned: int) -> list[Entry]:
    """Up to `scanned` entries newest first, filtered; `about` keeps an agent's own."""
    sql, params = "SELECT * FROM ledger WHERE 1=1", list[Any]()
    for clause, value in (("event=?", event), ("actor=?", actor), ("time>=?", since),
                          ("time<?", until), ("seq<?", before)):
        if value is not None:
            sql += f" AND {clause}"
            params.append(value)
    if about is not None:
        sql += " AND (actor=? OR json_extract(data, '$.agent')=?)"
        params += [about, about]
    rows = await store.fetchall(sql + " ORDER BY seq DESC LIMIT ?", (*params, scanned))
    return [_entry(r) for r in rows]


async def head(store: Store) -> Row | None:
    """The (seq, hash) of the chain's last entry, or None when the ledger is empty."""
    return await store.fetchone("SELECT seq, hash FROM ledger ORDER BY seq DESC LIMIT 1")
