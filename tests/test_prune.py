"""Nothing in the index grows without bound (issue 28): handled deliveries, their payloads,
idempotency results, expired sessions, strangers' quiet periods and API tokens revoked or
expired (a run's) are pruned after their time; dead letters, what is still pending, live
tokens and what is recent stay."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import asyncpg

from bot.app.settings import Settings, SettingsError
from bot.store import open_store
from bot.store.prune import DAY, STATEMENTS, prune
from bot.store.sql import for_postgres

NOW = 2_000_000_000.0
OLD, RECENT = NOW - 30 * DAY, NOW - DAY


async def test_what_is_past_its_time_is_pruned_and_nothing_else(
        tmp_path: Path, database_url: str) -> None:
    store = await open_store(database_url or tmp_path / "index.sqlite3")
    try:
        async with store.transaction() as db:
            for guid, state, finished, received in (
                    ("done-old", "done", OLD, OLD), ("ignored-old", "ignored", OLD, OLD),
                    ("done-recent", "done", RECENT, RECENT), ("dead-old", "dead", OLD, OLD),
                    ("pending-old", "pending", None, OLD)):
                await db.execute("INSERT INTO deliveries(guid, event, received_at)"
                                 " VALUES (?,?,?)", (guid, "issues", received))
                await db.execute(
                    "INSERT INTO queue(guid, event, payload, state, next_at, created_at,"
                    " finished_at) VALUES (?,?,?,?,?,?,?)",
                    (guid, "issues", "{}", state, received, received, finished))
            await db.execute("INSERT INTO deliveries(guid, event, received_at) VALUES"
                             " ('redelivery-guard-old', 'ping', ?)", (OLD,))
            for key, done in (("old", OLD), ("recent", RECENT), ("open", None)):
                await db.execute(
                    "INSERT INTO idempotency(scope, key, fingerprint, claimed_at, done_at)"
                    " VALUES ('tool:mail_send:acme:human:marco@acme.com', ?, 'f', ?, ?)",
                    (key, OLD, done))
            for id_hash, expires in (("gone", NOW - 1), ("live", NOW + 3600)):
                await db.execute(
                    "INSERT INTO console_sessions(id_hash, principal, login, via, csrf,"
                    " created_at, expires_at) VALUES (?,'human:marco@acme.com','marco',"
                    "'token','c',?,?)", (id_hash, OLD, expires))
            await db.execute("INSERT INTO stranger_replies(login, replied_at, cause)"
                             " VALUES ('acme/troll', ?, 'x')", (OLD,))
            # API tokens: one per agent run besides the people's; those revoked or expired
            # past the retention go, a live one stays however old
            for name, revoked, expires in (
                    ("live-old", None, None), ("run-live", None, NOW + 600),
                    ("revoked-old", OLD, None), ("revoked-recent", RECENT, None),
                    ("run-expired-old", None, OLD), ("run-expired-recent", None, RECENT),
                    ("run-revoked-old", OLD, OLD + 600)):
                await db.execute(
                    "INSERT INTO api_tokens(principal, token_hash, created_at, org, revoked_at,"
                    " expires_at) VALUES ('agent:scout', ?, ?, 'acme', ?, ?)",
                    (name, OLD, revoked, expires))
            # what an org-signed delivery was taken on (an issue's newest timeline event, a
            # comment's `created`): kept while a delivery of it could still be taken
            for n, taken in ((1, OLD), (2, RECENT)):
                await db.execute("INSERT INTO org_signed_taken(issue, org, event_id, guid,"
                                 " taken_at) VALUES (?, 'acme', 7, 'acme/g', ?)",
                                 (f"acme/scout-vault#{n}", taken))
                await db.execute("INSERT INTO org_signed_comments(comment_id, org, guid,"
                                 " taken_at) VALUES (?, 'acme', 'acme/g', ?)", (n, taken))
                # one issue's rows taken at different times: only the old one goes
                await db.execute("INSERT INTO org_signed_rows(issue, event_id, org, guid,"
                                 " taken_at) VALUES ('acme/scout-vault#3', ?, 'acme', 'acme/g',"
                                 " ?)", (n, taken))
                # an edit kept for a comment whose `created` never came: gone after the window
                await db.execute("INSERT INTO early_edits(item, forge_id, body, edited_at)"
                                 " VALUES ('acme/scout-vault#1', ?, 'x', ?)", (n, taken))
            # an outside sender's counted messages (bot.store.rates): a key never counted
            # again kept its rows for ever, each sender's (past MESSAGE_KEPT, a day, no
            # window counts them and no resend is let off for them)
            for key, at in (("email-rate:acme/scout/a@x.example", OLD),
                            ("email-rate:acme/scout/b@x.example", NOW - 3600)):
                await db.execute("INSERT INTO rate_hits(key, at, message) VALUES (?,?,'m')",
                                 (key, at))
        deleted = await prune(store, now=NOW, keep=7 * DAY)
        assert deleted == {"queue": 2, "deliveries": 3, "idempotency": 1,
                           "console_sessions": 1, "stranger_replies": 1, "oauth_grants": 0,
                           "oauth_consents": 0, "oauth_clients": 0, "api_tokens": 3,
                           "org_signed_taken": 1, "org_signed_comments": 1,
                           "org_signed_rows": 1, "early_edits": 1, "rate_hits": 1}, deleted
        assert [r["key"] for r in await store.fetchall("SELECT key FROM rate_hits")] == [
            "email-rate:acme/scout/b@x.example"]
        assert [r["forge_id"] for r in await store.fetchall(
            "SELECT forge_id FROM early_edits")] == [2]
        assert [r["issue"] for r in await store.fetchall(
            "SELECT issue FROM org_signed_taken")] == ["acme/scout-vault#2"]
        assert [r["comment_id"] for r in await store.fetchall(
            "SELECT comment_id FROM org_signed_comments")] == [2]
        assert [(r["issue"], r["event_id"]) for r in await store.fetchall(
            "SELECT issue, event_id FROM org_signed_rows")] == [("acme/scout-vault#3", 2)]
        tokens = {r["token_hash"] for r in await store.fetchall(
            "SELECT token_hash FROM api_tokens")}
        assert tokens == {"live-old", "run-live", "revoked-recent", "run-expired-recent"}
        queue = {r["guid"] for r in await store.fetchall("SELECT guid FROM queue")}
        assert queue == {"done-recent", "dead-old", "pending-old"}
        kept = {r["guid"] for r in await store.fetchall("SELECT guid FROM deliveries")}
        assert kept == {"done-recent", "dead-old", "pending-old"}  # those with a queue row
        keys = {r["key"] for r in await store.fetchall("SELECT key FROM idempotency")}
        assert keys == {"recent", "open"}
        assert await prune(store, now=NOW, keep=7 * DAY) == dict.fromkeys(deleted, 0)
    finally:
        await store.close()


def test_retention_is_at_least_githubs_redelivery_window() -> None:
    env = {"GITHUB_APP_ID": "7", "GITHUB_WEBHOOK_SECRET": "s",
           "PRIVATE_KEY": "-----BEGIN PRIVATE KEY-----\\nx\\n-----END PRIVATE KEY-----"}
    assert Settings.from_env(env=env).retention_days == 7
    assert Settings.from_env(env={**env, "VAULTMAIL_RETENTION_DAYS": "30"}).retention_days == 30
    try:
        Settings.from_env(env={**env, "VAULTMAIL_RETENTION_DAYS": "1"})
    except SettingsError as exc:
        assert "VAULTMAIL_RETENTION_DAYS" in str(exc) and "from 3" in str(exc)
    else:
        raise AssertionError("a retention under 3 days was taken")


# each prune statement's table, and the indexes its plan must look things up by: the time
# column it filters on, and the rows a NOT EXISTS looks for
PRUNE_INDEXES = {
    "queue": {"queue_finished"},
    "deliveries": {"deliveries_received", "queue_guid"},
    "idempotency": {"idempotency_done"},
    "console_sessions": {"console_sessions_expiry"},
    "stranger_replies": {"stranger_replies_replied"},
    "api_tokens": {"api_tokens_revoked", "api_tokens_expiry"},
    "oauth_grants": {"oauth_grants_expiry"},
    "oauth_consents": {"oauth_consents_expiry", "oauth_grants_grant"},
    "oauth_clients": {"oauth_clients_created", "oauth_consents_client", "oauth_grants_client"},
    "org_signed_taken": {"org_signed_taken_at"},
    "org_signed_comments": {"org_signed_comments_at"},
    "org_signed_rows": {"org_signed_rows_at"},
    "early_edits": {"early_edits_at"},
    "rate_hits": {"rate_hits_at"},
}


def _pg_plan_steps(plan: dict[str, Any]) -> list[tuple[str, str | None]]:
    """Each node of a PostgreSQL plan (FORMAT JSON): its kind and the index it reads."""
    return [(plan["Node Type"], plan.get("Index Name")),
            *(s for p in plan.get("Plans", []) for s in _pg_plan_steps(p))]


async def test_each_prune_batch_finds_what_is_past_its_time_by_an_index(
        tmp_path: Path, database_url: str) -> None:
    """The prune's batches filter by time columns, and most had no index (queue.finished_at,
    deliveries.received_at, idempotency.done_at, stranger_replies.replied_at, api_tokens'
    revoked_at and expires_at, oauth_clients.created_at; and queue.guid, which the deliveries'
    NOT EXISTS looks up): on a large table every batch scanned all of it, and the hourly
    prune holds each batch's transaction that long. Each statement's plan now reads by index
    alone. The plans are asserted, not a time: SQLite's EXPLAIN QUERY PLAN scans no table;
    PostgreSQL's, with sequential scans priced out (on the test's empty tables one would
    rightly be cheaper), has no Seq Scan and reads the indexes named."""
    assert set(PRUNE_INDEXES) == set(STATEMENTS)
    store = await open_store(database_url or tmp_path / "index.sqlite3")
    try:
        for table, sql in STATEMENTS.items():
            params = (NOW,) * sql.sqlite.count("?")
            if store.engine == "sqlite":
                plan = [str(r["detail"]) for r in await store.fetchall(
                    "EXPLAIN QUERY PLAN " + sql.sqlite, params)]
                assert not [d for d in plan if d.startswith("SCAN")], (table, plan)
                used = {m for d in plan for m in re.findall(r"USING (?:COVERING )?INDEX (\w+)",
                                                            d)}
            else:
                conn = await asyncpg.connect(database_url)
                try:
                    await conn.execute("SET enable_seqscan = off")
                    found = await conn.fetchval("EXPLAIN (FORMAT JSON) " + for_postgres(sql),
                                                *params)
                finally:
                    await conn.close()
                steps = _pg_plan_steps(json.loads(found)[0]["Plan"])
                assert ("Seq Scan", None) not in steps, (table, steps)
                used = {index for _, index in steps if index is not None}
            assert PRUNE_INDEXES[table] <= used, (table, used)
    finally:
        await store.close()
