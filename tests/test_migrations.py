"""The index's schema history (bot/store/migrations.py) on both engines: an index left at
version 1, the first release, with a delivery waiting in it, upgrades in place when the app
opens it, keeps what it held, and records each version once, also when several replicas
open it at the same moment."""

from __future__ import annotations

import asyncio
import json
import sqlite3
from pathlib import Path

import asyncpg

from bot.store import open_store, postgres, sqlite
from bot.store.migrations import NAMES

PAYLOAD = {"action": "opened", "issue": {"number": 1},
           "repository": {"full_name": "acme/scout-vault"}}
WAITING = ("INSERT INTO queue(guid, event, installation_id, issue_key, payload, next_at,"
           " created_at) VALUES ('g-old', 'issues', 1, 'acme/scout-vault#1', ?, 0, 0)")


def _version_one_sqlite(path: Path) -> None:
    sqlite._migrate_file(str(path), upto=1)
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        conn.execute(WAITING, (json.dumps(PAYLOAD),))
    finally:
        conn.close()


async def _version_one_postgres(url: str) -> None:
    await postgres._migrate(url, upto=1)
    conn = await asyncpg.connect(url)
    try:
        await conn.execute(WAITING.replace("?", "$1"), json.dumps(PAYLOAD))
    finally:
        await conn.close()


async def test_an_index_at_the_first_release_upgrades_in_place_and_keeps_what_it_held(
        tmp_path: Path, empty_database_url: str) -> None:
    target = empty_database_url or str(tmp_path / "index.sqlite3")
    if empty_database_url:
        await _version_one_postgres(empty_database_url)
    else:
        _version_one_sqlite(tmp_path / "index.sqlite3")
    # three replicas start at once: one applies what is missing, the others find it done
    opened = await asyncio.gather(*(open_store(target) for _ in range(3)),
                                  return_exceptions=True)
    stores = [s for s in opened if not isinstance(s, BaseException)]
    try:
        assert len(stores) == 3, f"each replica opens it: {opened}"
        store = stores[0]
        rows = await store.fetchall("SELECT version, name FROM schema_migrations"
                                    " ORDER BY version")
        assert [r["version"] for r in rows] == sorted(NAMES), "each version recorded once"
        assert rows[-1]["name"] == NAMES[max(NAMES)]
        await store.join("replica-a")  # version 2's tables are there
        [waiting] = await store.due_items(limit=10)  # the delivery left waiting is claimed
        assert waiting.guid == "g-old" and waiting.payload == PAYLOAD
        assert (await store.fetchone("SELECT lease_owner FROM queue"))["lease_owner"] == \
            "replica-a"
    finally:
        await asyncio.gather(*(s.close() for s in stores))
    again = await open_store(target)  # and opening an index already current changes nothing
    try:
        assert len(await again.fetchall("SELECT version FROM schema_migrations")) == len(NAMES)
    finally:
        await again.close()


async def test_an_index_another_process_is_writing_is_waited_for_as_it_opens(
        tmp_path: Path) -> None:
    """Turning an index of the first release (a rollback journal) to WAL needs it alone, and
    SQLite answers "database is locked" at once, without the connection's 30 s wait, while
    another connection holds a write open on it (another replica or command migrating it:
    acted out, three replicas opening one such index at once failed one time in 20-40). The
    store waits for it as for any lock, and a failed open leaves no connection behind (its
    thread kept the process from exiting)."""
    path = tmp_path / "index.sqlite3"
    _version_one_sqlite(path)
    writer = sqlite3.connect(path, isolation_level=None)
    writer.execute("BEGIN IMMEDIATE")  # (a write under way: its RESERVED lock)
    opening = asyncio.create_task(open_store(str(path)))
    try:
        done, _ = await asyncio.wait({opening}, timeout=1.0)
        assert not done, f"refused while another wrote, not waited for: {opening.exception()}"
    finally:
        writer.execute("COMMIT")
        writer.close()
    store = await opening
    try:
        assert (await store.fetchone("PRAGMA journal_mode"))[0] == "wal"
    finally:
        await store.close()


def test_a_command_that_opens_a_fresh_index_first_makes_every_table(tmp_path: Path) -> None:
    """`vaultmail token create` on a new data directory, before the app ever ran there: the
    index it makes (and the versions it records) hold every table of every version, not only
    those of the modules the command imports (a later version's columns go on tables an
    earlier version made)."""
    import subprocess
    import sys

    script = ("import asyncio, sys\nfrom bot.store import open_store\n"
              "async def main():\n    s = await open_store(sys.argv[1])\n    await s.close()\n"
              "asyncio.run(main())\n")
    path = tmp_path / "index.sqlite3"
    done = subprocess.run([sys.executable, "-c", script, str(path)], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    conn = sqlite3.connect(path)
    try:
        tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    finally:
        conn.close()
    assert {"chats", "comments", "threads", "items", "outbound_cursors", "forge_writes",
            "console_sessions", "stranger_replies", "installations"} <= tables, tables


def test_every_module_that_registers_tables_is_loaded_before_the_migrations_are_read() -> None:
    """`bot.store` loads its modules when named (the CLI's start-up time), so whatever opens
    the index first makes every table only if `TABLES` names each module that registers one."""
    import re

    from bot.store.migrations import TABLES

    store = Path(__file__).resolve().parent.parent / "bot" / "store"
    registering = {path.stem for path in store.glob("*.py")
                   if re.search(r"^register_(schema|columns|backfill)\(",
                                path.read_text(), re.MULTILINE)}
    assert registering and registering <= set(TABLES), sorted(registering - set(TABLES))
