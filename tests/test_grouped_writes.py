"""Fewer write transactions per event (issue 22), counted through the store: on SQLite, whose
one writer holds every key anyway, the idempotency results of tries that finish together are
written in one transaction (each under its own claim, as alone), and so are the forge write
budget's places (each placed after the one before it, as alone); a write transaction for a
group instead of one each. On PostgreSQL results go one by one as before, and places are
grouped per installation only, so that no office waits on another's keys. On both, the worker's
forge-change keys have their results written in the transaction that finishes the deliveries
(the one write between two batches) instead of one of their own."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from gidgethub import sansio
from gidgethub.routing import Router

from bot.app.context import HandlerContext
from bot.app.worker import Worker
from bot.store import QueueItem, open_store
from bot.store.budget import Limits, SharedWriteBudget
from bot.store.db import Store
from bot.store.group import GroupCommit
from bot.store.idempotency import Settlement, resumed
from tests.support import until

CREATE = "POST /repos/{owner}/{repo}/issues"


@pytest.fixture
async def store(tmp_path: Path, database_url: str) -> AsyncIterator[Store]:
    opened = await open_store(database_url or str(tmp_path / "index.sqlite3"))
    try:
        yield opened
    finally:
        await opened.close()


async def test_results_of_tries_that_finish_together_commit_in_one_transaction(
        store: Store) -> None:
    go, all_claimed = asyncio.Event(), asyncio.Event()
    claimed = 0

    def work(n: int):  # type: ignore[no-untyped-def]
        async def run() -> dict[str, int]:
            nonlocal claimed
            claimed += 1
            if claimed == 10:
                all_claimed.set()
            await go.wait()
            return {"n": n}
        return run

    calls = [asyncio.ensure_future(store.once("forge", f"k{n}", "fp", work(n)))
             for n in range(10)]
    await asyncio.wait_for(all_claimed.wait(), 30)  # every key claimed, each on its own
    before = store.write_transactions
    # one key taken over meanwhile (its replica taken for dead): its result stays theirs
    async with store.transaction() as db:
        await db.execute("UPDATE idempotency SET owner='other', attempts=attempts+1,"
                         " result='{\"n\": -1}' WHERE scope='forge' AND key='k3'")
    go.set()
    results = await asyncio.gather(*calls)
    assert results == [{"n": -1} if n == 3 else {"n": n} for n in range(10)]
    rows = await store.fetchall("SELECT key, result FROM idempotency ORDER BY key")
    assert {r["key"]: r["result"] for r in rows} == {
        f"k{n}": '{"n": -1}' if n == 3 else f'{{"n": {n}}}' for n in range(10)}
    results_written = store.write_transactions - before - 1  # (the takeover's own)
    assert results_written == (1 if store.engine == "sqlite" else 10)
    # a later call gets the stored result, and nothing runs
    assert await store.once("forge", "k5", "fp", work(99)) == {"n": 5}


async def test_writes_placed_together_are_placed_as_one_by_one(store: Store) -> None:
    limits = Limits(per_minute=5, per_hour=500, endpoint_points_per_minute=0, slack=1.0)
    budget = SharedWriteBudget(store, limits)
    before = store.write_transactions
    waits = await asyncio.gather(*(budget.reserve(str(i % 3), CREATE, True)
                                   for i in range(30)))
    # each installation's first 5 go at once, the rest a minute (and the slack) later or more
    for who in range(3):
        mine = [w for i, w in enumerate(waits) if i % 3 == who]
        assert sum(1 for w in mine if w < 30.0) == 5, mine
        assert all(w >= 60.0 for w in mine[5:]), mine
    rows = await store.fetchall("SELECT who FROM forge_writes")
    assert len(rows) == 30
    # SQLite: one transaction for the 30 places; PostgreSQL: one per installation's group
    assert store.write_transactions - before == (1 if store.engine == "sqlite" else 3)


async def test_a_failed_group_fails_each_of_its_callers_and_the_next_group_goes() -> None:
    calls: list[list[int]] = []

    async def run(batch: list[int]) -> list[int]:
        calls.append(batch)
        if 0 in batch:
            raise RuntimeError("disk full")
        return [n * 2 for n in batch]

    group: GroupCommit[int, int] = GroupCommit(run)
    first = await asyncio.gather(*(group(n) for n in range(3)), return_exceptions=True)
    assert all(isinstance(r, RuntimeError) for r in first)
    assert await asyncio.gather(*(group(n) for n in range(1, 4))) == [2, 4, 6]
    assert calls == [[0, 1, 2], [1, 2, 3]]
    assert group.transactions == 1


async def test_a_caller_that_left_before_its_turn_has_nothing_written() -> None:
    seen: list[list[str]] = []
    release = asyncio.Event()

    async def run(batch: list[str]) -> list[str]:
        seen.append(batch)
        await release.wait()
        return batch

    group: GroupCommit[str, str] = GroupCommit(run)
    a = asyncio.ensure_future(group("a"))
    await asyncio.sleep(0)
    await asyncio.sleep(0)  # "a" is being written; "b" and "c" wait for the next group
    b, c = asyncio.ensure_future(group("b")), asyncio.ensure_future(group("c"))
    await asyncio.sleep(0)
    b.cancel()
    release.set()
    assert await a == "a" and await c == "c"
    assert b.cancelled()
    assert seen == [["a"], ["c"]]


async def test_a_result_left_for_later_is_recorded_in_the_transaction_that_finishes(
        store: Store) -> None:
    """The worker's forge-change keys (`once(..., later=)`): a result is recorded in the
    transaction that finishes the delivery and claims the next, not in one of its own. Until
    then a call with the key in this process gets it, and nothing runs again (this replica's
    own unfinished claim would otherwise be taken over, as a dead one's)."""
    runs = 0

    async def work() -> dict[str, int]:
        nonlocal runs
        runs += 1
        return {"n": runs}

    later: list[Settlement] = []
    before = store.write_transactions
    assert await store.once("forge", "k", "", work, later=later) == {"n": 1}
    assert store.write_transactions - before == 1  # the claim alone
    assert [r["result"] for r in await store.fetchall(
        "SELECT result FROM idempotency WHERE key='k'")] == [None]
    assert await store.once("forge", "k", "", work, later=later) == {"n": 1}
    assert runs == 1 and len(later) == 1
    # a second key's claim, taken over while its try stalled: the key keeps theirs
    assert await store.once("forge", "t", "", work, later=later) == {"n": 2}
    async with store.transaction() as db:
        await db.execute("UPDATE idempotency SET owner='other', attempts=attempts+1,"
                         " result='{\"n\": -1}' WHERE scope='forge' AND key='t'")
    before = store.write_transactions
    await store.finish_and_claim([], limit=0, also=lambda db: store.settle_in(db, later))
    store.settled(later)
    assert store.write_transactions - before == 1
    rows = await store.fetchall("SELECT key, result FROM idempotency ORDER BY key")
    assert {r["key"]: r["result"] for r in rows} == {"k": '{"n": 1}', "t": '{"n": -1}'}
    assert await store.once("forge", "k", "", work) == {"n": 1}  # stored: nothing runs
    assert runs == 2


def tried() -> tuple[list[bool], Callable[[], Awaitable[dict[str, int]]]]:
    """A `work` that notes whether each try of it was a resumed one, and says how many ran."""
    tries: list[bool] = []

    async def work() -> dict[str, int]:
        tries.append(resumed())
        return {"n": len(tries)}

    return tries, work


async def test_a_key_claimed_with_its_delivery_is_run_under_without_a_claim_of_its_own(
        store: Store) -> None:
    """The worker claims a forge change's key in the transaction that claims its delivery
    (`preclaim_in`); `once(..., preclaimed=True)` runs under that claim. One no `once` ran
    under is let go of (`preclaims_unused`, `let_go_in`): a later call claims it as a first
    try, not a resumed one, and no other replica waits on it."""
    tries, work = tried()
    async with store.transaction() as db:
        assert await store.preclaim_in(db, "forge", [("k", "")]) == {"k"}
        # claimed: left to `once`
        assert await store.preclaim_in(db, "forge", [("unused", ""), ("k", "")]) == {"unused"}
    later: list[Settlement] = []
    before = store.write_transactions
    assert await store.once("forge", "k", "", work, later=later, preclaimed=True) == {"n": 1}
    assert store.write_transactions == before  # neither a claim nor a result of its own
    async with store.transaction() as db:
        await store.settle_in(db, later)
        store.preclaims_unused([("forge", "unused")])
        await store.let_go_in(db, store.stray())
    store.settled(later)
    rows = await store.fetchall("SELECT key, result FROM idempotency ORDER BY key")
    assert {r["key"]: r["result"] for r in rows} == {"k": '{"n": 1}'}
    assert await store.once("forge", "unused", "", work) == {"n": 2}
    assert tries == [False, False]


async def test_a_key_claimed_with_its_delivery_and_taken_over_since_is_not_run_under(
        store: Store) -> None:
    """This replica was taken for dead after its batch claimed a key (a stall past
    DEAD_AFTER), and another replica took the key over and finished it: the delivery, when it
    comes to run, gets that result; nothing runs on a claim that is no longer its own."""
    tries, work = tried()
    async with store.transaction() as db:
        assert await store.preclaim_in(db, "forge", [("k", "")]) == {"k"}
    async with store.transaction() as db:
        await db.execute("UPDATE idempotency SET owner='other', attempts=2,"
                         " result='{\"n\": -1}' WHERE scope='forge' AND key='k'")
    later: list[Settlement] = []
    assert await store.once("forge", "k", "", work, later=later, preclaimed=True) == {"n": -1}
    assert tries == [] and later == []


async def _preclaimed_beside_older_at_work(store: Store, key: str) -> None:
    """`k` claimed with its delivery, while a live replica of a release before is at work on
    `key` (its change keyed so)."""
    async with store.transaction() as db:
        await db.execute("INSERT INTO replicas(id, url, started_at, seen_at, steady_since)"
                         " VALUES ('older', NULL, vm_now(), vm_now()+3600, vm_now())")
        await db.execute("INSERT INTO idempotency(scope, key, fingerprint, claimed_at, owner)"
                         " VALUES ('forge', ?, '', 0, 'older')", (key,))
        assert await store.preclaim_in(db, "forge", [("k", "")]) == {"k"}


async def test_a_key_peeked_at_with_a_preclaimed_tries_fence_is_waited_on_while_another_works_it(
        store: Store) -> None:
    """A try claimed with its delivery reads the keys its work looks under first (`once(...,
    peek=)`, as the worker's look under the keys releases before used) with its claim's fence,
    one read: a key there that another live replica is at work on (a release before, during
    a rolling deploy) is still waited for, read again until its result is there, which the
    work gets; a key not there is none."""
    await _preclaimed_beside_older_at_work(store, "old")
    began = asyncio.Event()

    async def work() -> dict[str, Any]:
        began.set()
        return {"old": await store.left_under("forge", "old"),
                "none": await store.left_under("forge", "none")}

    task = asyncio.create_task(store.once("forge", "k", "", work, later=[], preclaimed=True,
                                          peek=[("forge", "old"), ("forge", "none")]))
    await began.wait()  # (its fence has read the key: unfinished, its owner alive)
    async with store.transaction() as db:  # the other replica finishes it
        await db.execute("UPDATE idempotency SET result='{\"n\": 7}' WHERE key='old'")
    assert json.loads(json.dumps(await asyncio.wait_for(task, 10))) == {
        "old": [True, {"n": 7}], "none": [False, None]}


async def test_a_second_peeked_key_is_read_again_after_a_wait_on_the_first(
        store: Store) -> None:
    """What the fence read of the keys a try looks under is stale once the work waited on
    one of them: a change another replica finished under the second key meanwhile (a release
    before, its own key) is found there, not made again."""
    await _preclaimed_beside_older_at_work(store, "old1")
    began = asyncio.Event()

    async def work() -> dict[str, Any]:  # as the worker's look under the keys before
        began.set()
        for left in ("old1", "old2"):
            _, done = await store.left_under("forge", left)
            if done is not None:
                return done
        return {"delivery": "made again"}

    task = asyncio.create_task(store.once("forge", "k", "", work, later=[], preclaimed=True,
                                          peek=[("forge", "old1"), ("forge", "old2")]))
    await began.wait()  # (its fence has read both: old1 at work on a live replica, no old2)
    async with store.transaction() as db:
        # another replica finished the change under old2; old1's try was let go of
        await db.execute("INSERT INTO idempotency(scope, key, fingerprint, claimed_at, owner,"
                         " result) VALUES ('forge', 'old2', '', 0, 'older2',"
                         " '{\"delivery\": \"d-other\"}')")
        await db.execute("UPDATE idempotency SET owner=NULL WHERE key='old1'")
    assert await asyncio.wait_for(task, 10) == {"delivery": "d-other"}


async def test_an_idle_worker_looks_for_work_with_a_read_and_writes_nothing(
        tmp_path: Path) -> None:
    """An idle worker (each replica's, twice a second on PostgreSQL) asks with a read whether
    anything is due for it, and claims with a write transaction only then; what comes in is
    still claimed and handled at once."""
    store = await open_store(tmp_path / "index.sqlite3")
    looks = 0
    look = store.next_wakeup

    async def counted() -> float | None:  # (counts the worker's looks; answers as before)
        nonlocal looks
        looks += 1
        return await look()

    store.next_wakeup = counted  # type: ignore[method-assign]
    router = Router()
    handled: list[str] = []

    @router.register("issues")
    async def record(event: sansio.Event, ctx: HandlerContext) -> None:
        handled.append(event.delivery_id)

    def context(item: QueueItem, log: Any) -> HandlerContext:
        return HandlerContext(services=None, forge=None, installation_id=None,  # type: ignore[arg-type]
                              delivery_id=item.guid, log=log)

    worker = Worker(store, router, Router(), lambda payload: False, context)
    worker.start()
    try:
        await until(lambda: looks >= 1)  # idle
        before = store.write_transactions
        for n in range(2, 6):
            worker.wake()
            await until(lambda n=n: looks >= n)  # type: ignore[misc]
        assert store.write_transactions == before
        payload = {"action": "closed", "issue": {"number": 1},
                   "repository": {"full_name": "acme/scout-vault"}}
        assert await store.enqueue_delivery("d1", "issues", payload,
                                            json.dumps(payload).encode())
        worker.wake()
        await until(lambda: handled == ["d1"])
    finally:
        await worker.stop()
        await store.close()
