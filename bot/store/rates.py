"""Rates counted in the index, so that every replica counts the same: the messages one outside
sender, and one authenticated domain's senders together (email-domain-rate:...), sent one agent
in the last minute (bot.email.policy.SharedSenderRate). Times are the database's clock
(vm_now()), so the replicas' own clocks need not agree. A hit may name the message it counted
(schema version 48), which is then not counted again for a day (MESSAGE_KEPT): a message
sent again after a 451."""

from __future__ import annotations

from bot.store.db import Store, register_schema
from bot.store.migrations import register_backfill, register_columns

VERSION = 13
MESSAGE_VERSION = 48
PRUNED_VERSION = 50  # the hits found by time, for the leader's prune (bot.store.prune)
# how long a hit is kept at most, and the message it names remembered (a quiet key's hits
# naming none go after a window): a sender's server sends a message again after a 451
# minutes or hours later, and the copies counted before are not charged again
# (bot.email.server); one sent again later than this is counted as new
MESSAGE_KEPT = 24 * 3600.0

register_schema("""
CREATE TABLE IF NOT EXISTS rate_hits (
    id {id},
    key {text} NOT NULL,              -- what is counted: email-rate:<office>/<agent>/<sender>
    at {real} NOT NULL                -- when (the database's clock)
);
CREATE INDEX IF NOT EXISTS rate_hits_key_at ON rate_hits(key, at);
""", version=VERSION)
register_columns("rate_hits", {"message": "{text}"}, version=MESSAGE_VERSION)
register_backfill(
    "CREATE INDEX IF NOT EXISTS rate_hits_key_message ON rate_hits(key, message)",
    postgres="CREATE INDEX IF NOT EXISTS rate_hits_key_message ON rate_hits(key, message)",
    version=MESSAGE_VERSION)
register_schema("CREATE INDEX IF NOT EXISTS rate_hits_at ON rate_hits(at);",
                version=PRUNED_VERSION)


async def admit(store: Store, key: str, limit: int, window: float, *,
                message: str | None = None) -> bool:
    """Count one hit under `key`, or False when `limit` hits are counted in the last `window`
    seconds already (nothing counted). One key's hits are counted one at a time, whichever
    replica counts them. `message`: what is counted is that message (a digest); one
    counted under `key` within MESSAGE_KEPT is admitted and not counted again (one counted
    before that is counted as new). A key's hits go after MESSAGE_KEPT (one naming no
    message once no window holds it, when the key is next counted after a quiet window)."""
    async with store.transaction(key) as db:
        row = await db.fetchone("SELECT vm_now() AS t")
        assert row is not None
        now = float(row[0])
        # (within MESSAGE_KEPT: unbounded, a copy counted a month ago was free for ever)
        if message is not None and await db.fetchone(
                "SELECT 1 FROM rate_hits WHERE key=? AND message=? AND at>? LIMIT 1",
                (key, message, now - MESSAGE_KEPT)) is not None:
            return True
        row = await db.fetchone("SELECT COUNT(*) FROM rate_hits WHERE key=? AND at>?",
                                (key, now - window))
        assert row is not None
        counted = int(row[0])
        if counted >= limit:
            return False
        await db.execute("INSERT INTO rate_hits(key, at, message) VALUES (?,?,?)",
                         (key, now, message))
        # nothing is kept past MESSAGE_KEPT, forgotten at each hit: a key never quiet for a
        # window (a busy sender) kept all it ever counted when this waited for one
        await db.execute("DELETE FROM rate_hits WHERE key=? AND at<=?",
                         (key, now - MESSAGE_KEPT))
        if counted == 0:  # a key quiet for a window: what no window holds, naming no message
            await db.execute("DELETE FROM rate_hits WHERE key=? AND at<=? AND message IS NULL",
                             (key, now - window))
    return True
