"""API tokens per principal: shown once, stored as SHA-256 hashes, revocable, last use kept."""

from __future__ import annotations

import hashlib
import secrets
import time
from dataclasses import dataclass

from bot.store.db import Store, register_schema

register_schema("""
CREATE TABLE IF NOT EXISTS api_tokens (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    principal TEXT NOT NULL,
    token_hash TEXT NOT NULL UNIQUE,
    created_at REAL NOT NULL,
    last_used_at REAL,
    revoked_at REAL
);
""")

PREFIX = "vm_"
LAST_USED_RESOLUTION = 60.0  # seconds: how fresh `last used` is kept


@dataclass(frozen=True)
class TokenInfo:
    id: int
    principal: str
    created_at: float
    last_used_at: float | None
    revoked: bool


def _hash(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


async def create_token(store: Store, principal: str) -> str:
    token = PREFIX + secrets.token_urlsafe(32)
    async with store.transaction() as db:
        await db.execute(
            "INSERT INTO api_tokens(principal, token_hash, created_at) VALUES (?,?,?)",
            (principal, _hash(token), time.time()),
        )
    return token


async def principal_for(store: Store, token: str) -> str | None:
    """The principal a live token belongs to (and note its use), or None."""
    row = await store.fetchone(
        "SELECT id, principal, last_used_at FROM api_tokens"
        " WHERE token_hash=? AND revoked_at IS NULL",
        (_hash(token),),
    )
    if row is None:
        return None
    now = time.time()
    if row["last_used_at"] is None or now - row["last_used_at"] > LAST_USED_RESOLUTION:
        # a write on every call would put every tool call in the write queue
        async with store.transaction() as db:
            await db.execute("UPDATE api_tokens SET last_used_at=? WHERE id=?",
                             (now, row["id"]))
    return str(row["principal"])


async def revoke_token(store: Store, token_id: int) -> bool:
    async with store.transaction() as db:
        cur = await db.execute(
            "UPDATE api_tokens SET revoked_at=? WHERE id=? AND revoked_at IS NULL",
            (time.time(), token_id),
        )
        return cur.rowcount == 1


async def list_tokens(store: Store) -> list[TokenInfo]:
    rows = await store.fetchall("SELECT * FROM api_tokens ORDER BY id")
    return [TokenInfo(r["id"], r["principal"], r["created_at"], r["last_used_at"],
                      r["revoked_at"] is not None) for r in rows]
