"""Races the one global write lock used to rule out, and which writers side by side must rule
out by other means (issue 22), each staged on a real PostgreSQL server: a stalled replica, a
reindex beside a move, redeliveries taken in by two replicas, a rolling deploy beside the
previous release, one issue's deliveries numbered on two replicas."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import asyncpg
import pytest

from bot.store import ledger, mails
from bot.store.db import Store
from bot.store.queue import DEAD_AFTER, issue_key
from tests import pg
from tests.support import until

HANG_GUARD = 60.0


@pytest.fixture
async def replicas() -> AsyncIterator[tuple[str, list[Store]]]:
    """Three replicas' stores on one fresh PostgreSQL database, and its URL."""
    async with pg.replicas(3) as (url, stores):
        yield url, stores


def _delivery(n: int, issue: int) -> tuple[dict[str, Any], bytes]:
    payload = {"action": "edited", "issue": {"number": issue},
               "repository": {"full_name": "acme/scout-vault"}, "n": n}
    return payload, json.dumps(payload).encode()


async def test_a_stalled_replica_holding_offices_ledger_keys_does_not_kill_another(
        replicas: tuple[str, list[Store]]) -> None:
    """A hosted App: many offices. Replica a stalls (a GC pause, a frozen VM) with a
    transaction open in each of 16 offices, each having appended to its office's ledger.
    Replica b, healthy, has claimed a delivery and goes on with those offices' ordinary
    traffic: one writer per office reaches the database and waits there on `ledger:<org>`,
    each holding one of b's writer permits. b's heartbeat waits for no permit, so c never takes
    b's delivery over while b runs it; and the server ends a's stalled sessions before
    DEAD_AFTER (IDLE_IN_TRANSACTION), so a 17th office's write on b goes through. (The stall
    lasts DEAD_AFTER and a second: the time is the fault staged, not a wait for a result.)"""
    url, (a, b, c) = replicas
    assert await b.enqueue_delivery("d1", "issues", *_delivery(1, 7))
    [mine] = await b.due_items(limit=1)
    orgs = [f"office{n}" for n in range(16)]
    release = asyncio.Event()
    holders: list[int] = []

    async def stall(org: str) -> None:
        async with a.transaction(ledger.key(org)) as db:
            await ledger.append(db, "mail.sent", "agent:scout", f"{org}/scout-vault#1", org=org)
            holders.append(int((await db.fetchone("SELECT pg_backend_pid() AS pid"))["pid"]))
            await release.wait()

    stalling = [asyncio.create_task(stall(org)) for org in orgs]
    await until(lambda: len(holders) == len(orgs), timeout=HANG_GUARD)
    traffic = [asyncio.create_task(ledger.record(b, "mail.sent", "agent:scout",
                                                 f"{org}/scout-vault#{n}", org=org))
               for org in orgs for n in range(2, 4)]
    await until(lambda: _all_waiting(url, holders), timeout=HANG_GUARD)
    beats = {"replica-1": 0, "replica-2": 0}

    async def beating(store: Store) -> None:  # as bot.app.replica beats: every HEARTBEAT
        while True:
            await store.heartbeat()
            beats[store.replica_id] += 1
            await asyncio.sleep(0.3)

    beaters = [asyncio.create_task(beating(s)) for s in (b, c)]
    # and another office's write on b, which the change promises never waits on others'
    globex = asyncio.create_task(ledger.record(b, "mail.sent", "agent:scout",
                                               "globex/scout-vault#1", org="globex"))
    await asyncio.sleep(DEAD_AFTER + 1.0)
    globex_done = globex.done()
    live = {r["id"] for r in await c.live_replicas()}
    taken = [i.guid for i in await c.due_items(limit=5)]
    release.set()
    for beater in beaters:
        beater.cancel()
    await asyncio.gather(*stalling, *beaters, globex, *traffic, return_exceptions=True)
    assert ("replica-1" in live, mine.guid in taken, globex_done) == (True, False, True), (
        f"beats made: {beats}; live: {sorted(live)}; c took over {taken} while b still runs"
        f" {mine.guid}; globex's write on b done: {globex_done}")


async def _all_waiting(url: str, holders: list[int]) -> bool:
    counts = [await pg.waiting_behind(url, h) for h in holders]
    return all(n >= 1 for n in counts)


def _mail(n: int, to: str) -> mails.MailRecord:
    return mails.MailRecord(
        mail_id=f"m{n}", vault="acme/scout-vault", number=n, subject=f"Mail {n}", body="Hi",
        from_principal="human:marco", to_principal=to,
        sent="2026-12-04T00:00:00Z", hops=0, in_reply_to=None, thread_id=f"t{n}",
        key_id="k", body_sha256="0" * 64, state="mail:new")


async def test_a_reindex_and_a_mail_move_never_deadlock(
        replicas: tuple[str, list[Store]]) -> None:
    """A mail move (set_state: `mailbox:` key, then the mail's row) on one replica while a
    reindex (replace_all: DELETE every mail row of the vault, then put_mail, which takes each
    recipient's `mailbox:` key) runs on another: the reindex holds the row and waits for the
    key, the move holds the key and waits for the row."""
    url, (a, b, _) = replicas
    async with a.transaction() as db:
        await mails.put_mail(db, _mail(1, "agent:scout"))
    keyed, go = asyncio.Event(), asyncio.Event()
    holder: list[int] = []

    async def move() -> None:
        # as Mailer._move_locked: the recipient's box key (and the ledger's) named up front
        async with a.transaction(mails.box_key("acme", "agent:scout"), ledger.key("acme")) as db:
            holder.append(int((await db.fetchone("SELECT pg_backend_pid() AS pid"))["pid"]))
            keyed.set()
            await go.wait()
            await mails.set_state(db, "m1", "mail:working", expected="mail:new")

    moving = asyncio.create_task(move())
    await asyncio.wait_for(keyed.wait(), HANG_GUARD)
    reindex = asyncio.create_task(
        mails.replace_all(b, [_mail(1, "agent:scout")], ["acme/scout-vault"]))
    await until(lambda: pg.waiting_behind(url, holder[0]), timeout=HANG_GUARD)
    go.set()
    results = await asyncio.gather(moving, reindex, return_exceptions=True)
    errors = [r for r in results if isinstance(r, BaseException)]
    assert not errors, f"deadlock: {errors!r}"


async def test_two_replicas_taking_in_one_set_of_redeliveries_never_deadlock(
        replicas: tuple[str, list[Store]]) -> None:
    """The forge redelivers a set of deliveries to two replicas at once (reconcile asked for
    them; a balancer spreads them), arriving in another order at each. Each replica's group
    commit inserts its batch with one INSERT .. ON CONFLICT DO NOTHING, in arrival order: a
    inserts g0 and waits on b's uncommitted g199, b inserts g199 and waits on a's g0."""
    url, (a, b, _) = replicas
    from bot.store.queue import _Arrival  # noqa: PLC0415
    loop = asyncio.get_running_loop()

    def batch(order: list[int]) -> list[Any]:
        out = []
        for n in order:
            payload, raw = _delivery(n, n)
            out.append(_Arrival(f"g{n}", "issues", payload, raw, loop.create_future()))
        return out

    async def insert(store: Store, order: list[int]) -> None:
        async with store.transaction() as db:
            await store._insert_arrivals(db, batch(order))

    # (each row a millisecond slower, so that two statements surely overlap: the race, made
    # certain; without it, about one pair of 500-delivery batches in fifteen deadlocks here)
    conn = await asyncpg.connect(url)
    try:
        await conn.execute(
            "CREATE FUNCTION review_slow() RETURNS trigger LANGUAGE plpgsql AS"
            " $$ BEGIN PERFORM pg_sleep(0.001); RETURN NEW; END $$;"
            " CREATE TRIGGER review_slow BEFORE INSERT ON deliveries FOR EACH ROW"
            " EXECUTE FUNCTION review_slow()")
    finally:
        await conn.close()
    order = list(range(300))
    results = await asyncio.gather(insert(a, order), insert(b, order[::-1]),
                                   return_exceptions=True)
    errors = [r for r in results if isinstance(r, BaseException)]
    assert not errors, f"{len(errors)} batches failed: {errors[:1]!r}"


async def test_a_replica_of_the_previous_release_and_one_of_this_keep_a_chain_whole(
        replicas: tuple[str, list[Store]]) -> None:
    """A rolling deploy runs the previous release beside this one. The previous release
    appends under its global write lock (0x766D0001), taken exclusively; this release's
    writers take it shared: this release's append waits for the old one's, the chain stays
    one chain."""
    url, (a, b, _) = replicas
    await ledger.record(a, "mail.sent", "agent:scout", "acme/scout-vault#1", org="acme")
    conn = await asyncpg.connect(url)  # the previous release's replica, as it wrote
    try:
        # it is alive (its row names no named_locks: from before schema 16), so this
        # release's writers take the old lock shared
        await conn.execute("INSERT INTO replicas(id, url, started_at, seen_at, steady_since,"
                           " incarnation, named_locks) VALUES ('previous', NULL, vm_now(),"
                           " vm_now()+60, vm_now(), 'x', NULL)")
        async with conn.transaction():
            await conn.execute("SELECT pg_advisory_xact_lock($1)", 0x766D_0001)
            holder = int(await conn.fetchval("SELECT pg_backend_pid()"))
            prev = await conn.fetchval("SELECT hash FROM ledger WHERE chain='acme'"
                                       " ORDER BY seq DESC LIMIT 1")
            newer = asyncio.create_task(ledger.record(b, "mail.sent", "agent:scout",
                                                      "acme/scout-vault#2", org="acme"))
            await until(lambda: pg.waiting_behind(url, holder), timeout=HANG_GUARD)
            assert not newer.done(), "this release's append waits for the old one's"
            t, data = 1.0, "{}"
            await conn.execute(
                "INSERT INTO ledger(time, event, actor, subject, data, prev_hash, hash, org,"
                " chain) VALUES ($1,'mail.sent','agent:scout','acme/scout-vault#3',$2,$3,$4,"
                "'acme','acme')", t, data, prev,
                ledger._digest(prev, t, "mail.sent", "agent:scout", "acme/scout-vault#3",
                               data, "acme"))
    finally:
        await conn.close()
    await asyncio.wait_for(newer, HANG_GUARD)
    assert await ledger.verify_chain(a, "acme") is None, "acme's chain forked"


async def test_one_issues_deliveries_run_in_the_order_they_were_taken_in(
        replicas: tuple[str, list[Store]]) -> None:
    """Two deliveries about one issue (a comment created, then deleted) reach two replicas a
    moment apart. a numbers the first, its group commit not yet committed; b's numbering of
    the second waits for it (the issue's intake key: parked), and a claim meanwhile skips the
    issue: the created one runs before the deleted one."""
    url, (a, b, c) = replicas
    from bot.store.queue import _Arrival  # noqa: PLC0415
    loop = asyncio.get_running_loop()
    numbered, go = asyncio.Event(), asyncio.Event()
    holder: list[int] = []

    async def first() -> None:
        payload, raw = _delivery(1, 7)
        async with a.transaction() as db:
            await a._insert_arrivals(db, [_Arrival("created", "issue_comment", payload, raw,
                                                   loop.create_future())])
            holder.append(int((await db.fetchone("SELECT pg_backend_pid() AS pid"))["pid"]))
            numbered.set()
            await go.wait()

    taking = asyncio.create_task(first())
    await asyncio.wait_for(numbered.wait(), HANG_GUARD)
    second = asyncio.create_task(b.enqueue_delivery("deleted", "issue_comment",
                                                    *_delivery(2, 7)))
    key = issue_key(_delivery(2, 7)[0])
    await until(lambda: second.done() or key in b._parked, timeout=HANG_GUARD)
    ran = [item.guid for item in await c.due_items(limit=5)]
    go.set()
    await asyncio.wait_for(asyncio.gather(taking, second), HANG_GUARD)
    for _ in range(2):  # a batch, its finishes, the next claim (as the worker goes)
        for item in await c.due_items(limit=5):
            ran.append(item.guid)
            assert await c.finish(item)
    assert ran == ["created", "deleted"], f"ran {ran}"
