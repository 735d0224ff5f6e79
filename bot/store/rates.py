"""Rates counted in the index, so that every replica counts the same: the messages one outside
sender, and one authenticated domain's senders together (email-domain-rate:...), sent one agent
in the last minute (bot.email.policy.SharedSenderRate). Times are the database's clock
(vm_now()), so the replicas' own clocks need not agree."""

from __future__ import annotations

from bot.store.db import Store, register_schema

VERSION = 13

register_schema("""
CREATE TABLE IF NOT EXISTS rate_hits (
    id {id},
    key {text} NOT NULL,              -- what is counted: email-rate:<office>/<agent>/<sender>
    at {real} NOT NULL                -- when (the database's clock)
);
CREATE INDEX IF NOT EXISTS rate_hits_key_at ON rate_hits(key, at);
""", version=VERSION)


async def admit(store: Store, key: str, limit: int, window: float) -> bool:
    """Count one hit under `key`, or False when `limit` hits are counted in the last `window`
    seconds already (nothing counted). One key's hits are counted one at a time, whichever
    replica counts them."""
    async with store.transaction(key) as db:
        row = await db.fetchone("SELECT vm_now() AS t")
        assert row is not None
        now = float(row[0])
        row = await db.fetchone("SELECT COUNT(*) FROM rate_hits WHERE key=? AND at>?",
                                (key, now - window))
        assert row is not None
        counted = int(row[0])
        if counted >= limit:
            return False
        await db.execute("INSERT INTO rate_hits(key, at) VALUES (?,?)", (key, now))
        if counted == 0:  # a key quiet for a window: forget what no window holds any more
            await db.execute("DELETE FROM rate_hits WHERE key=? AND at<=?", (key, now - window))
    return True
