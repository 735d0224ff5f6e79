"""The words of the replies the app posted as comments (`mail_reply`), kept a while so that
`vaultmail doctor` (bot.app.doctor) can post one again when the forge lost its comment: a reply
to a person has no copy anywhere else (issue 28). Kept as posted (byline and marker included);
the doctor forgets those older than its reply window."""

from __future__ import annotations

import time

from bot.store.db import Store, register_schema
from bot.store.moves import VERSION
from bot.store.sql import Sql

register_schema("""
CREATE TABLE IF NOT EXISTS reply_comments (
    mail_id {text} NOT NULL,
    reply_key {text} NOT NULL,
    body {text} NOT NULL,
    created_at {real} NOT NULL,
    PRIMARY KEY (mail_id, reply_key)
);
CREATE INDEX IF NOT EXISTS reply_comments_made ON reply_comments(created_at);
""", version=VERSION)


_KEEP = Sql("INSERT OR IGNORE INTO reply_comments(mail_id, reply_key, body, created_at)"
           " VALUES (?,?,?,?)",
           "INSERT INTO reply_comments(mail_id, reply_key, body, created_at)"
           " VALUES (?,?,?,?) ON CONFLICT DO NOTHING")


async def keep(store: Store, mail_id: str, key: str, body: str) -> None:
    """The comment about to be posted for reply `key` to `mail_id` (its first words stay)."""
    async with store.transaction() as db:
        await db.execute(_KEEP, (mail_id, key, body, time.time()))


async def kept(store: Store, mail_id: str, key: str) -> str | None:
    row = await store.fetchone("SELECT body FROM reply_comments WHERE mail_id=? AND"
                               " reply_key=?", (mail_id, key))
    return str(row["body"]) if row else None


async def forget_before(store: Store, before: float) -> int:
    async with store.transaction() as db:
        changed = await db.execute("DELETE FROM reply_comments WHERE created_at<?", (before,))
        return changed
