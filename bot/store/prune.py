"""What the index keeps, and for how long (issue 28): nothing grows without bound.

Finished work is kept for `keep` seconds (`VAULTMAIL_RETENTION_DAYS`, 7 days by default), then
deleted in batches by the leader (`bot.app.prune`), on PostgreSQL never waiting for a row another
transaction holds (it is left to the next prune):

* queue rows handled (`done`, `ignored`) or parked for an issue that never became mail
  (`parked`), and their payloads; dead letters stay until an operator replays or drops them;
* the deliveries recorded against redelivery, once their queue row is gone: a redelivery older
  than `keep` would be taken again (GitHub redelivers for 3 days: `keep` is at least that);
* idempotency results: a retry with the same key after `keep` is a new call;
* console sessions past their expiry, and strangers' quiet periods past theirs;
* API tokens revoked, or expired (a run's: one per agent run), `keep` ago: a token that can
  no longer act, kept a while for `vaultmail token list`; a live one stays however old;
* remote MCP sign-ins (`bot.store.oauth`): requests, codes and tokens a day past their expiry
  (a replay is recognised that long), grants a day past their end, and clients a day old that
  hold nothing (never allowed, or all they were given gone);
* what an org-signed Gitea delivery was taken on (`org_signed_rows`, `org_signed_taken`,
  `org_signed_comments`, `bot.app.org_signed`), `keep` after it was taken: no such delivery is
  taken on an event or a comment older than `keep`, so a row that old guards nothing a
  delivery could take again;
* a comment's edit kept until the comment is indexed (`early_edits`), `keep` after it: its
  `created` comes within that or not at all (redelivered no later than `keep`);
* an outside sender's counted messages (`rate_hits`, bot.store.rates), `MESSAGE_KEPT` (a day)
  after each: no rate's window is that long, and a resend that late is counted as new. (Each
  hit forgets its own key's old ones; a key no sender counts again is forgotten here.)

Mail, comments, chats and the ledger are the office's record and are never pruned here.
"""

from __future__ import annotations

from bot.store.db import Store
from bot.store.migrations import register_schema
from bot.store.oauth import KEPT_AFTER_EXPIRY
from bot.store.rates import MESSAGE_KEPT
from bot.store.sql import Sql
from bot.store.strangers import QUIET_FOR

DAY = 86_400.0
MIN_KEEP = 3 * DAY  # GitHub's redelivery window: a delivery is remembered at least that long
BATCH = 1000  # rows one statement deletes: short transactions, however much is due


def _batched(table: str, key: str, where: str) -> Sql:
    """Delete up to BATCH rows of `table` matching `where`, picked by `key` (its primary key's
    columns).
    On PostgreSQL only rows no other transaction holds now (`SKIP LOCKED`): a row an office's
    live transaction writes (a key being claimed, a quiet period being renewed) is left to the
    next prune, never waited for; and each batch holds what it deletes only until it
    commits."""
    pick = (f"DELETE FROM {table} WHERE ({key}) IN (SELECT {key} FROM {table} WHERE {where}"
            f" LIMIT {BATCH}")
    return Sql(pick + ")", pick + " FOR UPDATE SKIP LOCKED)")


# What each batch below looks up, indexed (the tables' other indexes cover the rest: sessions'
# and OAuth grants' and consents' expiry, consents and grants by client, grants by consent), so a
# batch reads the rows it deletes, not its whole table: the time each filters on, queue rows by
# state and time (not queue_due's state alone: nearly every row is done), and queue rows by
# delivery for the deliveries' NOT EXISTS.
register_schema("""
CREATE INDEX IF NOT EXISTS queue_finished ON queue(state, finished_at);
CREATE INDEX IF NOT EXISTS queue_guid ON queue(guid);
CREATE INDEX IF NOT EXISTS deliveries_received ON deliveries(received_at);
CREATE INDEX IF NOT EXISTS idempotency_done ON idempotency(done_at);
CREATE INDEX IF NOT EXISTS stranger_replies_replied ON stranger_replies(replied_at);
CREATE INDEX IF NOT EXISTS api_tokens_revoked ON api_tokens(revoked_at);
CREATE INDEX IF NOT EXISTS api_tokens_expiry ON api_tokens(expires_at);
CREATE INDEX IF NOT EXISTS oauth_clients_created ON oauth_clients(created_at);
""", version=22)

STATEMENTS: dict[str, Sql] = {  # (one per table, in order; read by the tests)
    "queue": _batched("queue", "id",
                      "state IN ('done', 'ignored', 'parked') AND finished_at < ?"),
    "deliveries": _batched("deliveries", "guid", "received_at < ? AND NOT EXISTS"
                           " (SELECT 1 FROM queue q WHERE q.guid=deliveries.guid)"),
    "idempotency": _batched("idempotency", "scope, key",
                            "done_at IS NOT NULL AND done_at < ?"),
    "console_sessions": _batched("console_sessions", "id_hash", "expires_at < ?"),
    "stranger_replies": _batched("stranger_replies", "login", "replied_at < ?"),
    "api_tokens": _batched("api_tokens", "id", "revoked_at < ? OR expires_at < ?"),
    "oauth_grants": _batched("oauth_grants", "value_hash", "expires_at < ?"),
    "oauth_consents": _batched("oauth_consents", "grant_id", "expires_at < ? AND NOT EXISTS"
                               " (SELECT 1 FROM oauth_grants g"
                               " WHERE g.grant_id=oauth_consents.grant_id)"),
    "oauth_clients": _batched("oauth_clients", "client_id", "created_at < ? AND NOT EXISTS"
                              " (SELECT 1 FROM oauth_consents c"
                              " WHERE c.client_id=oauth_clients.client_id) AND NOT EXISTS"
                              " (SELECT 1 FROM oauth_grants g"
                              " WHERE g.client_id=oauth_clients.client_id)"),
    "org_signed_taken": _batched("org_signed_taken", "issue", "taken_at < ?"),
    "org_signed_comments": _batched("org_signed_comments", "comment_id", "taken_at < ?"),
    "org_signed_rows": _batched("org_signed_rows", "issue, event_id", "taken_at < ?"),
    "early_edits": _batched("early_edits", "item, forge_id", "edited_at < ?"),
    "rate_hits": _batched("rate_hits", "id", "at < ?"),
}


async def prune(store: Store, *, now: float, keep: float) -> dict[str, int]:
    """Delete what is past its time (see the module's docstring); returns the rows deleted
    per table. Each batch is a transaction of its own."""
    keep = max(keep, MIN_KEEP)
    before = {"queue": now - keep, "deliveries": now - keep, "idempotency": now - keep,
              "console_sessions": now, "stranger_replies": now - QUIET_FOR,
              "oauth_grants": now - KEPT_AFTER_EXPIRY, "oauth_consents": now - KEPT_AFTER_EXPIRY,
              "oauth_clients": now - DAY, "api_tokens": now - keep,
              "org_signed_taken": now - keep, "org_signed_comments": now - keep,
              "org_signed_rows": now - keep, "early_edits": now - keep,
              "rate_hits": now - MESSAGE_KEPT}
    deleted: dict[str, int] = {}
    for table, sql in STATEMENTS.items():
        total = 0
        while True:
            async with store.transaction() as db:
                n = await db.execute(sql, (before[table],) * sql.sqlite.count("?"))
            total += n
            if n < BATCH:  # (on PostgreSQL, rows held elsewhere wait for the next prune)
                break
        deleted[table] = total
    return deleted
