"""PostgreSQL: a connection goes back to the store's pool carrying nothing of what used it.

asyncpg resets a connection it takes back with one more round trip (unlock every advisory
lock, CLOSE ALL, UNLISTEN *, RESET ALL), about nine an event on the hot path. The store does
not send it (`bot.store.postgres._Pooled`): what a transaction sets or takes ends with the
transaction. These tests hold it to that on a pool of one connection, so every statement
below runs on the connection the one before it used."""

from __future__ import annotations

import hashlib
import hmac
import json
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import asyncpg
import pytest

from bot.app.embedded import start_embedded
from bot.store import postgres
from bot.store.postgres import LOCK_WAIT, PostgresStore
from tests import pg
from tests.support import app_key


@pytest.fixture
async def one_connection() -> AsyncIterator[tuple[str, PostgresStore]]:
    url = await pg.fresh_database()
    store = await PostgresStore.open(url, min_size=1, max_size=1)
    try:
        yield url, store
    finally:
        await store.close()
        await pg.drop_database(url)


async def _backend_and_timeout(store: PostgresStore) -> tuple[int, str]:
    row = await store.fetchone("SELECT pg_backend_pid() AS pid,"
                               " current_setting('lock_timeout') AS wait")
    assert row is not None
    return int(row["pid"]), str(row["wait"])


async def test_what_a_transaction_set_and_held_ends_with_it(
        one_connection: tuple[str, PostgresStore]) -> None:
    url, store = one_connection
    before, default = await _backend_and_timeout(store)
    assert default == f"{int(LOCK_WAIT)}s"
    async with store.transaction("office:acme", "mail:1") as db:
        await db.execute("SET LOCAL lock_timeout = '5ms'")
        inside = await db.fetchone("SELECT pg_backend_pid() AS pid,"
                                   " current_setting('lock_timeout') AS wait")
        assert inside is not None and inside["wait"] == "5ms"
    after, wait = await _backend_and_timeout(store)
    assert after == before == inside["pid"]  # the same connection all along
    assert wait == default
    observer = await asyncpg.connect(url)
    try:
        held = await observer.fetchval(
            "SELECT count(*) FROM pg_locks WHERE locktype='advisory' AND pid=$1", after)
    finally:
        await observer.close()
    assert held == 0


async def test_a_failed_transaction_leaves_the_connection_usable(
        one_connection: tuple[str, PostgresStore]) -> None:
    _, store = one_connection
    with pytest.raises(asyncpg.PostgresError):
        async with store.transaction("office:acme") as db:
            await db.execute("SELECT no_such_function()")
    pid, wait = await _backend_and_timeout(store)
    assert pid > 0 and wait == f"{int(LOCK_WAIT)}s"


async def test_a_webhooks_payload_is_stored_compressed_with_lz4(
        tmp_path: Path, postgres_url: str, session: aiohttp.ClientSession) -> None:
    """GitHub's own `issues.opened` example (12 KB of JSON), posted signed over HTTP, is queued
    compressed with lz4 where the server has it (FAST_COMPRESSION: a third of pglz's cost)."""
    examples = json.loads((Path(__file__).parent / "conformance" / "data"
                           / "github-webhook-examples.json").read_text())
    opened = next(e for hook in examples if hook["name"] == "issues"
                  for e in hook["examples"] if e.get("action") == "opened")
    body = json.dumps(opened).encode()
    observer = await asyncpg.connect(postgres_url)
    emb = await start_embedded(data_dir=tmp_path, port=0, forge_port=0,
                               database_url=postgres_url, app_key=app_key())
    try:
        secret = emb.services.settings.webhook_secret.encode()
        async with session.post(emb.app_url + "/webhook", data=body, headers={
                "X-GitHub-Event": "issues", "X-GitHub-Delivery": str(uuid.uuid4()),
                "Content-Type": "application/json", "X-Hub-Signature-256": "sha256=" + hmac.new(
                    secret, body, hashlib.sha256).hexdigest()}) as resp:
            assert resp.status == 202, await resp.text()
        has_lz4 = await observer.fetchval(
            "SELECT 'lz4'=ANY(enumvals) FROM pg_settings WHERE name='default_toast_compression'")
        stored = await observer.fetchval("SELECT pg_column_compression(payload) FROM queue"
                                         " WHERE event='issues'")
    finally:
        await emb.stop()
        await observer.close()
    assert stored == ("lz4" if has_lz4 else "pglz")


async def test_a_new_connection_asks_the_server_about_the_array_types_once_and_compiles_nothing(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """asyncpg asks the server about an array type it has no codec for (a cold catalog query,
    10-20 ms of a new session's time, then the statement prepared again) once per set of such
    types a statement brings. The store's statements pass bigint[], float8[] and int[]: a new
    pooled connection asks about them together before it serves anything, and nothing a
    session of the store runs is JIT-compiled."""
    asked: list[list[int]] = []
    introspect = asyncpg.Connection._introspect_types

    async def counted(self: asyncpg.Connection, typeoids: object, timeout: object) -> object:
        asked.append(sorted(typeoids))  # type: ignore[call-overload]
        return await introspect(self, typeoids, timeout)

    monkeypatch.setattr(asyncpg.Connection, "_introspect_types", counted)
    # (what sessions of this process learnt before is set aside: they would ask nothing)
    monkeypatch.setattr(postgres, "_BUILT_IN_TYPES", {})
    url = await pg.fresh_database(migrated=True)
    store = await PostgresStore.open(url, min_size=1, max_size=1)
    try:
        async with store.transaction() as db:  # statements of the store's that pass each
            await db.fetchall("SELECT id FROM queue WHERE id = ANY(?::bigint[])", ([1, 2],))
            await db.fetchall("SELECT * FROM unnest(?::int[], ?::int[])", ([1], [2]))
            await db.fetchall("SELECT * FROM unnest(?::float8[])", ([1.5],))
        row = await store.fetchone("SELECT current_setting('jit') AS jit")
    finally:
        await store.close()
        await pg.drop_database(url)
    assert len(asked) == 1, asked
    assert row is not None and row["jit"] == "off"


async def test_a_second_store_asks_the_server_nothing_about_the_built_in_types(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The built-in types are the same on every server and in every database: what one session
    of the process learnt of them (its pool's first connection asking about the arrays the
    store passes), a second store's sessions, on another database, take as it is (a test's
    next database; a replica's pool filled again after an outage), and ask the server nothing:
    each ask is a cold catalog query, 10-20 ms of a new session's time."""
    asked: list[list[int]] = []
    introspect = asyncpg.Connection._introspect_types

    async def counted(self: asyncpg.Connection, typeoids: object, timeout: object) -> object:
        asked.append(sorted(typeoids))  # type: ignore[call-overload]
        return await introspect(self, typeoids, timeout)

    monkeypatch.setattr(asyncpg.Connection, "_introspect_types", counted)
    monkeypatch.setattr(postgres, "_BUILT_IN_TYPES", {}, raising=False)  # (learnt none yet)
    for _ in range(2):
        url = await pg.fresh_database(migrated=True)
        store = await PostgresStore.open(url, min_size=1, max_size=1)
        try:
            async with store.transaction() as db:
                rows = await db.fetchall("SELECT * FROM unnest(?::bigint[], ?::int[],"
                                         " ?::float8[]) AS t(b, i, f)", ([2**40], [7], [1.5]))
            assert [tuple(r) for r in rows] == [(2**40, 7, 1.5)]
        finally:
            await store.close()
            await pg.drop_database(url)
    assert len(asked) == 1, asked
