"""What replicas sharing one PostgreSQL database hold, and how it passes on: claimed
deliveries (one issue's never on two replicas at once), unfinished idempotency claims, and
leadership; a replica silent past DEAD_AFTER holds nothing."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import pytest

from bot.store import open_store
from bot.store.db import HEARTBEAT, ReplicaIdInUse, ReplicaIdTaken, Store
from bot.store.queue import DEAD_AFTER, POISON_AFTER


async def _silence(store: Store, replica: str, ago: float = DEAD_AFTER + 1) -> None:
    """As if `replica` had stopped beating `ago` seconds ago (killed) while the others beat
    on (steadily, and for longer)."""
    async with store.transaction() as db:
        await db.execute("UPDATE replicas SET seen_at=? WHERE id=?",
                         (time.time() - ago, replica))
        await db.execute("UPDATE replicas SET steady_since=?, seen_at=? WHERE id<>?",
                         (time.time() - ago - 1, time.time(), replica))


def _issue(n: int, action: str) -> tuple[dict[str, Any], bytes]:
    payload = {"action": action, "issue": {"number": n},
               "repository": {"full_name": "acme/scout-vault"}}
    return payload, json.dumps(payload).encode()


async def test_one_issues_deliveries_never_run_on_two_replicas_and_a_dead_ones_pass_on(
        two_replicas: tuple[Store, Store]) -> None:
    a, b = two_replicas
    for guid, (n, action) in {"g1": (1, "opened"), "g2": (1, "edited"),
                              "g3": (2, "opened")}.items():
        assert await a.enqueue_delivery(guid, "issues", *_issue(n, action))
    [first] = await a.due_items(limit=1)  # (a's later claims take back what it holds)
    assert first.guid == "g1"
    # issue 1 is a's while it lives: b gets issue 2 only, and nothing twice
    assert [i.guid for i in await b.due_items(limit=10)] == ["g3"]
    assert [i.guid for i in await a.due_items(limit=10)] == ["g1", "g2"], "g3 is b's"
    await _silence(b, "replica-a")  # a is killed: what it claimed is b's to take, each alone
    [g1] = await b.due_items(limit=10)  # (one may be what killed it: see suspects, below)
    assert g1.guid == "g1"
    await b.finish(g1)
    assert [i.guid for i in await b.due_items(limit=10)] == ["g2"]
    assert not await a.is_leader() and await b.is_leader()


async def test_a_retry_on_another_replica_waits_for_the_first_and_gets_its_result(
        two_replicas: tuple[Store, Store]) -> None:
    a, b = two_replicas
    started, release = asyncio.Event(), asyncio.Event()
    runs: list[str] = []

    async def slow() -> dict[str, Any]:
        runs.append("a")
        started.set()
        await release.wait()
        return {"mail": "m1"}

    async def fast() -> dict[str, Any]:
        runs.append("b")
        return {"mail": "m2"}

    first = asyncio.create_task(a.once("tool:mail_send:x", "k1", "fp", slow))
    await started.wait()
    second = asyncio.create_task(b.once("tool:mail_send:x", "k1", "fp", fast))
    await asyncio.sleep(0.2)  # (b is polling the claim meanwhile; it must not have run)
    assert not second.done() and runs == ["a"]
    release.set()
    assert await first == {"mail": "m1"} and await second == {"mail": "m1"}
    assert runs == ["a"]


async def test_an_unfinished_claim_of_a_dead_replica_is_taken_over(
        two_replicas: tuple[Store, Store]) -> None:
    a, b = two_replicas
    never = asyncio.Event()

    async def stuck() -> dict[str, Any]:
        await never.wait()
        return {}

    task = asyncio.create_task(a.once("tool:mail_send:x", "k2", "fp", stuck))
    for _ in range(100):
        row = await b.fetchone("SELECT owner FROM idempotency WHERE key='k2'")
        if row is not None:
            break
        await asyncio.sleep(0.01)
    await _silence(b, "replica-a")

    async def redo() -> dict[str, Any]:
        return {"mail": "again"}

    assert await asyncio.wait_for(b.once("tool:mail_send:x", "k2", "fp", redo), 5) == {
        "mail": "again"}
    task.cancel()


async def test_the_oldest_live_replica_leads_and_a_clean_leave_passes_it_on(
        two_replicas: tuple[Store, Store]) -> None:
    a, b = two_replicas
    assert await a.is_leader() and not await b.is_leader()
    await a.leave()
    assert await b.is_leader()


async def test_a_mail_is_held_by_one_replica_at_a_time_and_let_go_when_its_holder_dies(
        two_replicas: tuple[Store, Store]) -> None:
    """The mailer's per-mail lock (`Services.lock_for`) is the store's named lock: a tool call
    on one replica and the worker on another never interleave on one mail."""
    a, b = two_replicas
    order: list[str] = []

    a_in = asyncio.Event()

    async def hold(store: Store, who: str, release: asyncio.Event) -> None:
        async with store.named_lock("mail-1"):
            order.append(f"{who} in")
            a_in.set()
            await release.wait()
            order.append(f"{who} out")

    a_release, b_release = asyncio.Event(), asyncio.Event()
    a_holds = asyncio.create_task(hold(a, "a", a_release))
    await a_in.wait()
    b_waits = asyncio.create_task(hold(b, "b", b_release))
    b_release.set()
    # b tries for as long as a holds the mail: a bounded look that it stays out
    done, _ = await asyncio.wait([b_waits], timeout=0.5)
    assert not done and order == ["a in"], "b entered while a held the mail"
    async with b.named_lock("mail-2"):  # another mail is not held up
        pass
    a_release.set()
    await asyncio.gather(a_holds, b_waits)
    assert order == ["a in", "a out", "b in", "b out"]

    # a holder killed mid-way (its session ends with it): the mail passes on
    entered = asyncio.Event()

    async def killed_while_holding() -> None:
        async with a.named_lock("mail-1"):
            entered.set()
            await asyncio.Event().wait()

    holder = asyncio.create_task(killed_while_holding())
    await entered.wait()
    await _terminate(b, "SELECT pid FROM pg_stat_activity WHERE application_name=$1",
                     "vaultmail locks replica-a")  # the sessions a SIGKILL would end
    async with b.named_lock("mail-1"):
        order.append("b again")
    holder.cancel()
    await asyncio.gather(holder, return_exceptions=True)
    assert order[-1] == "b again"


async def test_named_locks_whose_names_collide_in_32_bits_hold_each_other_up_no_more(
        two_replicas: tuple[Store, Store]) -> None:
    """Named locks hash their names, which tenants choose parts of (an org, an agent, a URL):
    hashed to 32 bits, one office could find a name of its own that collides with another's
    mail or run lock and hold it, holding that office up. 64 bits: no such name is found."""
    import asyncpg

    a, b = two_replicas
    conn = await asyncpg.connect(a._url)  # noqa: SLF001 - the database both replicas share
    try:  # two names that hashtext, 32 bits, makes one (a birthday search over 300,000)
        row = await conn.fetchrow(
            "SELECT min(k) AS one, max(k) AS other FROM (SELECT 'run:evil:' || g AS k,"
            " hashtext('run:evil:' || g) AS h FROM generate_series(1, 300000) g) t"
            " GROUP BY h HAVING count(*) > 1 LIMIT 1")
    finally:
        await conn.close()
    assert row is not None and row["one"] != row["other"]
    held, release = asyncio.Event(), asyncio.Event()

    async def hold() -> None:
        async with a.named_lock(row["one"]):
            held.set()
            await release.wait()

    holder = asyncio.create_task(hold())
    try:
        await held.wait()
        async with asyncio.timeout(10):  # (a guard: before, it waited for as long as a held)
            async with b.named_lock(row["other"]):
                pass
    finally:
        release.set()
        await holder


async def test_a_replica_of_the_release_before_is_excluded_its_way_while_it_lives(
        two_replicas: tuple[Store, Store]) -> None:
    """During a rolling deploy a replica of the release before takes its named locks as
    (NAMED_LOCKS, hashtext(name)): while one lives (its `replicas` row names no
    `named_locks`), this release takes them that way too, so the two never hold one mail."""
    import asyncpg

    from bot.store.postgres import NAMED_LOCKS

    a, b = two_replicas
    old = await asyncpg.connect(a._url)  # noqa: SLF001 - the old replica's session
    try:
        await old.execute("INSERT INTO replicas(id, url, started_at, seen_at, steady_since,"
                          " incarnation) VALUES ('old', NULL, vm_now(), vm_now(), vm_now(),"
                          " 'x')")
        assert await old.fetchval("SELECT pg_try_advisory_lock($1, hashtext('mail-1'))",
                                  NAMED_LOCKS)
        entered = asyncio.Event()

        async def take() -> None:
            async with b.named_lock("mail-1"):
                entered.set()
                # held the old way too: the old replica cannot take it meanwhile
                assert not await old.fetchval(
                    "SELECT pg_try_advisory_lock($1, hashtext('mail-1'))", NAMED_LOCKS)

        taking = asyncio.create_task(take())
        done, _ = await asyncio.wait([taking], timeout=0.5)  # (a bounded look: stays out)
        assert not done and not entered.is_set(), "b took a mail the old replica held"
        await old.fetchval("SELECT pg_advisory_unlock($1, hashtext('mail-1'))", NAMED_LOCKS)
        await asyncio.wait_for(taking, 10)
    finally:
        await old.close()


async def test_a_replica_of_the_release_before_that_starts_late_finds_a_held_mail_held(
        two_replicas: tuple[Store, Store]) -> None:
    """A replica of the release before may start (a rollback, a deploy's straggler) while
    this release holds a mail: the mail is held the old way too whenever that way is free, so
    the old replica cannot take it meanwhile (found by review: taken the new way only while no
    old replica lived, the old one that started then took the same mail beside it)."""
    import asyncpg

    from bot.store.postgres import NAMED_LOCKS

    _, b = two_replicas
    old = await asyncpg.connect(b._url)  # noqa: SLF001 - the old replica's session
    try:
        async with b.named_lock("mail-1"):
            await old.execute("INSERT INTO replicas(id, url, started_at, seen_at,"
                              " steady_since, incarnation) VALUES ('old', NULL, vm_now(),"
                              " vm_now(), vm_now(), 'x')")
            assert not await old.fetchval(
                "SELECT pg_try_advisory_lock($1, hashtext('mail-1'))", NAMED_LOCKS)
        assert await old.fetchval("SELECT pg_try_advisory_lock($1, hashtext('mail-1'))",
                                  NAMED_LOCKS)  # let go of both ways
    finally:
        await old.close()


async def test_a_cancelled_try_granted_meanwhile_leaves_no_lock_held_the_old_way(
        two_replicas: tuple[Store, Store]) -> None:
    """A try for a named lock cancelled while in flight, but granted, is let go of; if the
    same key is taken again meanwhile, the session holds it twice (advisory locks count), and
    both are let go of, the old way too (found by review: counted once, the old replica could
    never take that mail again)."""
    import asyncpg

    from bot.store.postgres import NAMED_LOCKS, NAMED_SEED
    from tests.support import until

    a, _ = two_replicas
    old = await asyncpg.connect(a._url)  # noqa: SLF001 - a replica of the release before
    blocker = await asyncpg.connect(a._url)  # noqa: SLF001
    try:
        await old.execute("INSERT INTO replicas(id, url, started_at, seen_at, steady_since,"
                          " incarnation) VALUES ('old', NULL, vm_now(), vm_now(), vm_now(),"
                          " 'x')")
        async with blocker.transaction():  # a's try, which reads `replicas`, waits in flight
            await blocker.execute("LOCK TABLE replicas IN ACCESS EXCLUSIVE MODE")
            first = asyncio.create_task(a.named_lock("mail-1").__aenter__())
            await until(lambda: _is(old.fetchval(
                "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type='Lock'"
                " AND application_name=$1", _LOCKS_OF_A), 1))
            first.cancel()
            with pytest.raises(asyncio.CancelledError):
                await first

            async def again() -> None:
                async with a.named_lock("mail-1"):
                    pass

            second = asyncio.create_task(again())
        await asyncio.wait_for(second, 10)
        await until(lambda: _is(old.fetchval(_HELD_BY, _LOCKS_OF_A), 0))  # the grant, let go
        assert await old.fetchval("SELECT pg_try_advisory_lock(hashtextextended($1, $2))",
                                  "mail-1", NAMED_SEED)
        assert await old.fetchval("SELECT pg_try_advisory_lock($1, hashtext($2))",
                                  NAMED_LOCKS, "mail-1")
    finally:
        await old.close()
        await blocker.close()


async def test_a_replica_whose_clock_runs_ahead_takes_over_nothing_from_a_live_one(
        two_replicas: tuple[Store, Store], monkeypatch: pytest.MonkeyPatch) -> None:
    """Liveness goes by the database's clock: b's host clock 30 s ahead of a's does not make
    a, which beat a moment ago, look dead to b."""
    a, b = two_replicas
    assert await a.enqueue_delivery("g1", "issues", *_issue(1, "opened"))
    [claimed] = await a.due_items(limit=1)
    await a.heartbeat()
    real = time.time
    monkeypatch.setattr(time, "time", lambda: real() + 30.0)  # b's view from here on
    assert await b.due_items(limit=10, now=real() + 30.0) == [], "a's claim still holds"
    assert [r["id"] for r in await b.live_replicas()] == ["replica-a", "replica-b"]
    assert not await b.is_leader()
    assert claimed.guid == "g1"


async def test_a_replica_whose_clock_is_behind_claims_what_is_due_and_retries_on_time(
        two_replicas: tuple[Store, Store], monkeypatch: pytest.MonkeyPatch) -> None:
    """Due times go by the database's clock too (issue 28: a replica 300 s behind sat on
    every delivery for exactly the skew): a delivery b took in is due for a at once, and a's
    retry in 60 s is due 60 s from the database's now, not its own."""
    a, b = two_replicas
    assert await b.enqueue_delivery("g1", "issues", *_issue(1, "opened"))
    real = time.time
    monkeypatch.setattr(time, "time", lambda: real() - 300.0)  # a's host, from here on
    [claimed] = await a.due_items(limit=10)
    assert claimed.guid == "g1"
    assert await a.fail(claimed, "502 Bad Gateway", time.time() + 60.0)
    row = await a.fetchone("SELECT next_at-vm_now() AS due_in FROM queue WHERE guid='g1'")
    assert row is not None and 0.0 < float(row["due_in"]) <= 60.0, dict(row or {})
    wake = await a.next_wakeup()  # by a's own clock, as its worker sleeps
    assert wake is not None and 0.0 < wake - time.time() <= 60.0


async def test_a_woken_waiter_is_never_joined_by_a_newcomer(tmp_path: Any) -> None:
    """The in-process lock of a key lives as long as anyone holds or waits for it: a holder
    that lets go, touches a new key among thousands, and asks again queues behind the waiter
    it woke, instead of finding the key forgotten and a fresh lock free."""
    store = await open_store(tmp_path / "index.sqlite3")
    inside, most = 0, 0
    holding, go = asyncio.Event(), asyncio.Event()

    async def enter(wait: asyncio.Event | None = None) -> None:
        nonlocal inside, most
        async with store.named_lock("mail-1"):
            inside += 1
            most = max(most, inside)
            holding.set()
            if wait is not None:
                await wait.wait()
            await asyncio.sleep(0)
            inside -= 1

    async def first() -> None:
        await enter(go)
        async with store.named_lock("fresh"):  # a new key, with thousands already seen
            pass
        await enter()  # asks again: behind the waiter it woke

    try:
        one = asyncio.create_task(first())
        await holding.wait()
        two = asyncio.create_task(enter())  # waits for mail-1
        for n in range(10_000):  # keys used once and let go meanwhile
            async with store.named_lock(f"other-{n}"):
                pass
        go.set()
        await asyncio.gather(one, two)
    finally:
        await store.close()
    assert most == 1, "two tasks held mail-1 at once"


async def test_a_try_that_failed_on_one_live_replica_is_retried_on_another(
        two_replicas: tuple[Store, Store]) -> None:
    """A worker's try that failed (a forge 502) leaves its claim unfinished while its replica
    lives on: the retry, claimed by another replica, takes the claim over and runs, instead of
    waiting for a result that will never come."""
    a, b = two_replicas

    async def bad_gateway() -> dict[str, Any]:
        raise RuntimeError("502 from the forge")

    async def works() -> dict[str, Any]:
        return {"mail": "m1"}

    with pytest.raises(RuntimeError):
        await a.once("forge", "acme/scout-vault#1:opened", "fp", bad_gateway)
    await a.heartbeat()  # a lives on (for DEAD_AFTER from here)
    retried = await asyncio.wait_for(  # bounded within a's life: before the fix b waited on
        b.once("forge", "acme/scout-vault#1:opened", "fp", works), timeout=DEAD_AFTER / 2)
    assert retried == {"mail": "m1"}
    assert await a.once("forge", "acme/scout-vault#1:opened", "fp", bad_gateway) == \
        {"mail": "m1"}, "done once: a later try gets the result"


async def test_a_replica_beats_while_another_holds_the_write_lock(
        two_replicas: tuple[Store, Store]) -> None:
    """Heartbeats take no turn at the write lock: b holding it (a long reindex) does not keep
    a from saying it is alive, so a is not taken for dead and robbed of its work."""
    a, b = two_replicas
    async with b.transaction():  # b holds the write lock across every replica
        await asyncio.wait_for(a.heartbeat(), timeout=DEAD_AFTER / 2)


async def test_a_replica_taken_for_dead_cannot_finish_or_fail_what_another_took_over(
        two_replicas: tuple[Store, Store]) -> None:
    """Fencing: a replica that stalled past DEAD_AFTER (taken for dead, its delivery taken
    over) and then wakes may not mark done, dead or due again what another replica now runs."""
    a, b = two_replicas
    assert await a.enqueue_delivery("g1", "issues", *_issue(1, "opened"))
    assert await a.enqueue_delivery("g2", "issues", *_issue(2, "opened"))
    first, second = await a.due_items(limit=10)
    await _silence(b, "replica-a")  # a stalls: b takes them over (one at a time)
    [b_first] = await b.due_items(limit=10)
    assert b_first.guid == "g1"
    assert not await a.finish(first), "a wakes and finishes late: not recorded"
    assert not await a.fail(second, "502", None), "... or gives up late"
    rows = {r["guid"]: (r["state"], r["lease_owner"]) for r in
            await b.fetchall("SELECT guid, state, lease_owner FROM queue")}
    assert rows == {"g1": ("pending", "replica-b"), "g2": ("pending", None)}
    assert await b.fail(b_first, "502", time.time() + 60), "b's own word counts"
    [b_second] = await b.due_items(limit=10)
    assert b_second.guid == "g2"
    assert await b.finish(b_second)
    assert not await a.finish(first), "nor a's late word about a retry b scheduled"
    rows = {r["guid"]: (r["state"], r["lease_owner"]) for r in
            await b.fetchall("SELECT guid, state, lease_owner FROM queue")}
    assert rows == {"g1": ("pending", None), "g2": ("done", None)}


async def test_deliveries_a_stopped_replica_held_run_alone_and_one_that_keeps_stopping_them_is_dead_lettered(  # noqa: E501
        two_replicas: tuple[Store, Store]) -> None:
    """A delivery held by a replica that stopped may be what stopped it (an input that
    exhausts memory): it runs alone, so those that merely shared its batch go on, and once
    replicas have stopped POISON_AFTER times holding it, it is a dead letter, not run again."""
    a, b = two_replicas
    for n in (1, 2, 3):
        assert await a.enqueue_delivery(f"g{n}", "issues", *_issue(n, "opened"))
    assert [i.guid for i in await a.due_items(limit=10)] == ["g1", "g2", "g3"]
    await _silence(b, "replica-a")  # a stops holding all three
    [g1] = await b.due_items(limit=10)
    assert (g1.guid, g1.takeovers) == ("g1", 1), "a suspect is claimed alone"
    await a.heartbeat()  # a is back, b stops holding g1
    await _silence(a, "replica-b")
    [again] = await a.due_items(limit=10)
    assert (again.guid, again.takeovers) == ("g1", 2)
    await b.heartbeat()
    await _silence(b, "replica-a")  # and a stops holding it too: the third replica stopped
    [g2] = await b.due_items(limit=10)
    assert (g2.guid, g2.takeovers) == ("g2", 1), "g1 is not run again; the others go on"
    [dead] = await b.dead_letters()
    assert dead.guid == "g1" and dead.last_error is not None
    assert "stopped 3 times" in dead.last_error and "--replay" in dead.last_error
    await b.finish(g2)
    [g3] = await b.due_items(limit=10)
    assert g3.guid == "g3"
    await b.finish(g3)
    assert await b.replay(dead.id) == 1  # an operator fixed the cause: it runs, uncounted
    [replayed] = await b.due_items(limit=10)
    assert (replayed.guid, replayed.takeovers) == ("g1", 0)


async def test_a_claim_ends_just_before_a_suspect(two_replicas: tuple[Store, Store]) -> None:
    a, b = two_replicas
    for n in (1, 2, 3):
        assert await a.enqueue_delivery(f"g{n}", "issues", *_issue(n, "opened"))
    [g1] = await b.due_items(limit=1)
    await b.fail(g1, "502", time.time() + 60)  # g1 waits to retry; a claims g2, g3
    assert [i.guid for i in await a.due_items(limit=10)] == ["g2", "g3"]
    await _silence(b, "replica-a")
    later = time.time() + 61
    [retried] = await b.due_items(limit=10, now=later)
    assert retried.guid == "g1"
    assert await b.finish(retried)
    assert [(i.guid, i.takeovers) for i in await b.due_items(limit=10, now=later)] == \
        [("g2", 1)]


async def test_the_old_process_of_a_replica_restarted_under_its_id_cannot_finish_its_claims(
        two_replicas: tuple[Store, Store]) -> None:
    """Fencing is by claim, not by name: replica-a hangs, is restarted under the same
    REPLICA_ID and claims the delivery again; the hung process's late word is not recorded
    (it would have let the delivery be claimed again while the new process runs it)."""
    a, b = two_replicas
    assert await a.enqueue_delivery("g1", "issues", *_issue(1, "opened"))
    [old] = await a.due_items(limit=10)
    restarted = await open_store(a._url)  # noqa: SLF001 - the same database
    try:
        await restarted.join("replica-a")
        [new] = await restarted.due_items(limit=10)
        assert new.guid == "g1" and new.lease != old.lease
        assert not await a.fail(old, "502", time.time()), "the hung process's word"
        assert await b.due_items(limit=10) == [], "still the new process's alone"
        assert await restarted.finish(new)
        with pytest.raises(ReplicaIdTaken):  # the hung one's heartbeat finds out: it retires
            await a.heartbeat()
        assert a.retired is not None
    finally:
        await restarted.close()


async def test_after_a_database_outage_nothing_is_taken_over_from_replicas_that_come_back(
        two_replicas: tuple[Store, Store]) -> None:
    """Nobody could beat while the database was away, so to the first replica back every
    other looks dead. It takes nothing over until it has itself beaten steadily for
    DEAD_AFTER, by which time the others have beaten too: no delivery is counted as having
    stopped a replica (after a few outages healthy ones would become dead letters)."""
    a, b = two_replicas
    assert await a.enqueue_delivery("g1", "issues", *_issue(1, "opened"))
    [held] = await a.due_items(limit=10)
    async with b.transaction() as db:  # DEAD_AFTER + 1 s without a beat from anyone
        await db.execute("UPDATE replicas SET seen_at=seen_at-?", (DEAD_AFTER + 1,))
    assert await b.due_items(limit=10) == [], "b's worker claims before b has beaten"
    await b.heartbeat()  # b is back first
    assert await b.due_items(limit=10) == [], "b is not steady yet"
    await a.heartbeat()  # a is back too
    assert await a.finish(held), "a's claim held"
    assert (await b.fetchone("SELECT takeovers FROM queue"))["takeovers"] == 0


async def test_a_replica_started_after_the_holder_died_counts_the_takeover(
        two_replicas: tuple[Store, Store]) -> None:
    """A delivery that stops its replica while the orchestrator starts a new one (a fresh
    id) each time is counted each time, and becomes a dead letter."""
    a, _ = two_replicas
    assert await a.enqueue_delivery("g1", "issues", *_issue(1, "opened"))
    holder: Store = a
    await holder.due_items(limit=10)
    started: list[Store] = []
    try:
        for n in range(1, POISON_AFTER + 1):
            fresh = await open_store(a._url)  # noqa: SLF001 - the same database
            started.append(fresh)
            await fresh.join(f"replica-new-{n}")
            async with fresh.transaction() as db:  # it died a minute ago; the new one has
                await db.execute("UPDATE replicas SET seen_at=? WHERE id=?",  # been up 6 s
                                 (time.time() - 60, holder.replica_id))
                await db.execute("UPDATE replicas SET steady_since=? WHERE id=?",
                                 (time.time() - DEAD_AFTER - 1, fresh.replica_id))
            claimed = await fresh.due_items(limit=10)
            if n < POISON_AFTER:
                assert [(i.guid, i.takeovers) for i in claimed] == [("g1", n)]
            holder = fresh  # ... and it stops its new replica too
        assert claimed == []
        [dead] = await a.dead_letters()
        assert dead.guid == "g1" and "stopped 3 times" in (dead.last_error or "")
    finally:
        for store in started:
            await store.close()


async def _never_run() -> dict[str, Any]:
    raise AssertionError("a retired process ran work")


async def _beating(store: Store) -> asyncio.Task[None]:
    """`store`'s process alive: it beats every HEARTBEAT, as bot.app.replica does."""
    async def beat() -> None:
        while True:
            await store.heartbeat()
            await asyncio.sleep(HEARTBEAT)
    return asyncio.create_task(beat())


async def test_a_second_process_under_a_live_replicas_id_is_refused(
        two_replicas: tuple[Store, Store]) -> None:
    """Two processes under one REPLICA_ID would share each other's claims: the second is
    refused at its start, with what to do, while the first beats."""
    a, _ = two_replicas
    beats = await _beating(a)
    copy = await open_store(a._url)  # noqa: SLF001 - the same database
    try:
        with pytest.raises(ReplicaIdInUse, match="REPLICA_ID 'replica-a' is in use.*own"):
            await copy.join("replica-a")
        assert [r["id"] for r in await a.live_replicas()] == ["replica-a", "replica-b"]
        await a.heartbeat()  # a goes on as it was
    finally:
        beats.cancel()
        await copy.close()


async def test_a_replica_restarted_under_its_id_takes_its_place_and_the_stalled_one_retires(
        two_replicas: tuple[Store, Store]) -> None:
    """replica-a stops beating (hung, or killed a moment ago) and is started again under its
    id: the new process takes its place and what it held; should the old one wake, it finds
    its id taken and claims, leads and lets go of nothing any more."""
    a, _ = two_replicas
    assert await a.enqueue_delivery("g1", "issues", *_issue(1, "opened"))
    [old] = await a.due_items(limit=10)
    restarted = await open_store(a._url)  # noqa: SLF001 - the same database
    try:
        await restarted.join("replica-a")  # a does not beat: after a look, it goes on
        [new] = await restarted.due_items(limit=10)
        assert new.guid == "g1"
        # the old process wakes, its worker before its heartbeat: it claims nothing back,
        # lets go of nothing, and takes no idempotency claim over
        await a.release()
        assert await a.due_items(limit=10) == []
        assert a.retired is not None and "claims no more work" in a.retired
        assert await a.next_wakeup() is None, "and does not spin"
        with pytest.raises(ReplicaIdTaken):
            await a.once("tool", "k1", "fp", _never_run)
        await a.heartbeat()  # beats no more under the other's id
        assert not await a.is_leader()
        assert (await restarted.fetchone("SELECT lease_owner FROM queue"))["lease_owner"] \
            == "replica-a", "still the new process's claim"
        assert not await a.finish(old)
        await a.leave()  # a stop of the old process lets go of nothing of the new one's
        assert "replica-a" in [r["id"] for r in await restarted.live_replicas()]
        assert await restarted.finish(new)
    finally:
        await restarted.close()


async def test_the_server_gives_up_a_vanished_replicas_sessions_within_seconds(
        two_replicas: tuple[Store, Store]) -> None:
    """A host that vanishes closes none of its sessions: the server probes each of a
    replica's sessions (pool, named locks, listener) so that their locks go in seconds, not
    after the kernel's two hours. (A vanished host cannot be staged here: what the server was
    asked for each session is checked, over TCP as the tests connect.)"""
    a, _ = two_replicas
    await a.listen(lambda keys: None)  # type: ignore[attr-defined]
    async with a.named_lock("mail-1"):
        lanes = a._lanes  # type: ignore[attr-defined]  # noqa: SLF001 - its lock sessions
        sessions = [lane.session for lane in lanes if lane.session is not None]
        sessions.append(a._listener)  # type: ignore[attr-defined]  # noqa: SLF001
        async with a._pool.acquire() as pooled:  # type: ignore[attr-defined]  # noqa: SLF001
            sessions.append(pooled)
            for session in sessions:
                row = await session.fetchrow(
                    "SELECT current_setting('tcp_keepalives_idle') AS idle,"
                    " current_setting('tcp_keepalives_count') AS count,"
                    " current_setting('tcp_user_timeout') AS user_timeout,"
                    " inet_client_addr() IS NOT NULL AS tcp")
                assert row["tcp"], "the tests connect over TCP"
                assert (row["idle"], row["count"], row["user_timeout"]) == ("5", "3", "8000")


async def test_a_replica_not_steady_yet_does_not_look_again_at_once_for_what_it_may_not_take(
        two_replicas: tuple[Store, Store]) -> None:
    """Just started (or back after an outage), b may not take a dead replica's claim yet: its
    worker is told of nothing due, so it waits its usual look instead of asking again and
    again until it is steady."""
    a, b = two_replicas
    assert await a.enqueue_delivery("g1", "issues", *_issue(1, "opened"))
    await a.due_items(limit=10)
    async with b.transaction() as db:  # a died a minute ago; b started a moment ago
        await db.execute("UPDATE replicas SET seen_at=? WHERE id='replica-a'",
                         (time.time() - 60,))
    assert await b.due_items(limit=10) == []
    assert await b.next_wakeup() is None


async def test_wake_ups_made_together_reach_the_other_replicas_in_one_message(
        two_replicas: tuple[Store, Store]) -> None:
    """Each NOTIFY's commit takes PostgreSQL's one notify-queue lock, shared by every office
    (and every database of the server; found by review): a replica sends one message at a
    time, with every key made new since the last, not one NOTIFY per wake-up."""
    from bot.app.notify import Notifier
    from tests.support import until

    a, b = two_replicas
    heard: list[list[str]] = []
    await b.listen(heard.append)
    notifier = Notifier()
    notifier.publish = a.broadcast
    for n in range(50):  # wake-ups made in one turn of the loop: 50 mails indexed at once
        notifier.notify([f"agent:a{n}"], org="acme" if n % 2 else "globex")
    await until(lambda: sum(len(keys) for keys in heard) >= 50)
    assert sorted(k for keys in heard for k in keys) == sorted(
        f"{'acme' if n % 2 else 'globex'}/agent:a{n}" for n in range(50))
    assert len(heard) == 1, f"{len(heard)} messages for 50 wake-ups made together"


_LOCKS_OF_A = "vaultmail locks replica-a"  # (the sessions replica-a holds named locks on)
_HELD_BY = ("SELECT count(*) FROM pg_locks l JOIN pg_stat_activity s USING (pid)"
            " WHERE l.locktype='advisory' AND l.granted AND s.application_name=$1")
_HOLDING = ("SELECT pid FROM pg_locks WHERE locktype='advisory' AND granted AND objsubid=2"
            " AND classid::bigint=$1 AND objid::bigint=$2")


def _unsigned(pair: tuple[int, int]) -> tuple[int, int]:
    """A two-key advisory lock as pg_locks shows it (oids: unsigned)."""
    return pair[0] & 0xFFFF_FFFF, pair[1] & 0xFFFF_FFFF


async def _is(value: Any, expected: Any) -> bool:
    return bool(await value == expected)


async def _terminate(store: Store, query: str, *args: Any) -> list[int]:
    """Ends the backends whose pids `query` gives (as a killed backend, or a SIGKILLed
    replica's host closing its sockets), waiting until each has."""
    import asyncpg

    admin = await asyncpg.connect(store._url)  # type: ignore[attr-defined]  # noqa: SLF001
    try:
        pids = [r["pid"] for r in await admin.fetch(query, *args)]
        for pid in pids:
            assert await admin.fetchval("SELECT pg_terminate_backend($1, 10000)", pid)
        return pids
    finally:
        await admin.close()


@pytest.mark.parametrize("part", ["first", "second"])
async def test_a_holder_whose_lock_session_is_cut_stops_before_another_replica_takes_it(
        two_replicas: tuple[Store, Store], part: str) -> None:
    """A session holding a named lock cut while it is held (a killed backend; a database
    restart cuts them all): the holder is stopped (NamedLockLost, a ConnectionError), and
    another replica gets the mail only once it has. Found by review: the one locker session
    was opened again and the holder worked on while another replica took the same mail."""
    from bot.store.locks import named_lock_pair, named_lock_second_pair

    a, b = two_replicas
    order: list[str] = []
    entered = asyncio.Event()

    async def work() -> None:
        try:
            async with a.named_lock("mail-1"):
                order.append("a in")
                entered.set()
                await asyncio.Event().wait()  # (a forge call that takes its time)
        except ConnectionError as exc:  # what stopped it, recorded
            order.append(f"a stopped: {type(exc).__name__}")

    holder = asyncio.create_task(work())
    await entered.wait()
    pair = named_lock_pair if part == "first" else named_lock_second_pair
    assert len(await _terminate(a, _HOLDING, *_unsigned(pair("mail-1")))) == 1
    async with asyncio.timeout(30):  # (a guard)
        async with b.named_lock("mail-1"):
            order.append("b in")
    holder.cancel()
    await asyncio.gather(holder, return_exceptions=True)
    assert order == ["a in", "a stopped: NamedLockLost", "b in"]
    async with a.named_lock("mail-2"):  # the lane is open again
        pass


async def test_a_replicas_named_locks_take_a_few_sessions_each_a_lane_of_its_own(
        two_replicas: tuple[Store, Store]) -> None:
    """a holds 100 of acme's mails and b waits for each: each replica's named locks are on at
    most NAMED_LOCK_LANES sessions (found by review of a fix that held each lock on sessions of
    its own: 4 replicas could pass max_connections), spread over them (found by review: one
    session per replica took every office's locks, one statement at a time)."""
    import asyncpg

    from bot.store.locks import named_lock_pair
    from bot.store.postgres import NAMED_LOCK_LANES
    from tests.support import until

    a, b = two_replicas
    n = 100
    release = asyncio.Event()
    held: list[str] = []

    async def hold(key: str) -> None:
        async with a.named_lock(key):
            held.append(key)
            await release.wait()

    async def take(key: str) -> None:
        async with b.named_lock(key):
            pass

    holders = [asyncio.create_task(hold(f"acme-mail-{i}")) for i in range(n)]
    admin = await asyncpg.connect(a._url)  # type: ignore[attr-defined]  # noqa: SLF001
    try:
        await until(lambda: len(held) == n)
        waiters = [asyncio.create_task(take(f"acme-mail-{i}")) for i in range(n)]
        await until(lambda: _is(admin.fetchval(
            "SELECT count(*) FROM pg_stat_activity WHERE application_name=$1",
            "vaultmail locks replica-b"), NAMED_LOCK_LANES))  # b looks on each of its lanes
        pids = {r["pid"] for i in range(n) for r in await admin.fetch(
            _HOLDING, *_unsigned(named_lock_pair(f"acme-mail-{i}")))}
        assert 1 < len(pids) <= NAMED_LOCK_LANES, f"a's 100 locks held on {len(pids)} sessions"
        sessions = await admin.fetch(
            "SELECT application_name, count(*) AS n FROM pg_stat_activity"
            " WHERE application_name LIKE 'vaultmail locks %' GROUP BY 1 ORDER BY 1")
        assert [(r["application_name"], r["n"]) for r in sessions] == [
            ("vaultmail locks replica-a", NAMED_LOCK_LANES),
            ("vaultmail locks replica-b", NAMED_LOCK_LANES)]
        assert not any(w.done() for w in waiters)
        release.set()
        async with asyncio.timeout(60):  # (a guard)
            await asyncio.gather(*holders, *waiters)
    finally:
        release.set()
        await admin.close()


async def test_a_lane_held_up_in_the_database_holds_up_no_other_lanes_keys(
        two_replicas: tuple[Store, Store]) -> None:
    """b's session for one lane of its named locks stalls (its backend stopped: swapping, a
    slow disk) while a statement waits on it: b takes and lets go of beta's mail, on other
    lanes, beside it (found by review: one session per replica took every office's locks, one
    statement at a time, so beta's waited behind acme's tries; 5 ms with 200 of acme's mails
    waited for)."""
    import contextlib
    import os
    import signal
    from pathlib import Path

    def ours(pid: int) -> bool:  # (a server the tests were given may be another host's)
        with contextlib.suppress(OSError):
            return b"postgres" in Path(f"/proc/{pid}/cmdline").read_bytes()
        return False

    from bot.store.locks import named_lock_pair
    from bot.store.postgres import NAMED_LOCK_LANES, named_lock_lane

    _, b = two_replicas
    lane = named_lock_lane("acme-mail-0")
    acme = next(f"acme-mail-{i}" for i in range(1, 1000) if named_lock_lane(f"acme-mail-{i}")
                == lane)
    beta = next(f"beta-mail-{i}" for i in range(1000) if named_lock_lane(f"beta-mail-{i}")
                == (lane + 2) % NAMED_LOCK_LANES)  # (its two lanes apart from acme's)
    async with b.named_lock("acme-mail-0"):
        import asyncpg

        admin = await asyncpg.connect(b._url)  # type: ignore[attr-defined]  # noqa: SLF001
        try:  # the lane's session, idle now (nothing of it in flight), stopped
            [pid] = [r["pid"] for r in await admin.fetch(
                _HOLDING, *_unsigned(named_lock_pair("acme-mail-0")))]
        finally:
            await admin.close()
        if not ours(pid):
            pytest.skip("the database's backends are not this host's processes to stop")
        os.kill(pid, signal.SIGSTOP)
        try:
            async def take(key: str) -> None:
                async with b.named_lock(key):
                    pass

            stuck = asyncio.create_task(take(acme))  # its try, sent, has no answer
            async with asyncio.timeout(30):  # (a guard: before, it waited as long as acme's)
                async with b.named_lock(beta):
                    pass
            assert not stuck.done()
        finally:
            os.kill(pid, signal.SIGCONT)
        await asyncio.wait_for(stuck, 30)
