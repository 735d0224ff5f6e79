"""The reads every `issues` delivery makes find their rows by index: what one costs does not
grow with the mails the index holds, nor with the deliveries waiting (bench.probot_compare,
issue 22). The plans are asserted, not a time: SQLite's EXPLAIN QUERY PLAN scans no table;
PostgreSQL's, with sequential scans priced out (on a test's small tables one would rightly be
cheaper), has no Seq Scan and reads the indexes named."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import asyncpg

from bot.store import installations, mails, open_store
from bot.store.db import Store
from bot.store.queue import OTHERS_ABOUT
from bot.store.sql import Statement, for_postgres, for_sqlite
from bot.store.sqlite import CACHE_KIB
from tests.support import sqlite_steps


def _pg_steps(plan: dict[str, Any]) -> list[tuple[str, str | None]]:
    return [(plan["Node Type"], plan.get("Index Name")),
            *(s for p in plan.get("Plans", []) for s in _pg_steps(p))]


async def _indexes_read(store: Store, url: str, sql: Statement, params: tuple[Any, ...]
                        ) -> set[str]:
    """The indexes the statement's plan reads; it reads no table whole."""
    if store.engine == "sqlite":
        plan = [str(r["detail"]) for r in await store.fetchall(
            "EXPLAIN QUERY PLAN " + for_sqlite(sql), params)]
        assert not [d for d in plan if d.startswith("SCAN")], plan
        return {m for d in plan for m in re.findall(r"USING (?:COVERING )?INDEX (\w+)", d)}
    conn = await asyncpg.connect(url)
    try:
        await conn.execute("ANALYZE")  # (the statistics a live index has)
        await conn.execute("SET enable_seqscan = off")
        found = await conn.fetchval("EXPLAIN (FORMAT JSON) " + for_postgres(sql), *params)
    finally:
        await conn.close()
    steps = _pg_steps(json.loads(found)[0]["Plan"])
    assert ("Seq Scan", None) not in steps, steps
    return {index for _, index in steps if index is not None}


async def _mails(store: Store, first: int, count: int) -> None:
    async with store.transaction() as db:
        for i in range(first, first + count):
            await db.execute(
                "INSERT INTO mails(mail_id, vault, number, subject, body, from_principal,"
                " to_principal, sent, hops, thread_id, key_id, body_sha256, state, updated_at,"
                " org) VALUES (?,?,?,'s','b','human:marco@acme.com','agent:scout',"
                "'2025-01-31T09:00:00Z',0,?,'k','h','mail:new',0,'acme')",
                (f"m{i}", f"acme/vault-{i % 7}", i, f"m{i}"))


async def test_the_mail_of_an_issue_is_read_by_index_however_many_mails(
        tmp_path: Path, database_url: str) -> None:
    """Every `issues` delivery asks for the mail of its issue (`mails.mail_at`), the vault's
    name in any case (`lower(vault)`): no index held that, and each asked read every mail
    the index holds (at 100,000 mails, milliseconds a delivery, on the one writer's
    connection)."""
    store = await open_store(database_url or tmp_path / "index.sqlite3")
    try:
        await _mails(store, 0, 50)
        found = await mails.mail_at(store, "ACME/Vault-3", 45)
        assert found is not None and found.mail_id == "m45"
        assert await mails.mail_at(store, "acme/vault-4", 45) is None
        assert "mails_vault_lower" in await _indexes_read(
            store, database_url, mails.MAIL_AT, ("ACME/Vault-3", 45))
        if store.engine == "sqlite":  # counted, not timed: the same with 40 times the mails
            small, _ = await sqlite_steps(store, lambda: mails.mail_at(store, "acme/vault-3", 45))
            await _mails(store, 50, 2000)
            large, again = await sqlite_steps(
                store, lambda: mails.mail_at(store, "acme/vault-3", 45))
            assert again == found and large <= small + 10, (small, large)
    finally:
        await store.close()


async def test_the_orgs_of_an_installation_are_read_by_index_however_many_installed(
        tmp_path: Path, database_url: str) -> None:
    """Every `issues` delivery asks which orgs its installation is on
    (`installations.orgs_of_installation`): the table was read whole, in the order of its
    orgs, each time; an app installed on thousands of orgs read thousands of rows a
    delivery."""
    store = await open_store(database_url or tmp_path / "index.sqlite3")
    try:
        async with store.transaction() as db:
            for i in range(500):
                await db.execute("INSERT INTO installations(org, installation_id, removed_at)"
                                 " VALUES (?,?,?)", (f"org-{i:03d}", 1000 + i % 250,
                                                     None if i < 400 else 1.0))
        assert await installations.orgs_of_installation(store, 1010) == ["org-010", "org-260"]
        assert await installations.orgs_of_installation(store, 1160) == ["org-160"], \
            "one removed since is not"
        assert "installations_installation" in await _indexes_read(
            store, database_url, installations.ORGS_OF_INSTALLATION, (1010,))
    finally:
        await store.close()


async def test_whether_more_waits_about_an_issue_is_read_by_index_whatever_the_backlog(
        tmp_path: Path, database_url: str) -> None:
    """An `issues.opened` taken as delivered first asks whether anything else about its issue
    waits (`others_about`): the pending and the parked rows of that issue. Its `state IN`
    read every delivery in either state, a backlog's worth, through the state's index; the
    issue's pending and parked rows each have an index (`queue_held`, `queue_parked`)."""
    store = await open_store(database_url or tmp_path / "index.sqlite3")
    try:
        async with store.transaction() as db:
            for i, (key, state) in enumerate([("acme/v#1", "pending"), ("acme/v#2", "parked"),
                                              ("acme/v#3", "done"), *[
                                                  (f"acme/v#{100 + i}", "pending")
                                                  for i in range(300)]]):
                await db.execute("INSERT INTO queue(guid, event, issue_key, payload, state,"
                                 " next_at, created_at) VALUES (?,'issues',?,'{}',?,0,0)",
                                 (f"d{i}", key, state))
        assert await store.others_about("acme/v#1", "elsewhere")
        assert not await store.others_about("acme/v#1", "d0"), "its own row is not another"
        assert await store.others_about("ACME/v#2", "d0")
        assert not await store.others_about("acme/v#3", "d0"), "a finished one waits no more"
        assert not await store.others_about("acme/v#4", "d0")
        assert {"queue_held", "queue_parked"} <= await _indexes_read(
            store, database_url, OTHERS_ABOUT, ("acme/v#1", "d9") * 2)
    finally:
        await store.close()


async def test_sqlites_connection_keeps_the_pages_a_delivery_touches(tmp_path: Path) -> None:
    """SQLite's page cache is 2 MiB unless asked: the pages a delivery's writes touch (a dozen
    tables and their indexes) were read back from the file for every few deliveries, twice
    the reads of a 16 MiB cache in bench.probot_compare. The index's connection asks for
    16 MiB."""
    store = await open_store(tmp_path / "index.sqlite3")
    try:
        row = await store.fetchone("PRAGMA cache_size")
        assert row is not None and row[0] == -CACHE_KIB == -16 * 1024
    finally:
        await store.close()
