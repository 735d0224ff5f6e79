"""Replicas write side by side (issue 22): no lock is shared by every write, so one office's
writer never waits on another office's, while what must stay ordered stays ordered: one office's
ledger chain, one issue's deliveries, one delivery id, one idempotency key.

The waits are read from the database itself (`pg_stat_activity`, `pg_blocking_pids`), never from
the clock: a writer held up is one the server shows waiting for a lock."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import random
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import asyncpg
import pytest

from bot.store import installations, ledger, mails, sessions, strangers
from bot.store.db import Store, hold
from bot.store.locks import lock_pair
from bot.store.prune import DAY, prune
from bot.store.queue import in_order, issue_key
from bot.store.sql import Connection
from tests import pg
from tests.support import until

HANG_GUARD = 60.0  # seconds: only a writer stuck behind another office's lock takes this long


@pytest.fixture
async def replicas() -> AsyncIterator[tuple[str, list[Store]]]:
    """Four replicas' stores on one fresh PostgreSQL database, and its URL."""
    async with pg.replicas(4) as (url, stores):
        yield url, stores


def _delivery(n: int, issue: int, org: str = "acme") -> tuple[dict[str, Any], bytes]:
    payload = {"action": "edited", "issue": {"number": issue},
               "repository": {"full_name": f"{org}/scout-vault"}, "n": n}
    return payload, json.dumps(payload).encode()


async def test_an_offices_writer_held_up_never_holds_up_another_offices_writes(
        replicas: tuple[str, list[Store]]) -> None:
    """acme's writer stalls mid-transaction, its ledger entry appended and not committed.
    globex, on another replica, takes deliveries in, claims them, runs an idempotent write,
    appends to its own chain and finishes them, all while acme's writer holds what it holds;
    the server shows only acme's next ledger writer waiting, and for acme's."""
    url, (a, b, *_) = replicas

    async def acme_writes(db: Connection) -> None:
        await ledger.append(db, "mail.sent", "agent:scout", "acme/scout-vault#1", org="acme")

    writer, pid, release = await _paused(a, acme_writes)

    async def globex_burst() -> None:
        for n in range(20):
            assert await b.enqueue_delivery(f"globex-{n}", "issues", *_delivery(n, n % 3,
                                                                               "globex"))
        done = 0
        while done < 20:
            for item in await b.due_items(limit=8):
                result = await b.once("forge", f"globex:{item.guid}", "fp",
                                      lambda: asyncio.sleep(0, {"ok": True}))
                assert result == {"ok": True}
                await ledger.record(b, "mail.sent", "agent:scout",
                                    "globex/scout-vault#1", org="globex")
                assert await b.finish(item)
                done += 1

    await asyncio.wait_for(globex_burst(), HANG_GUARD)
    assert await pg.waiting_behind(url, pid) == 0, "nothing of globex's waited on acme's"
    # acme's own next entry does wait: one office's chain is appended one entry at a time
    second = asyncio.create_task(ledger.record(b, "mail.sent", "agent:scout",
                                               "acme/scout-vault#2", org="acme"))
    await until(_one_waits(url, pid), timeout=HANG_GUARD)
    release.set()
    await asyncio.wait_for(asyncio.gather(writer, second), HANG_GUARD)
    for org in ("acme", "globex"):
        assert await ledger.verify_chain(a, org) is None
    assert len(await a.fetchall("SELECT 1 FROM ledger WHERE chain='acme'")) == 2
    assert len(await a.fetchall("SELECT 1 FROM ledger WHERE chain='globex'")) == 20


async def _holds(url: str, holder: int) -> bool:
    """Whether session `holder` is still inside its transaction (the server ends one left
    idle in it for long: then what it held is gone)."""
    conn = await asyncpg.connect(url)
    try:
        return bool(await conn.fetchval("SELECT count(*) FROM pg_stat_activity WHERE pid=$1"
                                        " AND state='idle in transaction'", holder))
    finally:
        await conn.close()


async def _waiting_inside_transactions(url: str, holder: int) -> int:
    """How many sessions wait for a lock `holder` holds other than by the parked intake's
    wait, a statement of its own outside any transaction (`QueueMixin._until_free`), which
    holds no writer's turn and nothing once it returns."""
    conn = await asyncpg.connect(url)
    try:
        return int(await conn.fetchval(
            "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type='Lock'"
            " AND $1 = ANY(pg_blocking_pids(pid))"
            " AND query NOT LIKE 'SELECT set_config(''lock_timeout''%'", holder))
    finally:
        await conn.close()


def _one_waits(url: str, holder: int) -> Any:
    async def check() -> bool:
        return await pg.waiting_behind(url, holder) == 1
    return check


@pytest.mark.parametrize("other", [("globex", 7), ("acme", 2)],
                         ids=["another-office", "another-issue"])
async def test_a_delivery_taken_in_never_waits_for_a_claim(
        replicas: tuple[str, list[Store]], other: tuple[str, int]) -> None:
    """A claim held up (a replica paused inside it) holds up no intake: not of its issue, and
    not of what is taken in with it (found by review: intake waited for each issue of its
    batch that a claim on another replica was deciding on, and every delivery of the batch
    with it, globex's too; it now waits for other intakes of an issue alone)."""
    url, (a, b, _, _) = replicas
    assert await a.enqueue_delivery("acme-1", "issues", *_delivery(1, 1))
    stalled, release = asyncio.Event(), asyncio.Event()
    holder: list[int] = []

    async def stall(db: Any, items: list[Any]) -> None:  # inside the claim, after its choice
        row = await db.fetchone("SELECT pg_backend_pid() AS pid")
        holder.append(int(row["pid"]))
        stalled.set()
        await release.wait()

    claiming = asyncio.create_task(a.finish_and_claim([], 8, then=stall))
    await asyncio.wait_for(stalled.wait(), HANG_GUARD)
    org, issue = other
    # b takes in, together (one group commit), a later delivery about acme's issue #1 and one
    # about `other`
    taking_in = [asyncio.create_task(b.enqueue_delivery("acme-2", "issues", *_delivery(2, 1))),
                 asyncio.create_task(b.enqueue_delivery(f"{org}-9", "issues",
                                                        *_delivery(9, issue, org)))]
    try:
        await until(lambda: all(t.done() for t in taking_in)
                    or pg.waiting_behind(url, holder[0]), timeout=HANG_GUARD)
        assert all(t.done() for t in taking_in), "intake waited for acme's claim"
    finally:
        release.set()
        await asyncio.wait_for(asyncio.gather(claiming, *taking_in), HANG_GUARD)


async def _paused(store: Store, work: Callable[[Connection], Awaitable[None]]
                  ) -> tuple[asyncio.Task[None], int, asyncio.Event]:
    """A replica paused inside a transaction once `work` has run in it (holding what that
    took) until the event returned is set: its task, and its session's pid."""
    stalled, release = asyncio.Event(), asyncio.Event()
    holder: list[int] = []

    async def paused() -> None:
        async with store.transaction() as db:
            await work(db)
            row = await db.fetchone("SELECT pg_backend_pid() AS pid")
            holder.append(int(row["pid"]))
            stalled.set()
            await release.wait()

    task = asyncio.create_task(paused())
    await asyncio.wait_for(stalled.wait(), HANG_GUARD)
    return task, holder[0], release


async def _paused_intake(store: Store, issues: list[str]
                         ) -> tuple[asyncio.Task[None], int, asyncio.Event]:
    """A replica paused inside an intake of `issues` (its transaction holding their intake
    keys): see `_paused`."""
    async def intake(db: Connection) -> None:
        for key in issues:
            await db.execute("SELECT pg_advisory_xact_lock(?::int, ?::int)",
                             lock_pair("intake:" + key))

    return await _paused(store, intake)


async def test_an_intake_held_up_holds_up_only_its_issues_later_deliveries(
        replicas: tuple[str, list[Store]]) -> None:
    """A replica paused inside an intake holds its issues' intake keys. Another replica taking
    in, together, a later delivery about one of those issues and globex's deliveries commits
    globex's at once; only the one about the held issue waits, alone, and then comes in after
    it (found by review: intake waited for every issue of its batch in turn, so a paused
    intake of acme's held up globex's deliveries taken in beside it)."""
    url, (a, b, _, _) = replicas
    held = issue_key(_delivery(1, 1)[0])
    assert held is not None
    assert await a.enqueue_delivery("acme-1", "issues", *_delivery(1, 1))
    pausing, holder, release = await _paused_intake(a, [held])
    acme = asyncio.create_task(b.enqueue_delivery("acme-2", "issues", *_delivery(2, 1)))
    acmes = [acme]
    globex = [asyncio.create_task(b.enqueue_delivery(f"globex-{n}", "issues",
                                                     *_delivery(n, n, "globex")))
              for n in range(3)]
    try:
        await asyncio.wait_for(asyncio.gather(*globex), HANG_GUARD)
        assert await _holds(url, holder), "globex's waited for acme's intake"
        assert not acme.done(), "acme's later delivery waits for its issue's intake"
        # it alone, and never inside a transaction (no writer's turn held while it waits)
        assert list(b._parked) == [held]
        assert await _waiting_inside_transactions(url, holder) == 0
        # what comes in about the issue meanwhile waits behind it, and nothing else does
        later = asyncio.create_task(b.enqueue_delivery("acme-3", "issues", *_delivery(3, 1)))
        acmes.append(later)
        globex.append(asyncio.create_task(b.enqueue_delivery("globex-9", "issues",
                                                             *_delivery(9, 9, "globex"))))
        await asyncio.wait_for(globex[-1], HANG_GUARD)
        assert await _holds(url, holder) and not later.done()
    finally:
        release.set()
        await asyncio.wait_for(asyncio.gather(pausing, *acmes, *globex), HANG_GUARD)
    assert all(t.result() for t in acmes + globex)
    order = [r["guid"] for r in await a.fetchall(
        "SELECT guid FROM queue WHERE issue_key=? ORDER BY id", (held,))]
    assert order == ["acme-1", "acme-2", "acme-3"]


async def test_many_issues_held_by_a_paused_intake_never_hold_up_another_offices_intake(
        replicas: tuple[str, list[Store]]) -> None:
    """A replica paused inside an intake of acme's holds the intake keys of as many acme
    issues as this replica has writers (a batch holds up to 500). A later delivery about each
    of them waits for it; globex's delivery, taken in after them, still commits while the
    paused intake holds on (found by review: each issue's parked arrivals waited for the key
    inside a write transaction of their own, a writer's turn and a pooled connection held
    all the while, so these took every writer's turn and globex's batch, and every claim,
    waited for acme's paused intake after all)."""
    url, (a, b, _, _) = replicas
    writers = b._writers._value  # (this replica's writers' turns: PostgresStore)
    held = [issue_key(_delivery(n, n)[0]) for n in range(1, writers + 1)]
    pausing, holder, release = await _paused_intake(a, [str(key) for key in held])
    acmes = [asyncio.create_task(b.enqueue_delivery(f"acme-{n}", "issues", *_delivery(n, n)))
             for n in range(1, writers + 1)]
    globex: asyncio.Task[bool] | None = None
    try:
        await until(lambda: len(b._parked) == writers, timeout=HANG_GUARD)  # each parked
        globex = asyncio.create_task(b.enqueue_delivery("globex-1", "issues",
                                                        *_delivery(1, 1, "globex")))
        done, _ = await asyncio.wait([globex], timeout=15)
        assert globex in done and await _holds(url, holder), \
            "globex's delivery waited for acme's paused intake"
        assert not any(t.done() for t in acmes)
    finally:
        release.set()
        await asyncio.wait_for(asyncio.gather(pausing, *acmes,
                                              *([globex] if globex else [])), HANG_GUARD)
    assert all(t.result() for t in acmes)


async def test_four_replicas_hammering_one_issue_run_its_deliveries_once_each_in_order(
        replicas: tuple[str, list[Store]]) -> None:
    """Every delivery reaches every replica at once (a forge redelivering to all of them):
    each id is queued once. Then four replicas claim side by side, in batches of every size:
    each delivery runs once, one issue's never two at a time, and in the order they came."""
    _, stores = replicas
    ids = [f"d{n}" for n in range(120)]
    issue_of = {guid: (1 if n % 4 else 2 + n % 8) for n, guid in enumerate(ids)}
    queued: list[str] = []
    for n, guid in enumerate(ids):  # every replica takes each delivery in at once
        answers = await asyncio.gather(*(s.enqueue_delivery(guid, "issues", *_delivery(
            n, issue_of[guid])) for s in stores))
        assert sorted(answers) == [False, False, False, True], guid
        queued.append(guid)
    running: dict[int, str] = {}
    ran: list[str] = []
    rng = random.Random(22)

    async def work(store: Store) -> None:
        while len(ran) < len(ids):
            items = await store.due_items(limit=rng.randint(1, 6))
            if not items:
                await asyncio.sleep(0)  # a turn for the other replicas, then look again
                continue
            for item in items:
                issue = issue_of[item.guid]
                assert running.setdefault(issue, item.guid) == item.guid, (
                    f"{item.guid} ran while {running[issue]} of its issue ran")
                ran.append(item.guid)
                await asyncio.sleep(0)
                del running[issue]
                assert await store.finish(item)

    await asyncio.wait_for(asyncio.gather(*(work(s) for s in stores)), HANG_GUARD)
    assert sorted(ran) == sorted(ids), "each delivery ran exactly once"
    for issue in set(issue_of.values()):
        assert [g for g in ran if issue_of[g] == issue] == [
            g for g in queued if issue_of[g] == issue], f"issue {issue} in arrival order"


async def test_replicas_appending_side_by_side_keep_each_offices_chain_whole(
        replicas: tuple[str, list[Store]]) -> None:
    _, stores = replicas
    await asyncio.gather(*(
        ledger.record(stores[n % 4], "mail.sent", "agent:scout", f"{org}/scout-vault#{n}",
                      org=org)
        for n in range(40) for org in ("acme", "globex")))
    for org in ("acme", "globex"):
        assert await ledger.verify_chain(stores[0], org) is None
        assert len(await stores[0].fetchall("SELECT 1 FROM ledger WHERE chain=?",
                                            (org,))) == 40


def test_a_claim_takes_a_row_only_behind_rows_of_its_issue_that_are_its_own() -> None:
    # issue x: 1 is another live replica's, so 3 waits; y: 2 is claimed now, 4 is mine, 5 goes
    pending = [(1, "x", "other", True), (2, "y", None, False), (3, "x", None, False),
               (4, "y", "me", True), (5, "y", None, False)]
    assert in_order([(2, "y"), (3, "x"), (5, "y"), (6, None)], pending, "me") == [2, 5, 6]
    # a row let go (owner gone) that this claim skipped holds back the rows behind it
    assert in_order([(3, "x")], [(1, "x", None, False), (3, "x", None, False)], "me") == []
    # a row numbered before one another replica runs (intake committed it later) waits for it
    assert in_order([(1, "x")], [(1, "x", None, False), (2, "x", "other", True)], "me") == []
    # ... but not for a dead replica's, which is this claim's to take over in turn
    assert in_order([(1, "x")], [(1, "x", None, False), (2, "x", "gone", False)], "me") == [1]


def _mail(n: int) -> mails.MailRecord:
    return mails.MailRecord(
        mail_id=f"m{n}", vault="acme/scout-vault", number=n, subject=f"Mail {n}", body="Hi",
        from_principal="human:marco", to_principal="agent:scout",
        sent="2026-12-04T00:00:00Z", hops=0, in_reply_to=None, thread_id=f"t{n}",
        key_id="k", body_sha256="0" * 64, state="mail:new")


async def test_an_agent_shown_a_later_mail_is_still_woken_for_one_written_before_it(
        replicas: tuple[str, list[Store]]) -> None:
    """Mail m1 is being written for scout on one replica when m2 is written on another. Were
    m2 to commit first, scout listing its mail in between would be shown m2, and m1 (stamped
    earlier, committed later) would never wake its long poll: one recipient's mail commits in
    the order it is stamped."""
    url, (a, b, *_) = replicas
    stamped, release = asyncio.Event(), asyncio.Event()
    holder: list[int] = []

    async def first() -> None:
        async with a.transaction() as db:
            await mails.put_mail(db, _mail(1))
            holder.append(int((await db.fetchone("SELECT pg_backend_pid() AS pid"))["pid"]))
            stamped.set()
            await release.wait()

    writing = asyncio.create_task(first())
    await asyncio.wait_for(stamped.wait(), HANG_GUARD)

    async def second() -> None:
        async with b.transaction() as db:
            await mails.put_mail(db, _mail(2))

    later = asyncio.create_task(second())
    # m2 either lands, or waits behind m1 (as the server shows)
    await until(lambda: later.done() or pg.waiting_behind(url, holder[0]), timeout=HANG_GUARD)
    shown, upto = await mails.to_handle(b, "agent:scout", org="acme")
    await mails.mark_shown(b, "agent:scout", upto, org="acme")
    release.set()
    await asyncio.wait_for(asyncio.gather(writing, later), HANG_GUARD)
    assert await mails.has_unshown(b, "agent:scout", org="acme"), (
        f"shown {[m.mail_id for m in shown]}, and nothing woke scout for the rest")


# -- one office's row held never holds up another office's writes (review of issue 22) --------


async def _row_held(url: str, sql: str) -> tuple[asyncpg.Connection, int]:
    """Another replica's long transaction: a session of its own inside a transaction that ran
    `sql` (locking what it locks), left open; its connection and pid."""
    conn = await asyncpg.connect(url)
    await conn.execute("BEGIN")
    await conn.execute(sql)
    return conn, int(await conn.fetchval("SELECT pg_backend_pid()"))


async def test_a_finish_never_waits_for_another_offices_row_and_keeps_its_issues_order(
        replicas: tuple[str, list[Store]]) -> None:
    """A long transaction holds acme's queue row (say, another replica moving acme's rows).
    A replica finishing acme's and globex's deliveries and claiming the next, in one
    transaction, records globex's at once and carries acme's to its next write: it neither
    waits for acme's row nor takes acme's finish for superseded, and it claims no later
    delivery of acme's issue until that finish is recorded (found by review: the one
    transaction waited for acme's row, every office's finishes with it, up to lock_timeout)."""
    url, (a, b, *_) = replicas
    assert await a.enqueue_delivery("acme-1", "issues", *_delivery(1, 1))
    assert await a.enqueue_delivery("globex-1", "issues", *_delivery(1, 1, "globex"))
    acme, globex = sorted(await b.due_items(limit=8), key=lambda i: i.guid)
    assert await a.enqueue_delivery("acme-2", "issues", *_delivery(2, 1))  # after it, its issue
    holder, pid = await _row_held(url, "SELECT 1 FROM queue WHERE guid='acme-1' FOR UPDATE")
    finishing = asyncio.create_task(b.finish_and_claim([(acme, "done"), (globex, "done")], 8))
    try:
        await until(lambda: finishing.done() or pg.waiting_behind(url, pid), timeout=HANG_GUARD)
        assert finishing.done(), "globex's finish waited for acme's row"
        claimed, superseded = finishing.result()
        assert (claimed, superseded) == ([], [])  # acme-2 waits for acme-1's finish
        states = {r["guid"]: r["state"] for r in await a.fetchall("SELECT guid, state FROM queue")}
        assert states == {"acme-1": "pending", "globex-1": "done", "acme-2": "pending"}
    finally:
        await holder.close()  # (rolled back)
        await asyncio.wait_for(finishing, HANG_GUARD)
    claimed, superseded = await b.finish_and_claim([], 8)
    assert [i.guid for i in claimed] == ["acme-2"] and superseded == []
    assert (await a.fetchone("SELECT state FROM queue WHERE guid='acme-1'"))["state"] == "done"


async def test_an_issues_later_finish_waits_for_its_earlier_one_held_elsewhere(
        replicas: tuple[str, list[Store]]) -> None:
    """Two deliveries of one issue finish in one batch while another transaction holds the
    first's row: the second is carried with it, not recorded before it (found by review: it
    was recorded done, and a stop then ran the first again, after the second)."""
    url, (a, b, *_) = replicas
    assert await a.enqueue_delivery("acme-1", "issues", *_delivery(1, 1))
    assert await a.enqueue_delivery("acme-2", "issues", *_delivery(2, 1))
    one, two = sorted(await b.due_items(limit=8), key=lambda i: i.guid)
    holder, _ = await _row_held(url, "SELECT 1 FROM queue WHERE guid='acme-1' FOR UPDATE")
    try:
        await asyncio.wait_for(b.finish_and_claim([(one, "done"), (two, "done")], 8),
                               HANG_GUARD)
        states = {r["guid"]: r["state"] for r in await a.fetchall("SELECT guid, state FROM queue")}
        assert states == {"acme-1": "pending", "acme-2": "pending"}, "the later one first"
        assert b.has_carried()
    finally:
        await holder.close()
    await b.finish_and_claim([], 8)
    states = {r["guid"]: r["state"] for r in await a.fetchall("SELECT guid, state FROM queue")}
    assert states == {"acme-1": "done", "acme-2": "done"} and not b.has_carried()


async def test_a_worker_stopping_records_the_finishes_it_carries_first(
        replicas: tuple[str, list[Store]]) -> None:
    """A delivery ends while another transaction holds its row: its finish is carried. A
    worker told to stop then returned with it unrecorded, and the replica's leave let the
    finished delivery go, to run again (found by review). Now the stop waits for it."""
    from gidgethub.routing import Router

    from bot.app.context import HandlerContext
    from bot.app.worker import Worker
    from bot.store import QueueItem

    url, (a, b, *_) = replicas
    router = Router()
    held: list[tuple[asyncpg.Connection, int]] = []

    @router.register("issues")
    async def handle(event: Any, ctx: HandlerContext) -> None:
        # another replica's long transaction takes the row as this delivery ends
        held.append(await _row_held(url, "SELECT 1 FROM queue WHERE guid='acme-1' FOR UPDATE"))

    def context(item: QueueItem, log: Any) -> HandlerContext:
        return HandlerContext(services=None, forge=None,  # type: ignore[arg-type]
                              installation_id=item.installation_id, delivery_id=item.guid,
                              log=log)

    writes = 0
    finish_and_claim = b.finish_and_claim

    async def counted(*args: Any, **kwargs: Any) -> Any:  # (the store's own, counted)
        nonlocal writes
        writes += 1
        return await finish_and_claim(*args, **kwargs)

    b.finish_and_claim = counted  # type: ignore[method-assign]
    worker = Worker(b, router, Router(), lambda payload: False, context)
    assert await a.enqueue_delivery("acme-1", "issues", *_delivery(1, 1))
    worker.start()
    try:
        await until(lambda: bool(held) and b.has_carried(), timeout=HANG_GUARD)
        stopping = asyncio.create_task(worker.stop(drain_timeout=HANG_GUARD))
        seen = writes
        # two more of the worker's writes while it stops: it has had its chance to return
        await until(lambda: stopping.done() or writes >= seen + 2, timeout=HANG_GUARD)
        assert not stopping.done(), "stopped with a finish carried, unrecorded"
    finally:
        for conn, _ in held:
            await conn.close()
    await asyncio.wait_for(stopping, HANG_GUARD)
    await b.leave()  # what a replica's stop does next
    row = await a.fetchone("SELECT state FROM queue WHERE guid='acme-1'")
    assert row is not None and row["state"] == "done"


async def test_two_replicas_claiming_one_pair_of_changes_in_opposite_orders_never_deadlock(
        replicas: tuple[str, list[Store]]) -> None:
    """Redeliveries of the same two forge changes claimed by two replicas, each batch in its
    own order: the changes' claims are made in their keys' order, so neither waits for the
    other's second (found by review: PostgreSQL broke a deadlock by rolling back one claim,
    every office's finishes and results riding it). A batch's claims are one statement
    (`preclaim_in`): the first replica holds the first change's claim, uncommitted, while the
    second's batch waits for it, then claims the second change too; the second's batch,
    made in the keys' order, waits on the first change holding nothing of the second's."""
    from gidgethub.routing import Router

    from bot.app.worker import Worker

    url, (a, b, *_) = replicas
    router = Router()

    @router.register("issue_comment")
    async def handle(event: Any, ctx: Any) -> None: ...

    def comment(n: int, guid: str) -> tuple[str, dict[str, Any]]:
        return guid, {"action": "created", "comment": {"id": n, "body": "x"},
                      "issue": {"number": n}, "repository": {"full_name": "acme/scout-vault"}}

    for guid, payload in (comment(1, "c1"), comment(2, "c2"), comment(1, "c1-again"),
                          comment(2, "c2-again")):
        assert await a.enqueue_delivery(guid, "issue_comment", payload,
                                        json.dumps(payload).encode())
    by_guid = {i.guid: i for i in await a.due_items(limit=8)}
    first, second = (Worker(s, router, Router(), lambda payload: False, None)  # type: ignore[arg-type]
                     for s in (a, b))
    holder: list[int] = []  # the first's session
    waited = asyncio.Event()

    async def claim_first() -> dict[str, tuple[str, str]]:
        async with a.transaction() as db:
            claimed = await first._preclaim(db, [by_guid["c1"]])
            holder.append(int((await db.fetchone("SELECT pg_backend_pid() AS p"))["p"]))
            await waited.wait()
            claimed.update(await first._preclaim(db, [by_guid["c2"]]))
            return claimed

    async def claim_second() -> dict[str, tuple[str, str]]:
        async with b.transaction() as db:
            return await second._preclaim(db, [by_guid["c2-again"], by_guid["c1-again"]])

    firsts = asyncio.create_task(claim_first())
    await until(lambda: bool(holder), timeout=HANG_GUARD)
    seconds = asyncio.create_task(claim_second())
    try:
        await until(lambda: pg.waiting_behind(url, holder[0]), timeout=HANG_GUARD)
    finally:
        waited.set()
    # (a deadlock raises here: PostgreSQL rolls one of them back)
    claimed, claimed_again = await asyncio.wait_for(asyncio.gather(firsts, seconds), HANG_GUARD)
    assert sorted(claimed) == ["c1", "c2"] and claimed_again == {}


async def test_a_finish_alone_never_waits_for_another_offices_row(
        replicas: tuple[str, list[Store]]) -> None:
    """`finish` (a parked delivery's, recorded at once) shares a transaction with the finishes
    made beside it: globex's is recorded while acme's row is held, acme's once it is free."""
    url, (a, b, *_) = replicas
    assert await a.enqueue_delivery("acme-1", "issues", *_delivery(1, 1))
    assert await a.enqueue_delivery("globex-1", "issues", *_delivery(1, 1, "globex"))
    acme, globex = sorted(await b.due_items(limit=8), key=lambda i: i.guid)
    holder, pid = await _row_held(url, "SELECT 1 FROM queue WHERE guid='acme-1' FOR UPDATE")
    finishes = [asyncio.create_task(b.finish(acme, "parked")),
                asyncio.create_task(b.finish(globex, "parked"))]
    try:
        await until(lambda: finishes[1].done() or pg.waiting_behind(url, pid),
                    timeout=HANG_GUARD)
        assert finishes[1].done() and finishes[1].result(), "globex's waited for acme's row"
        assert not finishes[0].done()
    finally:
        await holder.close()
        await asyncio.wait_for(asyncio.gather(*finishes), HANG_GUARD)
    assert finishes[0].result()


async def test_a_result_settled_never_waits_for_another_offices_key(
        replicas: tuple[str, list[Store]]) -> None:
    """The results of what deliveries ran once are written with their finish: acme's key's
    row held by a long transaction leaves globex's result written and acme's handed back,
    to be written in a later write, instead of the whole transaction waiting for it."""
    url, (_, b, *_) = replicas
    settling: list[Any] = []
    for org in ("acme", "globex"):
        await b.once("forge", f"{org}:k", "", lambda: asyncio.sleep(0, {"ok": True}),
                     later=settling)
    holder, pid = await _row_held(url, "SELECT 1 FROM idempotency WHERE key='acme:k' FOR UPDATE")
    carried: list[Any] = []

    async def also(db: Connection) -> None:
        carried.extend(await b.settle_in(db, settling))

    settle = asyncio.create_task(b.finish_and_claim([], 0, also=also))
    try:
        await until(lambda: settle.done() or pg.waiting_behind(url, pid), timeout=HANG_GUARD)
        assert settle.done(), "globex's result waited for acme's key"
        assert [ours[1] for ours, _ in carried] == ["acme:k"]
    finally:
        await holder.close()
        await asyncio.wait_for(settle, HANG_GUARD)
    results = {r["key"]: r["result"] for r in await b.fetchall(
        "SELECT key, result FROM idempotency")}
    assert results == {"acme:k": None, "globex:k": '{"ok": true}'}
    async with b.transaction() as db:
        assert await b.settle_in(db, carried) == []
    assert (await b.fetchone("SELECT result FROM idempotency WHERE key='acme:k'"))["result"]


@pytest.mark.parametrize("first", ["commits", "rolls back"])
async def test_a_redelivery_taken_in_by_two_replicas_holds_up_no_other_office(
        replicas: tuple[str, list[Store]], first: str) -> None:
    """A redelivered webhook reaches two replicas at once: one's intake of it is not committed
    yet (paused). The other's batch, acme's redelivery and globex's delivery together, commits
    globex's at once; acme's waits alone, outside any transaction, and is then recorded once:
    refused as seen if the first committed, queued if it rolled back (found by review: the
    batch waited on the uncommitted id, and globex's delivery with it)."""
    url, (_, b, *_) = replicas
    high, low = lock_pair("delivery:acme-dup")  # (what its intake holds until it commits)
    holder, pid = await _row_held(
        url, f"SELECT pg_advisory_xact_lock({high}, {low}); INSERT INTO deliveries(guid,"
        " event, received_at) VALUES ('acme-dup', 'issues', 0)")
    dup = asyncio.create_task(b.enqueue_delivery("acme-dup", "issues", *_delivery(7, 7)))
    globex = asyncio.create_task(b.enqueue_delivery("globex-9", "issues",
                                                    *_delivery(9, 9, "globex")))
    try:
        await until(lambda: globex.done() or _waiting_inside_transactions(url, pid),
                    timeout=HANG_GUARD)
        assert globex.done() and globex.result(), "globex's delivery waited for acme's"
        assert not dup.done()
    finally:
        await (holder.execute("COMMIT") if first == "commits" else holder.close())
        await asyncio.wait_for(asyncio.gather(dup, globex), HANG_GUARD)
        await holder.close()
    assert dup.result() is (first == "rolls back")
    queued = [r["guid"] for r in await b.fetchall("SELECT guid FROM queue ORDER BY id")]
    assert queued == (["globex-9", "acme-dup"] if first == "rolls back" else ["globex-9"])


async def test_a_sign_in_never_waits_for_another_offices_sessions(
        replicas: tuple[str, list[Store]]) -> None:
    """A sign-in deleted every office's expired console sessions, so globex's sign-in waited
    for a transaction holding acme's expired session (another sign-in's, or a prune's; found
    by review). It keeps its own session alone now: pruning deletes the expired ones."""
    url, (a, b, *_) = replicas
    await sessions.add_session(a, "old", "human:x", "acme", "x", "gh", "c", 100.0, 200.0)
    holder, pid = await _row_held(url, "DELETE FROM console_sessions WHERE expires_at < 1000")
    signing_in = asyncio.create_task(sessions.add_session(
        b, "new", "human:y", "globex", "y", "gh", "c", 1000.0, 5000.0))
    try:
        await until(lambda: signing_in.done() or pg.waiting_behind(url, pid),
                    timeout=HANG_GUARD)
        assert signing_in.done(), "globex's sign-in waited for acme's expired session"
    finally:
        await holder.close()
        await asyncio.wait_for(signing_in, HANG_GUARD)
    assert await sessions.live_session(b, "new", 1001.0) is not None


async def test_a_strangers_quiet_in_one_office_holds_up_no_other_office(
        replicas: tuple[str, list[Store]]) -> None:
    """A stranger's quiet period is one office's: its lock too (acme's answer to `troll`, not
    yet committed, holds up no answer of globex's to the same login)."""
    url, (a, b, *_) = replicas
    stalled, release = asyncio.Event(), asyncio.Event()
    holder: list[int] = []

    async def acme_answers() -> None:
        async with a.transaction(strangers.quiet_key("acme", "troll")) as db:
            holder.append(int((await db.fetchone("SELECT pg_backend_pid() AS pid"))["pid"]))
            stalled.set()
            await release.wait()

    acme = asyncio.create_task(acme_answers())
    await asyncio.wait_for(stalled.wait(), HANG_GUARD)
    globex = asyncio.create_task(strangers.may_reply(b, "troll", "d1", org="globex"))
    try:
        await until(lambda: globex.done() or pg.waiting_behind(url, holder[0]),
                    timeout=HANG_GUARD)
        assert globex.done() and globex.result(), "globex's answer waited for acme's"
    finally:
        release.set()
        await asyncio.wait_for(asyncio.gather(acme, globex), HANG_GUARD)


# -- one org's move, at a listing of the forge's orgs, holds up no other org (review, issue 22) --


async def _waiting_on(url: str, holder: int) -> list[int]:
    """The sessions the server shows waiting for a lock `holder` holds."""
    conn = await asyncpg.connect(url)
    try:
        return [int(r["pid"]) for r in await conn.fetch(
            "SELECT pid FROM pg_stat_activity WHERE wait_event_type='Lock'"
            " AND $1 = ANY(pg_blocking_pids(pid))", holder)]
    finally:
        await conn.close()


async def test_a_listings_move_of_one_org_holds_up_no_other_orgs_webhook_or_rows(
        replicas: tuple[str, list[Store]], caplog: pytest.LogCaptureFixture) -> None:
    """A replica takes the forge's listing (at its start; on Gitea every 5 minutes on every
    replica): `initrode` renamed itself `initech`, and `acme`'s name went to another account,
    whose office is a new one. acme's move is held up (a long transaction holds a mail of
    acme's). Meanwhile globex's installation webhook, on another replica, and a write to
    initech's moved mail are made at once, and a second replica's listing waits for acme's
    move alone and, once it is made, makes it no second time (found by review: one
    transaction locked every org's installation row and every moved row while it moved
    acme's office, so they all waited for it)."""
    url, (a, b, c, _) = replicas
    caplog.set_level(logging.INFO, logger="vaultmail.installations")
    for org, installation, account in (("acme", 10, 1), ("globex", 30, 3), ("initrode", 40, 4)):
        await installations.installed(a, org, installation, account)
    async with a.transaction() as db:
        await mails.put_mail(db, _mail(1))  # acme's
        await mails.put_mail(db, dataclasses.replace(_mail(2), vault="initrode/scout-vault"))
    before = await installations.known(a)
    live, accounts = {"acme": 20, "globex": 30, "initech": 40}, {
        "acme": 2, "globex": 3, "initech": 4}
    holder, pid = await _row_held(url, "SELECT 1 FROM mails WHERE mail_id='m1' FOR UPDATE")
    first = asyncio.create_task(installations.listed(a, live, before, accounts))
    second: asyncio.Task[dict[str, int]] | None = None
    try:
        await until(_one_waits(url, pid), timeout=HANG_GUARD)
        [listing] = await _waiting_on(url, pid)  # acme's move, held up

        async def touch_initech() -> None:
            async with b.transaction() as db:
                assert await mails.set_state(db, "m2", "mail:working")

        others = [asyncio.create_task(installations.installed(b, "globex", 31, 3)),
                  asyncio.create_task(touch_initech())]
        await until(lambda: all(t.done() for t in others)
                    or pg.waiting_behind(url, listing), timeout=HANG_GUARD)
        assert all(t.done() for t in others), "another org waited for acme's move"
        await asyncio.gather(*others)
        second = asyncio.create_task(installations.listed(  # (as the forge lists it now)
            c, live | {"globex": 31}, await installations.known(c), accounts))
        await until(_one_waits(url, listing), timeout=HANG_GUARD)  # for acme's move alone
    finally:
        await holder.close()  # (rolled back)
        await asyncio.wait_for(asyncio.gather(first, *([second] if second else [])),
                               HANG_GUARD)
    assert second is not None
    assert first.result() == second.result() == {"acme": 20, "globex": 31, "initech": 40}
    rows = {r["mail_id"]: (r["org"], r["vault"]) for r in await a.fetchall(
        "SELECT mail_id, org, vault FROM mails")}
    assert rows == {"m1": ("acme~1", "acme~1/scout-vault"),
                    "m2": ("initech", "initech/scout-vault")}
    assert await installations.accounts(a) == {"acme": 2, "globex": 3, "initech": 4}
    moves = [r.getMessage() for r in caplog.records if r.name == "vaultmail.installations"]
    assert sum("kept aside" in m for m in moves) == 1, moves
    assert sum("renamed itself" in m for m in moves) == 1, moves


@pytest.mark.parametrize("let_go", ["release", "leave"])
async def test_letting_go_of_claims_never_waits_for_another_offices_row(
        replicas: tuple[str, list[Store]], let_go: str) -> None:
    """A replica claimed acme's and globex's deliveries; a long transaction holds acme's row.
    Letting go of its claims (a batch cut short, `release`; a clean stop, `leave`) lets go of
    globex's at once and keeps acme's, its own to claim again or, once it is gone, another's
    to take over as a dead replica's (found by review: one statement let go of every office's
    rows, and waited for acme's up to lock_timeout)."""
    url, (a, b, *_) = replicas
    assert await a.enqueue_delivery("acme-1", "issues", *_delivery(1, 1))
    assert await a.enqueue_delivery("globex-1", "issues", *_delivery(1, 1, "globex"))
    assert len(await b.due_items(limit=8)) == 2
    holder, pid = await _row_held(url, "SELECT 1 FROM queue WHERE guid='acme-1' FOR UPDATE")
    letting_go = asyncio.create_task(getattr(b, let_go)())
    try:
        await until(lambda: letting_go.done() or pg.waiting_behind(url, pid), timeout=HANG_GUARD)
        assert letting_go.done(), "globex's let-go waited for acme's row"
        await letting_go
    finally:
        await holder.close()  # (rolled back)
        await asyncio.wait_for(letting_go, HANG_GUARD)
    owners = {r["guid"]: r["lease_owner"] for r in await a.fetchall(
        "SELECT guid, lease_owner FROM queue")}
    assert owners == {"acme-1": "replica-1", "globex-1": None}
    if let_go == "release":
        assert sorted(i.guid for i in await b.due_items(limit=8)) == ["acme-1", "globex-1"]
    else:
        assert "replica-1" not in [r["id"] for r in await a.live_replicas()]


async def test_a_prune_never_waits_for_a_row_an_office_holds(
        replicas: tuple[str, list[Store]]) -> None:
    """acme's idempotency key and quiet period, both past their time, are held by a live
    transaction of acme's (a key claimed again, a quiet period renewed). The leader's prune
    deletes globex's at once and leaves acme's to the next prune (found by review: the
    idempotency delete was one statement over every office's rows, so it waited for acme's
    row, and any office's claim of a key could wait for it, as long as it ran)."""
    url, (a, *_) = replicas
    now, old = 2_000_000_000.0, 2_000_000_000.0 - 30 * DAY
    async with a.transaction() as db:
        for org in ("acme", "globex"):
            await db.execute("INSERT INTO idempotency(scope, key, fingerprint, claimed_at,"
                             " done_at) VALUES ('forge:issues', ?, 'f', ?, ?)",
                             (f"{org}:k", old, old))
            await db.execute("INSERT INTO stranger_replies(login, replied_at, cause)"
                             " VALUES (?, ?, 'x')", (f"{org}/troll", old))
    holder, pid = await _row_held(
        url, "SELECT 1 FROM idempotency WHERE key='acme:k' FOR UPDATE;"
        " SELECT 1 FROM stranger_replies WHERE login='acme/troll' FOR UPDATE")
    pruning = asyncio.create_task(prune(a, now=now, keep=7 * DAY))
    try:
        await until(lambda: pruning.done() or pg.waiting_behind(url, pid), timeout=HANG_GUARD)
        assert pruning.done(), "the prune waited for acme's rows"
        deleted = await pruning
        assert (deleted["idempotency"], deleted["stranger_replies"]) == (1, 1), deleted
        assert [r["key"] for r in await a.fetchall("SELECT key FROM idempotency")] == ["acme:k"]
    finally:
        await holder.close()  # (rolled back)
        await asyncio.wait_for(pruning, HANG_GUARD)
    deleted = await prune(a, now=now, keep=7 * DAY)  # the next prune: acme's, free now
    assert (deleted["idempotency"], deleted["stranger_replies"]) == (1, 1), deleted


# -- the loop guard's count of a run's sends, claimed on several replicas at once --------------


async def test_sends_from_one_run_claimed_on_replicas_at_once_each_take_a_place_of_its_own(
        replicas: tuple[str, list[Store]]) -> None:
    """Twelve sends from one run of scout's to builder, counted and claimed on four replicas
    at once (`mails.claim_send`, the loop guard's count): each takes a place of its own, 0 to
    11, and a mail id claimed again keeps its place. The claim's key is that office's run and
    recipient alone: while acme's is held, globex's same run names and acme's other
    recipients are claimed without waiting."""
    url, stores = replicas
    run, sender = "wake-1", "agent:scout"

    def claim(n: int, org: str = "acme", to: str = "agent:builder") -> Awaitable[int]:
        return mails.claim_send(stores[n % 4], f"{org}-m{n}", run, sender, to, org=org)

    places = await asyncio.wait_for(asyncio.gather(*(claim(n) for n in range(12))), HANG_GUARD)
    assert sorted(places) == list(range(12)), places
    assert await claim(3) == places[3], "a mail id keeps the place it claimed"

    async def hold_acmes(db: Connection) -> None:
        await hold(db, mails.run_sends_key("acme", run, sender, "agent:builder"))

    writer, _, release = await _paused(stores[0], hold_acmes)
    try:
        assert await asyncio.wait_for(claim(20, "globex"), HANG_GUARD) == 0
        assert await asyncio.wait_for(claim(21, to="agent:critic"), HANG_GUARD) == 0
    finally:
        release.set()
        await writer
    assert await claim(22) == 12
