"""Lock numbers no office can choose (bot.store.locks). Lock names hold tenant-chosen text (an
idempotency key, an outbound URL); PostgreSQL's hashtextextended, which numbered them before,
runs backwards (tests/lookup3.py), so an office could choose a name whose lock was the one
every transaction holds shared, or another office's key (found by review; each test below
failed on the tree before). And the older releases' numbers, taken while one of their
replicas lives (a rolling deploy), so that the two still exclude each other.

Waits are read from the server (`pg_blocking_pids`), never from the clock; a held-up claim
stands for a paused replica, as in tests/test_store_concurrency.py."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import asyncpg
import pytest

from bot.store import ledger
from bot.store.db import Store
from bot.store.idempotency import _key_lock
from bot.store.locks import RELEASE_1_WRITE_LOCK, lock_pair, lock_pair_sql, named_lock_pair
from bot.store.postgres import NAMED_SEED
from tests import pg
from tests.lookup3 import chosen, hashtextextended
from tests.support import until

HANG_GUARD = 60.0
SCOPE = "tool:mail_send:acme:agent:scout"  # an acme agent's mail_send calls (tools.registry)


@pytest.fixture
async def replicas() -> AsyncIterator[tuple[str, list[Store]]]:
    async with pg.replicas(2) as (url, stores):
        yield url, stores


@contextlib.asynccontextmanager
async def _session(url: str) -> AsyncIterator[asyncpg.Connection]:
    conn = await asyncpg.connect(url)
    try:
        yield conn
    finally:
        await conn.close()


async def _older_replica(url: str, kind: int | None = 2) -> None:
    """A live replica of an older release joins: schema 16's (`kind` 2, numbering by
    hashtextextended), or one from before it (None)."""
    async with _session(url) as conn:
        await conn.execute("INSERT INTO replicas(id, url, started_at, seen_at, steady_since,"
                           " incarnation, named_locks) VALUES ('older', NULL, vm_now(),"
                           " vm_now()+60, vm_now(), 'x', $1)", kind)  # (live for a minute)


@contextlib.asynccontextmanager
async def _acme_claim_held(store: Store, key: str) -> AsyncIterator[int]:
    """acme's claim of the idempotency key `key`, its transaction held up: its session's pid."""
    stalled, release = asyncio.Event(), asyncio.Event()
    holder: list[int] = []

    async def claim() -> None:
        async with store.transaction(_key_lock(SCOPE, key)) as db:
            await store._claim_in(db, (SCOPE, key), "fp", "c1")  # noqa: SLF001
            row = await db.fetchone("SELECT pg_backend_pid() AS pid")
            assert row is not None
            holder.append(int(row["pid"]))
            stalled.set()
            await release.wait()

    task = asyncio.create_task(claim())
    await asyncio.wait_for(stalled.wait(), HANG_GUARD)
    try:
        yield holder[0]
    finally:
        release.set()
        await asyncio.wait_for(task, HANG_GUARD)


async def _globex_waits_behind(url: str, holder: int, store: Store) -> bool:
    """Whether globex's next ledger entry (on the other replica) waits for `holder`."""
    writing = asyncio.create_task(ledger.record(store, "mail.sent", "agent:scout",
                                                "globex/scout-vault#1", org="globex"))
    await until(lambda: writing.done() or pg.waiting_behind(url, holder), timeout=HANG_GUARD)
    waits = not writing.done()
    return waits


async def test_the_numbers_are_the_servers(replicas: tuple[str, list[Store]]) -> None:
    """The attacker's model of hashtextextended is the server's, and the store's numbers are
    the same in Python and in SQL."""
    url, _ = replicas
    async with _session(url) as conn:
        for text in ("ledger:globex", _key_lock(SCOPE, "k1"), "x" * 24, "issue:acme/v#1",
                     "é中😀 " * 5, ""):
            for seed in (0, NAMED_SEED):
                assert hashtextextended(text, seed) == await conn.fetchval(
                    "SELECT hashtextextended($1, $2)", text, seed)
            row = await conn.fetchrow(f"SELECT {lock_pair_sql('$1::text')}", text)
            assert row is not None and lock_pair(text) == tuple(row)


@pytest.mark.parametrize("older", [False, True], ids=["alone", "older-replica-live"])
async def test_a_key_an_office_chose_is_never_the_lock_every_transaction_shares(
        replicas: tuple[str, list[Store]], older: bool) -> None:
    """acme's idempotencyKey whose old number is RELEASE_1_WRITE_LOCK: before, acme's claim
    took it exclusive and every transaction of every office waited; while an older release
    lives (its keys taken its way too) the fixed numbers are never taken so."""
    url, (a, b) = replicas
    if older:
        await _older_replica(url)
    key = chosen(_key_lock(SCOPE, ""), RELEASE_1_WRITE_LOCK)[len(_key_lock(SCOPE, "")):]
    async with _acme_claim_held(a, key) as holder:
        waits = await _globex_waits_behind(url, holder, b)
    assert not waits, "globex's write waited for acme's claim"


async def test_a_key_an_office_chose_is_never_another_offices_key(
        replicas: tuple[str, list[Store]]) -> None:
    url, (a, b) = replicas
    prefix = _key_lock(SCOPE, "")
    key = chosen(prefix, hashtextextended(ledger.key("globex")))[len(prefix):]
    async with _acme_claim_held(a, key) as holder:
        waits = await _globex_waits_behind(url, holder, b)
    assert not waits, "globex's ledger waited for acme's claim"


@pytest.mark.parametrize("beside", [None, "pre-16"], ids=["alone", "beside-a-pre-16-replica"])
async def test_a_named_lock_an_office_chose_is_never_another_offices_key(
        replicas: tuple[str, list[Store]], beside: str | None) -> None:
    """acme's outbound sender holds `outbound:acme:<url>` across its POSTs to acme's URL (its
    config): a URL whose schema-16 number is globex's ledger key as numbered before. This
    release's numbers are pairs no such number can be; schema 16's way is taken only while a
    schema-16 replica lives, not beside one from before it (found by review: taken where free,
    globex's transactions, which take its older ledger number while that replica lives,
    waited for acme's lock)."""
    url, (a, b) = replicas
    if beside:
        await _older_replica(url, kind=None)
    name = chosen("outbound:acme:https://hooks.acme.example/",
                  hashtextextended(ledger.key("globex")), seed=NAMED_SEED)
    high, low = named_lock_pair(name)
    async with a.named_lock(name), _session(url) as conn:
        locker = await conn.fetchval(  # the session holding it (and its older ways)
            "SELECT pid FROM pg_locks WHERE locktype='advisory' AND objsubid=2 AND granted"
            " AND classid::bigint=$1 AND objid::bigint=$2", high & 0xFFFF_FFFF,
            low & 0xFFFF_FFFF)
        waits = await _globex_waits_behind(url, int(locker), b)
    assert not waits, "globex's ledger waited while acme's outbound sender held its lock"


async def test_while_an_older_replica_lives_a_key_is_taken_its_way_too(
        replicas: tuple[str, list[Store]]) -> None:
    """A replica of schema 16's release appending to acme's ledger (its key numbered
    hashtextextended) excludes this release's appends, and they it."""
    url, (_, b) = replicas
    await _older_replica(url)
    async with _session(url) as old:
        async with old.transaction():
            await old.execute("SELECT pg_advisory_xact_lock(hashtextextended($1, 0))",
                              ledger.key("acme"))
            holder = int(await old.fetchval("SELECT pg_backend_pid()"))
            writing = asyncio.create_task(ledger.record(b, "mail.sent", "agent:scout",
                                                        "acme/scout-vault#1", org="acme"))
            await until(lambda: writing.done() or pg.waiting_behind(url, holder),
                        timeout=HANG_GUARD)
            assert not writing.done(), "acme's append ran beside the older replica's"
        await asyncio.wait_for(writing, HANG_GUARD)


async def test_while_an_older_replica_lives_a_named_lock_is_taken_its_way_too(
        replicas: tuple[str, list[Store]]) -> None:
    url, (_, b) = replicas
    await _older_replica(url)
    async with _session(url) as old:
        assert await old.fetchval("SELECT pg_try_advisory_lock(hashtextextended($1, $2))",
                                  "mail-1", NAMED_SEED)
        entered = asyncio.Event()

        async def take() -> None:
            async with b.named_lock("mail-1"):
                entered.set()

        taking = asyncio.create_task(take())
        done, _ = await asyncio.wait([taking], timeout=0.5)  # (a bounded look: stays out)
        assert not done and not entered.is_set(), "b took a mail the older replica held"
        await old.fetchval("SELECT pg_advisory_unlock(hashtextextended($1, $2))",
                           "mail-1", NAMED_SEED)
        await asyncio.wait_for(taking, HANG_GUARD)


async def test_an_older_replica_starting_mid_transaction_is_still_excluded(
        replicas: tuple[str, list[Store]]) -> None:
    """A replica of an older release that starts while a transaction runs (a rollback, an old
    pod restarting) finds the transaction's keys held its way too (found by review: whether
    one lived was read as the transaction began, and the key taken that way only then)."""
    url, (a, _) = replicas
    inside, release = asyncio.Event(), asyncio.Event()

    async def append() -> None:
        async with a.transaction(ledger.key("acme")):
            inside.set()
            await release.wait()

    task = asyncio.create_task(append())
    await asyncio.wait_for(inside.wait(), HANG_GUARD)
    try:
        await _older_replica(url)
        async with _session(url) as old, old.transaction():
            got = await old.fetchval("SELECT pg_try_advisory_xact_lock(hashtextextended($1, 0))",
                                     ledger.key("acme"))
    finally:
        release.set()
        await asyncio.wait_for(task, HANG_GUARD)
    assert not got, "the older replica took acme's ledger key while this release held it"


async def test_an_older_replica_taking_two_keys_in_order_meets_no_cycle(
        replicas: tuple[str, list[Store]]) -> None:
    """An older replica's transaction takes k:a, then k:b, its way. A transaction of this
    release of (k:a, k:b) that begins between the two waits for k:a holding nothing of k:b's
    older number (found by review: its tries took k:b past the refused k:a, then it waited
    for k:a, and the older replica's k:b waited for it: a cycle the server broke by aborting
    one)."""
    url, (a, _) = replicas
    await _older_replica(url)
    errors: list[BaseException] = []
    async with _session(url) as old:
        await old.execute("SET lock_timeout = '10s'")
        async with old.transaction():
            await old.execute("SELECT pg_advisory_xact_lock(hashtextextended($1, 0))", "k:a")
            holder = int(await old.fetchval("SELECT pg_backend_pid()"))

            async def new() -> None:
                async with a.transaction("k:a", "k:b"):
                    pass

            task = asyncio.create_task(new())
            await until(lambda: task.done() or pg.waiting_behind(url, holder),
                        timeout=HANG_GUARD)
            try:
                await old.execute("SELECT pg_advisory_xact_lock(hashtextextended($1, 0))",
                                  "k:b")
            except asyncpg.PostgresError as exc:
                errors.append(exc)
        try:
            await asyncio.wait_for(task, HANG_GUARD)
        except asyncpg.PostgresError as exc:
            errors.append(exc)
    assert not errors, f"older replica against this release's transaction: {errors!r}"


async def test_an_older_intake_of_two_issues_meets_no_cycle(
        replicas: tuple[str, list[Store]]) -> None:
    """An older replica's intake takes its issue keys its way, in order. An intake of this
    release of the same two issues, arriving between the two, waits for #1 holding nothing
    of #2's older number (found by review: its tries held #2 past the refused #1)."""
    import json

    url, (a, _) = replicas
    await _older_replica(url)

    def payload(n: int) -> dict[str, object]:
        return {"action": "opened", "issue": {"number": n}, "repository": {"full_name": "o/r"}}

    async with _session(url) as old:
        async with old.transaction():
            await old.execute("SELECT pg_advisory_xact_lock(hashtextextended($1, 0))",
                              "issue:o/r#1")
            holder = int(await old.fetchval("SELECT pg_backend_pid()"))
            taking_in = asyncio.ensure_future(asyncio.gather(*(
                a.enqueue_delivery(f"d{n}", "issues", payload(n),
                                   json.dumps(payload(n)).encode()) for n in (1, 2))))
            async def waits() -> bool:  # #2 in, #1 waiting for the older intake
                return taking_in.done() or await pg.waiting_behind(url, holder) > 0 or (
                    "o/r#1" in a._parked and await a.fetchone(
                        "SELECT 1 FROM queue WHERE guid='d2'") is not None)

            await until(waits, timeout=HANG_GUARD)
            assert await old.fetchval(
                "SELECT pg_try_advisory_xact_lock(hashtextextended($1, 0))", "issue:o/r#2"), \
                "the waiting intake holds issue:o/r#2's older number"
        await asyncio.wait_for(taking_in, HANG_GUARD)


_RELEASE_1_HELD = ("SELECT count(*) FROM pg_locks WHERE locktype='advisory' AND classid=0"
                   " AND objsubid=1 AND objid::bigint=$1")


async def test_with_no_replica_of_the_first_release_no_transaction_takes_its_write_lock(
        replicas: tuple[str, list[Store]]) -> None:
    """The first release's global write lock, taken shared by every transaction, was one lock
    every office's writes touched (found by review): it is taken only while a replica that
    may be of the first release (one from before schema 16, its `named_locks` none) lives."""
    url, (a, _) = replicas
    async with a.transaction("ledger:acme") as db:
        await db.execute("SELECT 1")
        async with _session(url) as conn:
            assert await conn.fetchval(_RELEASE_1_HELD, RELEASE_1_WRITE_LOCK) == 0


async def test_a_live_replica_of_the_first_release_still_excludes_this_releases_writes(
        replicas: tuple[str, list[Store]]) -> None:
    """While a replica from before schema 16 lives (the first release among them), its
    writes, each under the write lock taken exclusive, exclude this release's, and the
    reverse (rolling deploys)."""
    url, (a, b) = replicas
    await _older_replica(url, kind=None)
    async with _session(url) as old:
        async with old.transaction():
            await old.execute("SELECT pg_advisory_xact_lock($1)", RELEASE_1_WRITE_LOCK)
            writing = asyncio.create_task(ledger.record(b, "mail.sent", "agent:scout",
                                                        "globex/scout-vault#1", org="globex"))
            pid = int(await old.fetchval("SELECT pg_backend_pid()"))
            await until(lambda: pg.waiting_behind(url, pid), timeout=HANG_GUARD)
            assert not writing.done()
        await asyncio.wait_for(writing, HANG_GUARD)
        async with a.transaction() as db:  # and this release's write holds the old one off
            await db.execute("SELECT 1")
            assert await old.fetchval(
                "SELECT pg_try_advisory_lock($1)", RELEASE_1_WRITE_LOCK) is False
