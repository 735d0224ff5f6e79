"""The console's sign-in sessions and the cards a person deferred in it (`bot.console.sessions`
makes the values; these are its reads and writes of the index)."""

from __future__ import annotations

import time

from bot.store.db import Row, Store, register_schema
from bot.store.offices import scoped
from bot.store.sql import upsert

register_schema("""
CREATE TABLE IF NOT EXISTS console_sessions (
    id_hash {text} PRIMARY KEY,
    principal {text} NOT NULL,
    org {text},
    login {text} NOT NULL,
    via {text} NOT NULL,
    csrf {text} NOT NULL,
    flash {text},
    created_at {real} NOT NULL,
    expires_at {real} NOT NULL
);
CREATE INDEX IF NOT EXISTS console_sessions_expiry ON console_sessions(expires_at);
CREATE TABLE IF NOT EXISTS console_deferred (
    principal {text} NOT NULL,
    thread {text} NOT NULL,
    deferred_at {real} NOT NULL,
    PRIMARY KEY (principal, thread)
){without_rowid};
""")


async def add_session(store: Store, id_hash: str, principal: str, org: str | None, login: str,
                      via: str, csrf: str, now: float, expires_at: float) -> None:
    """Keep a new session. (Expired ones are refused by `live_session` and deleted by the
    prune: deleting them here touched every office's rows, so one office's sign-in waited on
    another's.)"""
    async with store.transaction() as db:
        await db.execute(
            "INSERT INTO console_sessions(id_hash, principal, org, login, via, csrf, created_at,"
            " expires_at) VALUES (?,?,?,?,?,?,?,?)",
            (id_hash, principal, org, login, via, csrf, now, expires_at))


async def live_session(store: Store, id_hash: str, now: float) -> Row | None:
    """The session row with this hash, unless it expired by `now`."""
    return await store.fetchone("SELECT * FROM console_sessions WHERE id_hash=? AND expires_at>?",
                                (id_hash, now))


async def delete_session(store: Store, id_hash: str) -> None:
    """End the session with this hash."""
    async with store.transaction() as db:
        await db.execute("DELETE FROM console_sessions WHERE id_hash=?", (id_hash,))


async def set_flash(store: Store, id_hash: str, flash: str | None) -> None:
    """Keep `flash` (JSON, or None for none) for the session's next page."""
    async with store.transaction() as db:
        await db.execute("UPDATE console_sessions SET flash=? WHERE id_hash=?",
                         (flash, id_hash))


_DEFER = upsert("console_deferred", ["principal", "thread", "deferred_at"],
                ["principal", "thread"])


# a person is one of an office: keyed `scoped(org, principal)`, so another office's person of
# the same name neither sees nor clears these
async def defer(store: Store, principal: str, thread: str, *, org: str) -> None:
    """Note that `principal` of `org` set `thread` aside, now."""
    async with store.transaction() as db:
        await db.execute(_DEFER, (scoped(org, principal), thread, time.time()))


async def undefer(store: Store, principal: str, thread: str, *, org: str) -> None:
    """Take `thread` off what `principal` of `org` set aside."""
    async with store.transaction() as db:
        await db.execute("DELETE FROM console_deferred WHERE principal=? AND thread=?",
                         (scoped(org, principal), thread))


async def deferred(store: Store, principal: str, *, org: str) -> list[Row]:
    """The (thread, deferred_at) rows `principal` of `org` set aside."""
    return await store.fetchall(
        "SELECT thread, deferred_at FROM console_deferred WHERE principal=?",
        (scoped(org, principal),))
