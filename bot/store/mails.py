"""The mail index: one row per mail (the signed values), plus the runs the office queued."""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, replace
from typing import Any

import aiosqlite

from bot.store.db import Store, register_schema

register_schema("""
CREATE TABLE IF NOT EXISTS mails (
    mail_id TEXT PRIMARY KEY,
    vault TEXT NOT NULL,
    number INTEGER NOT NULL,
    subject TEXT NOT NULL,
    body TEXT NOT NULL,
    from_principal TEXT NOT NULL,
    to_principal TEXT NOT NULL,
    sent TEXT NOT NULL,
    hops INTEGER NOT NULL,
    in_reply_to TEXT,
    thread_id TEXT NOT NULL,
    key_id TEXT NOT NULL,
    body_sha256 TEXT NOT NULL,
    state TEXT NOT NULL,
    tampered INTEGER NOT NULL DEFAULT 0,
    updated_at REAL NOT NULL,
    UNIQUE(vault, number)
);
CREATE INDEX IF NOT EXISTS mails_to ON mails(to_principal, state);
CREATE INDEX IF NOT EXISTS mails_thread ON mails(thread_id);
CREATE TABLE IF NOT EXISTS runs (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    agent TEXT NOT NULL,
    kind TEXT NOT NULL,
    subject TEXT NOT NULL,
    state TEXT NOT NULL,
    created_at REAL NOT NULL
);
""")

# The states a mail row can hold: the four label names, and "quiet" for a reply delivered
# past the loop guard (it carries no state label until someone acts on it).
QUIET = "quiet"
STATES = ("mail:new", "mail:working", "mail:replied", "mail:closed", QUIET)


@dataclass(frozen=True)
class MailRecord:
    mail_id: str
    vault: str
    number: int
    subject: str
    body: str
    from_principal: str
    to_principal: str
    sent: str
    hops: int
    in_reply_to: str | None
    thread_id: str
    key_id: str
    body_sha256: str
    state: str
    tampered: bool = False

    @property
    def ref(self) -> str:
        return f"{self.vault}#{self.number}"

    def with_state(self, state: str) -> MailRecord:
        return replace(self, state=state)

    def as_json(self) -> dict[str, Any]:
        out = asdict(self)
        out["ref"] = self.ref
        return out


_COLUMNS = [f for f in MailRecord.__dataclass_fields__]


def _record(row: Any) -> MailRecord:
    values = {c: row[c] for c in _COLUMNS}
    values["tampered"] = bool(values["tampered"])
    return MailRecord(**values)


async def put_mail(db: aiosqlite.Connection, mail: MailRecord) -> None:
    cols = ",".join(_COLUMNS)
    marks = ",".join("?" for _ in _COLUMNS)
    values = [getattr(mail, c) for c in _COLUMNS]
    values[_COLUMNS.index("tampered")] = int(mail.tampered)
    await db.execute(
        f"INSERT OR REPLACE INTO mails({cols}, updated_at) VALUES ({marks}, ?)",
        (*values, time.time()),
    )


async def set_state(db: aiosqlite.Connection, mail_id: str, state: str) -> None:
    if state not in STATES:
        raise ValueError(f"unknown mail state {state!r}")
    await db.execute("UPDATE mails SET state=?, updated_at=? WHERE mail_id=?",
                     (state, time.time(), mail_id))


async def mark_tampered(db: aiosqlite.Connection, mail_id: str) -> None:
    await db.execute("UPDATE mails SET tampered=1, updated_at=? WHERE mail_id=?",
                     (time.time(), mail_id))


async def get_mail(store: Store, mail_id: str) -> MailRecord | None:
    row = await store.fetchone("SELECT * FROM mails WHERE mail_id=?", (mail_id,))
    return _record(row) if row else None


async def mail_at(store: Store, vault: str, number: int) -> MailRecord | None:
    row = await store.fetchone("SELECT * FROM mails WHERE lower(vault)=lower(?) AND number=?",
                               (vault, number))
    return _record(row) if row else None


async def list_mails(store: Store, *, to: str | None = None, state: str | None = None,
                     vault: str | None = None, thread: str | None = None,
                     involving: str | None = None, limit: int = 200) -> list[MailRecord]:
    sql, params = "SELECT * FROM mails WHERE 1=1", []
    for col, value in (("to_principal", to), ("state", state), ("lower(vault)", vault),
                       ("thread_id", thread)):
        if value is not None:
            sql += f" AND {col}=?"
            params.append(value.lower() if col == "lower(vault)" else value)
    if involving is not None:
        sql += " AND (to_principal=? OR from_principal=?)"
        params += [involving, involving]
    rows = await store.fetchall(sql + " ORDER BY sent, vault, number LIMIT ?", (*params, limit))
    return [_record(r) for r in rows]


async def all_mails(store: Store) -> list[MailRecord]:
    rows = await store.fetchall("SELECT * FROM mails ORDER BY vault, number")
    return [_record(r) for r in rows]


async def replace_all(store: Store, mails: list[MailRecord]) -> None:
    async with store.transaction() as db:
        await db.execute("DELETE FROM mails")
        for mail in mails:
            await put_mail(db, mail)


async def add_run(db: aiosqlite.Connection, agent: str, kind: str, subject: str,
                  state: str) -> int:
    cur = await db.execute(
        "INSERT INTO runs(agent, kind, subject, state, created_at) VALUES (?,?,?,?,?)",
        (agent, kind, subject, state, time.time()))
    return int(cur.lastrowid or 0)


async def runs_for(store: Store, agent: str) -> list[dict[str, Any]]:
    rows = await store.fetchall("SELECT * FROM runs WHERE agent=? ORDER BY id", (agent,))
    return [dict(r) for r in rows]
