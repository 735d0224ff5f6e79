"""The console's sign-in sessions and what a person set aside in it, in the index.

A session is a random value in an HTTP-only cookie; the index keeps only its SHA-256 (as for API
tokens), the principal it signed in, the office's org, a CSRF token for its forms, and a flash
message for the next page. Deferred cards are kept per principal, not per session, so a card
set aside on the phone is set aside on the laptop too.
"""

from __future__ import annotations

import hashlib
import json
import secrets
import time
from dataclasses import dataclass

from bot.store import Store
from bot.store.db import register_schema

register_schema("""
CREATE TABLE IF NOT EXISTS console_sessions (
    id_hash TEXT PRIMARY KEY,
    principal TEXT NOT NULL,
    org TEXT,
    login TEXT NOT NULL,
    via TEXT NOT NULL,
    csrf TEXT NOT NULL,
    flash TEXT,
    created_at REAL NOT NULL,
    expires_at REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS console_sessions_expiry ON console_sessions(expires_at);
CREATE TABLE IF NOT EXISTS console_deferred (
    principal TEXT NOT NULL,
    thread TEXT NOT NULL,
    deferred_at REAL NOT NULL,
    PRIMARY KEY (principal, thread)
) WITHOUT ROWID;
""")

LIFETIME = 8 * 3600.0  # seconds a session lasts (a forge user token lasts as long on GitHub)


def _hash(value: str) -> str:
    return hashlib.sha256(value.encode()).hexdigest()


@dataclass(frozen=True)
class Session:
    id_hash: str
    principal: str
    org: str | None
    login: str
    via: str  # "forge" (the OAuth web flow) or "token" (an API token)
    csrf: str
    flash: dict[str, str] | None
    expires_at: float


async def create(store: Store, principal: str, org: str | None, login: str,
                 via: str) -> tuple[str, Session]:
    """A new session: the cookie's value (shown once, to the browser) and the session."""
    value = secrets.token_urlsafe(32)
    now = time.time()
    session = Session(_hash(value), principal, org, login, via, secrets.token_urlsafe(24),
                      None, now + LIFETIME)
    async with store.transaction() as db:
        await db.execute("DELETE FROM console_sessions WHERE expires_at < ?", (now,))
        await db.execute(
            "INSERT INTO console_sessions(id_hash, principal, org, login, via, csrf, created_at,"
            " expires_at) VALUES (?,?,?,?,?,?,?,?)",
            (session.id_hash, principal, org, login, via, session.csrf, now, session.expires_at))
    return value, session


async def get(store: Store, value: str) -> Session | None:
    """The live session a cookie's value stands for, or None."""
    row = await store.fetchone("SELECT * FROM console_sessions WHERE id_hash=? AND expires_at>?",
                               (_hash(value), time.time()))
    if row is None:
        return None
    flash = json.loads(row["flash"]) if row["flash"] else None
    return Session(row["id_hash"], row["principal"], row["org"], row["login"], row["via"],
                   row["csrf"], flash, row["expires_at"])


async def end(store: Store, session: Session) -> None:
    async with store.transaction() as db:
        await db.execute("DELETE FROM console_sessions WHERE id_hash=?", (session.id_hash,))


async def set_flash(store: Store, session: Session, flash: dict[str, str] | None) -> None:
    """What the next page says (the outcome of a form posted just before it)."""
    async with store.transaction() as db:
        await db.execute("UPDATE console_sessions SET flash=? WHERE id_hash=?",
                         (json.dumps(flash) if flash else None, session.id_hash))


async def defer(store: Store, principal: str, thread: str) -> None:
    async with store.transaction() as db:
        await db.execute("INSERT OR REPLACE INTO console_deferred(principal, thread, deferred_at)"
                         " VALUES (?,?,?)", (principal, thread, time.time()))


async def undefer(store: Store, principal: str, thread: str) -> None:
    async with store.transaction() as db:
        await db.execute("DELETE FROM console_deferred WHERE principal=? AND thread=?",
                         (principal, thread))


async def deferred(store: Store, principal: str) -> dict[str, float]:
    """The threads `principal` set aside, with when."""
    rows = await store.fetchall(
        "SELECT thread, deferred_at FROM console_deferred WHERE principal=?", (principal,))
    return {str(r["thread"]): float(r["deferred_at"]) for r in rows}
