"""The durable queue: deliveries arriving together are committed together, each id once."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from pathlib import Path
from typing import Any

import asyncpg

from bot.store import QueueItem, Store, open_store, queue
from bot.store.sql import for_postgres
from tests.support import older_index, sqlite_steps


async def test_concurrent_deliveries_are_each_queued_once(tmp_path: Path) -> None:
    store = await open_store(tmp_path / "index.sqlite3")
    try:
        guids = [f"g{i % 40}" for i in range(120)]  # every id arrives three times at once
        answers = await asyncio.gather(*(
            store.enqueue_delivery(g, "issues", {"action": "opened"}, b'{"action":"opened"}')
            for g in guids))
        assert sum(answers) == 40
        firsts = {g: a for g, a in reversed(list(zip(guids, answers, strict=True)))}
        assert all(firsts.values()), "the first arrival of each id is the one queued"
        assert await store.pending_count() == 40
        again = await store.enqueue_delivery("g1", "issues", {}, b"{}")
        assert again is False, "a redelivery later is recognised too"
    finally:
        await store.close()


async def test_queued_deliveries_survive_a_restart(tmp_path: Path) -> None:
    store = await open_store(tmp_path / "index.sqlite3")
    assert await store.enqueue_delivery("g", "ping", {}, b"{}")
    await store.close()
    reopened = await open_store(tmp_path / "index.sqlite3")
    try:
        item = await reopened.next_due()
        assert item is not None and item.guid == "g"
    finally:
        await reopened.close()


async def test_an_index_from_before_later_columns_opens_and_gains_them(tmp_path: Path) -> None:
    import sqlite3

    path = tmp_path / "index.sqlite3"
    old = sqlite3.connect(path)
    old.execute("CREATE TABLE mails (mail_id TEXT PRIMARY KEY, vault TEXT NOT NULL, number "
                "INTEGER NOT NULL, subject TEXT NOT NULL, body TEXT NOT NULL, from_principal "
                "TEXT NOT NULL, to_principal TEXT NOT NULL, sent TEXT NOT NULL, hops INTEGER "
                "NOT NULL, in_reply_to TEXT, thread_id TEXT NOT NULL, key_id TEXT NOT NULL, "
                "body_sha256 TEXT NOT NULL, state TEXT NOT NULL, tampered INTEGER NOT NULL "
                "DEFAULT 0, updated_at REAL NOT NULL, UNIQUE(vault, number))")
    old.execute("INSERT INTO mails VALUES ('m1','acme/scout-vault',1,'Hi','x','agent:a',"
                "'agent:scout','2026-01-01T00:00:00Z',0,NULL,'m1','k','h','mail:new',0,0)")
    old.commit()
    old.close()
    from bot.store import mails

    store = await open_store(path)
    try:
        mail = await mails.get_mail(store, "m1")
        assert mail is not None and mail.other_labels == () and mail.agent_turns == 0
    finally:
        await store.close()


async def test_one_malformed_arrival_does_not_fail_the_others_in_its_group(
        tmp_path: Path) -> None:
    """Issue 9, item 8: each delivery fails alone; a malformed one is still queued (it then
    dead-letters in the worker), and the good ones arriving with it are committed."""
    store = await open_store(tmp_path / "index.sqlite3")
    try:
        bad = {"action": "created", "installation": "notadict", "sender": "notadict"}
        utf16 = '{"action": "opened"}'.encode("utf-16")
        answers = await asyncio.gather(
            store.enqueue_delivery("bad", "installation", bad, b'{"installation":"notadict"}'),
            store.enqueue_delivery("utf16", "issues", {"action": "opened"}, utf16),
            *(store.enqueue_delivery(f"g{i}", "ping", {"zen": i}, b"{}") for i in range(5)))
        assert answers == [True] * 7
        assert await store.pending_count() == 7
    finally:
        await store.close()


async def test_a_delivery_waits_behind_an_earlier_one_about_its_issue_waiting_to_retry(
        tmp_path: Path) -> None:
    """Issue 9, item 6: per-issue order holds across retries."""
    store = await open_store(tmp_path / "index.sqlite3")
    try:
        def about(number: int, action: str) -> dict[str, object]:
            return {"action": action, "issue": {"number": number},
                    "repository": {"full_name": "acme/scout-vault"}}

        for guid, number, action in (("a1", 1, "opened"), ("b1", 2, "opened"),
                                     ("a2", 1, "closed"), ("p", 0, "ping")):
            payload = about(number, action) if number else {"zen": "x"}
            assert await store.enqueue_delivery(guid, "issues", payload, b"{}")
        first = await store.next_due()
        assert first is not None and first.guid == "a1"
        [first] = await store.due_items(limit=1)  # (a delivery is failed by who claimed it)
        await store.fail(first, "502", time.time() + 60)  # a1 waits a minute to retry
        due = [i.guid for i in await store.due_items(limit=10)]
        assert due == ["b1", "p"], "a2 waits behind a1; other issues go on"
        wakeup = await store.next_wakeup()
        assert wakeup is not None and wakeup < time.time() + 1, "b1 and p are due now"
        for item in await store.due_items(limit=10):
            await store.finish(item)
        wakeup = await store.next_wakeup()
        assert wakeup is not None and wakeup > time.time() + 30, "nothing before a1's retry"
        later = [i.guid for i in await store.due_items(limit=10, now=time.time() + 61)]
        assert later == ["a1", "a2"], "once a1 is due, both, in order"
    finally:
        await store.close()


async def test_deliveries_arriving_while_the_write_lock_is_held_share_one_commit(
        tmp_path: Path) -> None:
    """Issue 14 (intake p99): the group-commit batch is taken once the write lock is held, so
    whatever arrived while a worker transaction held it goes in one commit, not one small
    transaction per arrival queued behind it. One batch = one `received_at`."""
    store = await open_store(tmp_path / "index.sqlite3")
    try:
        held = asyncio.Event()
        release = asyncio.Event()

        async def worker_transaction() -> None:
            async with store.transaction():
                held.set()
                await release.wait()

        holder = asyncio.create_task(worker_transaction())
        await held.wait()
        first = asyncio.create_task(store.enqueue_delivery("g0", "ping", {}, b"{}"))
        for _ in range(5):  # the first writer is now waiting for the lock
            await asyncio.sleep(0)
        later = [asyncio.create_task(store.enqueue_delivery(f"g{i}", "ping", {}, b"{}"))
                 for i in range(1, 20)]
        for _ in range(5):
            await asyncio.sleep(0)
        release.set()
        assert all(await asyncio.gather(first, *later))
        await holder
        rows = await store.fetchall("SELECT DISTINCT received_at FROM deliveries")
        assert len(rows) == 1, "all twenty committed together"
    finally:
        await store.close()


async def test_finishes_made_together_commit_together_and_each_is_durable(
        tmp_path: Path) -> None:
    store = await open_store(tmp_path / "index.sqlite3")
    try:
        for i in range(30):
            assert await store.enqueue_delivery(f"g{i}", "ping", {}, b"{}")
        items = await store.due_items(limit=50)
        await asyncio.gather(*(store.finish(item, "ignored" if item.id % 2 else "done")
                               for item in items))
        assert await store.pending_count() == 0
        rows = await store.fetchall(
            "SELECT state, COUNT(*) AS n, COUNT(DISTINCT finished_at) AS t FROM queue"
            " GROUP BY state ORDER BY state")
        assert [(r["state"], r["n"], r["t"]) for r in rows] == [("done", 15, 1),
                                                               ("ignored", 15, 1)]
    finally:
        await store.close()


async def test_the_wal_is_checkpointed_in_the_background_not_in_a_commit(
        tmp_path: Path) -> None:
    """SQLite's own checkpoint runs inside the commit that crosses 1,000 pages, stalling every
    write behind it (the 50-70 ms tail of bench.intake); a second connection does it instead,
    so the WAL is copied back while the app's connection keeps committing."""
    path = tmp_path / "index.sqlite3"
    store = await open_store(path)
    try:
        checkpointer = store._checkpointer
        assert checkpointer is not None
        empty = path.stat().st_size  # the schema alone (over 400 KB by now)
        body = b"x" * 20_000
        for i in range(20):
            assert await store.enqueue_delivery(f"g{i}", "ping", {}, body)
        # in WAL mode the database file grows only by checkpoints: 400 KB written is far
        # below SQLite's own threshold (1,000 pages), so only background rounds put it there
        for _ in range(20):  # a round that began before the last commit copies only part
            if path.stat().st_size > empty + 20 * 20_000:
                break
            checkpointer.checkpointed.clear()
            await asyncio.wait_for(checkpointer.checkpointed.wait(), 10)
        assert path.stat().st_size > empty + 20 * 20_000
        assert checkpointer.checkpoints >= 1
    finally:
        await store.close()


async def test_a_writer_cancelled_as_its_transaction_begins_leaves_the_next_one_a_clean_start(
        tmp_path: Path, database_url: str) -> None:
    # a stop cancels the worker and the heartbeat wherever they are: one cancelled while the
    # database was still beginning its transaction must not leave that transaction open
    # behind a released lock (the next writer failed: "cannot start a transaction within a
    # transaction")
    store = await open_store(database_url or tmp_path / "index.sqlite3")
    try:
        entered = asyncio.Event()

        async def write() -> None:
            async with store.transaction() as db:
                entered.set()
                await db.execute("SELECT 1")

        for twice in (False, True, True):  # cancelled at its first await: the BEGIN on its way
            task = asyncio.create_task(write())
            await asyncio.sleep(0)
            task.cancel()
            if twice:  # and again while it undoes that (a timeout inside a stop)
                await asyncio.sleep(0)
                task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        assert not entered.is_set()
        assert await store.enqueue_delivery("g", "ping", {}, b"{}")
        async with store.transaction() as db:
            await db.execute("SELECT 1")
        assert await store.pending_count() == 1
    finally:
        await store.close()


async def test_a_delivery_held_when_the_app_crashed_runs_alone_after_the_restart(
        tmp_path: Path) -> None:
    store = await open_store(tmp_path / "index.sqlite3")
    await store.join(sole=True)
    for guid in ("g1", "g2"):
        assert await store.enqueue_delivery(guid, "ping", {}, b"{}")
    assert len(await store.due_items(limit=10)) == 2
    await store.close()  # crashed: never left
    store = await open_store(tmp_path / "index.sqlite3")
    try:
        await store.join(sole=True)
        [first] = await store.due_items(limit=10)
        assert (first.guid, first.takeovers) == ("g1", 1)
        await store.finish(first)
        [second] = await store.due_items(limit=10)
        assert (second.guid, second.takeovers) == ("g2", 1)
    finally:
        await store.close()


def _about(i: int) -> dict[str, object]:
    """The i-th delivery of a backlog: about one of 50 issues (each issue's spread through the
    queue), one in ten about no issue."""
    if i % 10 == 9:
        return {"zen": i}
    return {"action": "edited", "issue": {"number": 1 + i % 50},
            "repository": {"full_name": "acme/scout-vault"}}


async def _queue_backlog(store: Store, first: int, count: int) -> None:
    assert all(await asyncio.gather(*(
        store.enqueue_delivery(f"d{i}", "issues", _about(i), b"{}")
        for i in range(first, first + count))))


def _queue_rows_read(plan: dict[str, Any]) -> int:
    """Rows of `queue` a PostgreSQL plan read (EXPLAIN ANALYZE): kept or filtered out."""
    own = 0
    if plan.get("Relation Name") == "queue":
        own = (plan.get("Actual Rows", 0) + plan.get("Rows Removed by Filter", 0)) * plan.get(
            "Actual Loops", 1)
    return int(own) + sum(_queue_rows_read(p) for p in plan.get("Plans", []))


async def _claim_work(store: Store, url: str) -> tuple[int, list[QueueItem]]:
    """One claim of 64, and what it cost, counted (not timed): SQLite, the steps of its
    virtual machine (in tens); PostgreSQL, the rows of `queue` its plan reads."""
    if store.engine == "sqlite":
        return await sqlite_steps(store, lambda: store.due_items(limit=64), every=10)
    conn = await asyncpg.connect(url)  # (the store's reads do not take EXPLAIN)
    try:
        read = 0
        first = await conn.fetchval(for_postgres(queue.NEXT_PENDING), 0)
        me = store.replica_id
        candidates = await conn.fetch(for_postgres(queue.CANDIDATES), first,
                                      first + queue.WINDOW, [], queue.NO_HOLD, True, [], [],
                                      None, me, me, False, [], 64)
        keys = sorted({r["issue_key"] for r in candidates if r["issue_key"] is not None})
        # PostgreSQL's claim: its candidates, then the pending rows of their issues
        for sql, params in ((queue.NEXT_PENDING, (0,)), (queue.CANDIDATES, (
                first, first + queue.WINDOW, [], queue.NO_HOLD, True, [], [], None, me, me,
                False, [], 64)),
                (queue.EARLIER, (keys, max(r["id"] for r in candidates), keys,
                                 max(r["id"] for r in candidates), me))):
            plan = await conn.fetchval("EXPLAIN (ANALYZE, FORMAT JSON) " + for_postgres(sql),
                                       *params)
            read += _queue_rows_read(json.loads(plan)[0]["Plan"])
    finally:
        await conn.close()
    return read, await store.due_items(limit=64)


async def _joined(tmp_path: Path, database_url: str) -> Store:
    """A store on either engine, its replica joined (as `vaultmail serve` joins it)."""
    store = await open_store(database_url or tmp_path / "index.sqlite3")
    if store.engine == "sqlite":
        await store.join(sole=True)
    else:
        await store.join("a")
    return store


async def test_a_claim_costs_the_same_with_300_or_3000_pending(
        tmp_path: Path, database_url: str) -> None:
    """Issue 29: the per-issue hold scanned every pending delivery for each one a claim
    looked at: one claim took 21.9 s with 6,560 pending, under the write lock. It reads
    what it takes now, whatever the backlog."""
    store = await _joined(tmp_path, database_url)
    try:
        await _queue_backlog(store, 0, 300)
        small, first = await _claim_work(store, database_url)
        await asyncio.gather(*(store.finish(item) for item in first))
        await _queue_backlog(store, 300, 3000)
        large, second = await _claim_work(store, database_url)
        assert [i.guid for i in first + second] == [f"d{i}" for i in range(128)], (
            "the oldest first, each issue's in order")
        if store.engine == "sqlite":
            assert large <= 1.5 * small, f"{small} with 300 pending, {large} with 3,236"
        else:  # (its plan may change with the table's statistics: not compared)
            assert large <= 2 * queue.WINDOW, f"{large} rows read with 3,236 pending"
    finally:
        await store.close()


async def test_the_claim_reads_the_pending_rows_by_index_in_order(tmp_path: Path) -> None:
    """The plans behind the figure above (SQLite's): the pending rows in arrival order from
    an index holding what the claim filters on (no sort of them all, no row read), a window
    of them at a time, and the per-issue hold one look-up by issue and id; the wake-up's
    alike, by due time."""
    store = await open_store(tmp_path / "index.sqlite3")
    try:
        me, now = store.replica_id, time.time()
        held = "SEARCH p USING COVERING INDEX queue_held (issue_key=? AND id<?)"
        for sql, args, expected in (
                (queue.NEXT_PENDING, (1,),
                 ["SEARCH queue USING COVERING INDEX queue_claim_office (id>?)"]),
                (queue.CLAIM, queue.claim_params(me, now, 1, 64, excluding_offices=["acme"]),
                 ["SEARCH q USING COVERING INDEX queue_claim_office (id>? AND id<?)", held]),
                (queue.WAKEUP, queue.wakeup_params(me, now),
                 ["SCAN q USING COVERING INDEX queue_wake", held])):
            plan = [r["detail"] for r in await store.fetchall(
                "EXPLAIN QUERY PLAN " + sql, args)]
            assert [d for d in plan if " queue " in d or " q " in d or " p " in d] == expected
            assert not any("TEMP B-TREE" in d for d in plan), plan
        # the first pending row of the offices a claim does not leave alone: a hop through
        # the index an office, never a read of the backlogs left alone
        plan = [r["detail"] for r in await store.fetchall(
            "EXPLAIN QUERY PLAN " + queue.NEXT_PENDING_BUT, (1, 1, '["acme"]'))]
        reads = [d for d in plan if " queue " in d or " p " in d]
        assert len(reads) == 4 and all(
            d.startswith("SEARCH") and "queue_pending_office" in d for d in reads), plan
    finally:
        await store.close()


def test_a_sub_issues_delivery_is_about_the_sub_issue_whichever_side_it_reached() -> None:
    """Linking a sub-issue sends `sub_issue_added` to the parent's repository and
    `parent_issue_added` to the sub-issue's: both are about the sub-issue, and run in order
    with its `issues` deliveries (an `opened` handled beside the link could undo it)."""
    sub, parent = {"number": 5}, {"number": 1}
    to_parent = {"action": "sub_issue_added", "sub_issue": sub, "parent_issue": parent,
                 "sub_issue_repo": {"full_name": "acme/plans"},
                 "repository": {"full_name": "acme/goals"}}
    to_sub = {"action": "parent_issue_added", "sub_issue": sub, "parent_issue": parent,
              "parent_issue_repo": {"full_name": "acme/goals"},
              "repository": {"full_name": "acme/plans"}}
    opened = {"action": "opened", "issue": sub, "repository": {"full_name": "acme/plans"}}
    assert queue.issue_key(to_parent) == queue.issue_key(to_sub) == \
        queue.issue_key(opened) == "acme/plans#5"



async def test_a_claim_reads_the_clock_once(tmp_path: Path, monkeypatch: Any) -> None:
    """SQLite's clock (vm_now) was read anew by each row and statement of a claim: a delivery
    about an issue falling due between two windows was neither taken (its window read
    before) nor held back a later one about its issue (read after), which was taken and ran
    first. A claim now reads the clock once. Here the clock moves on after its first read."""
    import bot.store.sqlite as sqlite_store

    clock = {"now": 1_000_000.0, "reads": 0, "moves": False}

    def now() -> float:
        clock["reads"] += 1
        if clock["moves"] and clock["reads"] > 1:
            return clock["now"] + 1.0
        return clock["now"]

    monkeypatch.setattr(sqlite_store.time, "time", now)
    store = await open_store(tmp_path / "index.sqlite3")
    monkeypatch.undo()  # (the store keeps `now` as its vm_now; the rest of the test is real)

    def comment(n: int) -> dict[str, Any]:
        return {"action": "created", "issue": {"number": n}, "installation": {"id": 1},
                "repository": {"full_name": "acme/scout-vault"}}

    try:
        for guid, n in [("K-1", 1), *((f"x-{i}", 100 + i) for i in range(300)), ("K-2", 1)]:
            await store.enqueue_delivery(guid, "issue_comment", comment(n),
                                         json.dumps(comment(n)).encode())
        async with store.transaction() as db:  # K-1 (a retry) due half a second from now
            await db.execute("UPDATE queue SET next_at=CASE guid WHEN 'K-1' THEN ?"
                             " WHEN 'K-2' THEN ? ELSE ? END",
                             (clock["now"] + 0.5, clock["now"] - 1, clock["now"] + 100))
        clock["reads"], clock["moves"] = 0, True
        taken = [item.guid for item in await store.due_items(limit=128)]
        assert taken == [], "K-2 taken while K-1, before it about its issue, was not"
    finally:
        await store.close()


async def test_payloads_kept_for_another_replica_make_room_once_old(
        tmp_path: Path, monkeypatch: Any) -> None:
    """Intake keeps the payloads it parsed for this replica's first claim of them; with other
    replicas, most are another's to claim. Before, they were kept until this replica claimed
    them, so once HANDED_OVER were kept nothing more was handed over; now the oldest make room
    once kept HANDED_OVER_FOR."""
    monkeypatch.setattr(queue, "HANDED_OVER", 4)
    store = await open_store(tmp_path / "index.sqlite3")
    try:
        async def arrive(guid: str) -> None:
            payload = {"action": "opened", "n": guid}
            assert await store.enqueue_delivery(guid, "issues", payload,
                                                json.dumps(payload).encode())

        for n in range(4):  # another replica's to claim, say
            await arrive(f"g{n}")
        await arrive("full")
        assert "full" not in store._handed_over  # noqa: SLF001 - kept while fresh
        monkeypatch.setattr(queue, "HANDED_OVER_FOR", -1.0)  # (as if kept that long)
        await arrive("later")
        assert "later" in store._handed_over and "g0" not in store._handed_over  # noqa: SLF001
        items = await store.due_items(limit=10)
        assert [i.guid for i in items] == ["g0", "g1", "g2", "g3", "full", "later"]
        assert [i.payload["n"] for i in items] == [i.guid for i in items]
    finally:
        await store.close()


async def test_a_claim_leaves_alone_what_this_replica_runs_and_the_issues_it_is_told(
        tmp_path: Path, database_url: str) -> None:
    """The worker claims while it runs what it claimed before (bot.app.worker's lanes): a claim
    takes none of the deliveries it is told this replica runs, nor any about the issues it is
    told to leave (a deep lane's), and lets go of what it is told to in the same transaction."""
    store = await _joined(tmp_path, database_url)
    try:
        for n, issue in enumerate((1, 1, 2, 2, 3)):
            payload = {"action": "created", "issue": {"number": issue},
                       "repository": {"full_name": "acme/vault"}}
            assert await store.enqueue_delivery(f"d{n}", "issue_comment", payload,
                                                json.dumps(payload).encode())
        [d0] = await store.due_items(limit=1)
        taken, _ = await store.finish_and_claim(
            [], limit=10, excluding=[d0.id], excluding_issues=["acme/vault#3"])
        assert [i.guid for i in taken] == ["d1", "d2", "d3"], "d0 runs; issue 3 left alone"
        again, _ = await store.finish_and_claim([], limit=10, excluding=[i.id for i in taken],
                                                let_go=[d0])
        assert [i.guid for i in again] == ["d0", "d4"], "d0 let go of, then claimed anew"
        assert again[0].lease != d0.lease
    finally:
        await store.close()


async def test_an_index_at_version_17_gives_each_pending_delivery_its_office(
        tmp_path: Path, empty_database_url: str) -> None:
    """Schema 18 keeps each queued delivery's office, by which claims share the worker: a
    delivery queued at version 17 about an issue gets its issue's office when the index
    opens; one about no issue keeps none, and is claimed only while no office is left alone
    (both engines)."""
    insert = ("INSERT INTO queue(guid, event, issue_key, payload, next_at, created_at)"
              " VALUES (?, 'issue_comment', ?, '{}', 0, 0)")
    rows = [("about-acme", "Acme/scout-vault#1"), ("about-nothing", None)]
    target = await older_index(tmp_path, empty_database_url, 17,
                               [(insert, row) for row in rows])
    store = await open_store(target)  # version 18: the backfill
    try:
        offices = {r["guid"]: r["office"] for r in await store.fetchall(
            "SELECT guid, office FROM queue")}
        assert offices == {"about-acme": "acme", "about-nothing": None}
        if empty_database_url:
            await store.join("replica-a")
        held_back, _ = await store.finish_and_claim([], 8, excluding_offices=["globex"])
        assert [i.guid for i in held_back] == ["about-acme"], \
            "no office known: not taken while one is left alone"
        claimed, _ = await store.finish_and_claim([], 8, excluding=[i.id for i in held_back])
        assert [i.guid for i in claimed] == ["about-nothing"]
    finally:
        await store.close()
