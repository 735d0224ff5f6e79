"""The worker claims as room frees up, not batch by batch (issue 22): a delivery that arrives
while another is slow runs beside it, and one about the slow one's issue runs after it, in
order, even when a later claim took it; behind a retry it waits for the retry."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

import pytest
from gidgethub import sansio
from gidgethub.routing import Router

from bot.app import worker as worker_module
from bot.app.context import HandlerContext
from bot.app.worker import Worker
from bot.store import QueueItem, Store, offices, open_store
from tests.support import older_index


def _comment(issue: int, comment: int, vault: str = "acme/scout-vault") -> dict[str, Any]:
    return {"action": "created", "issue": {"number": issue},
            "comment": {"id": comment, "updated_at": "2026-12-05T00:00:00Z"},
            "repository": {"full_name": vault}, "sender": {"login": "someone"},
            "installation": {"id": 1}}


def context(item: QueueItem, log: Any) -> HandlerContext:
    return HandlerContext(services=None, forge=None,  # type: ignore[arg-type]
                          installation_id=item.installation_id, delivery_id=item.guid, log=log)


async def _deliver(store: Store, guid: str, issue: int, comment: int,
                   vault: str = "acme/scout-vault") -> None:
    payload = _comment(issue, comment, vault)
    assert await store.enqueue_delivery(guid, "issue_comment", payload,
                                        json.dumps(payload).encode())


async def _claimed(store: Store, guid: str) -> None:
    """Until `guid` is claimed by a worker."""
    for _ in range(3000):
        if await store.fetchone("SELECT 1 FROM queue WHERE guid=? AND lease_owner IS NOT NULL",
                                (guid,)) is not None:
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"{guid} never claimed")


async def test_a_delivery_arriving_while_another_is_slow_runs_beside_it(tmp_path: Path) -> None:
    """Before, the next claim waited for the slowest delivery of the one before: one slow forge
    round trip held every delivery that arrived meanwhile, other offices' too."""
    store = await open_store(tmp_path / "index.sqlite3")
    router = Router()
    slow_started, slow_may_end, quick_done = asyncio.Event(), asyncio.Event(), asyncio.Event()

    @router.register("issue_comment")
    async def reply(event: sansio.Event, ctx: HandlerContext) -> None:
        if event.delivery_id == "slow":
            slow_started.set()
            await slow_may_end.wait()
        else:
            quick_done.set()

    worker = Worker(store, router, Router(), lambda payload: False, context)
    try:
        await _deliver(store, "slow", 1, 101)
        worker.start()
        await asyncio.wait_for(slow_started.wait(), 30)
        await _deliver(store, "quick", 2, 201)  # another issue's, after the slow one's claim
        worker.wake()
        await asyncio.wait_for(quick_done.wait(), 30)  # (a guard: not waited out)
        assert not slow_may_end.is_set()
        slow_may_end.set()
        await worker.idle(timeout=30)
    finally:
        slow_may_end.set()
        await worker.stop(drain_timeout=1.0)
        await store.close()


async def test_a_later_claim_about_a_running_issue_runs_after_it_in_order(
        tmp_path: Path) -> None:
    store = await open_store(tmp_path / "index.sqlite3")
    router = Router()
    first_started, first_may_end = asyncio.Event(), asyncio.Event()
    ran: list[str] = []

    @router.register("issue_comment")
    async def reply(event: sansio.Event, ctx: HandlerContext) -> None:
        ran.append(f"start {event.delivery_id}")
        if event.delivery_id == "x-1":
            first_started.set()
            await first_may_end.wait()
        ran.append(f"end {event.delivery_id}")

    worker = Worker(store, router, Router(), lambda payload: False, context)
    try:
        await _deliver(store, "x-1", 1, 101)
        worker.start()
        await asyncio.wait_for(first_started.wait(), 30)
        for n in (2, 3):  # about the same issue, claimed while x-1 runs
            await _deliver(store, f"x-{n}", 1, 100 + n)
        await _deliver(store, "y-1", 2, 201)  # (another issue's: it runs meanwhile)
        worker.wake()
        await _claimed(store, "x-3")
        for _ in range(3000):
            if "end y-1" in ran:
                break
            await asyncio.sleep(0.01)
        assert ran[-2:] == ["start y-1", "end y-1"], ran
        first_may_end.set()
        await worker.idle(timeout=30)
        assert [r for r in ran if "x-" in r] == [
            "start x-1", "end x-1", "start x-2", "end x-2", "start x-3", "end x-3"]
    finally:
        first_may_end.set()
        await worker.stop(drain_timeout=1.0)
        await store.close()


@pytest.mark.parametrize("suspect", [False, True])
async def test_what_a_later_claim_took_behind_a_retry_waits_for_the_retry(
        tmp_path: Path, suspect: bool) -> None:
    """x-2, claimed while x-1 ran, does not run before x-1's retry when x-1 fails: it is let go
    of, held behind x-1 by the store, and runs after it. So too when x-2 is a suspect (one a
    stopped replica held), which runs alone once every lane has run out: its issue's lane was
    cut short meanwhile (found by review: it ran first)."""
    store = await open_store(tmp_path / "index.sqlite3")
    router = Router()
    first_started, first_may_end = asyncio.Event(), asyncio.Event()
    ran: list[str] = []

    @router.register("issue_comment")
    async def reply(event: sansio.Event, ctx: HandlerContext) -> None:
        if event.delivery_id == "x-1" and not first_started.is_set():
            first_started.set()
            await first_may_end.wait()
            raise RuntimeError("the forge was away")  # retried after a backoff
        ran.append(event.delivery_id)

    worker = Worker(store, router, Router(), lambda payload: False, context,
                    base_backoff=0.2)
    try:
        await _deliver(store, "x-1", 1, 101)
        worker.start()
        await asyncio.wait_for(first_started.wait(), 30)
        await _deliver(store, "x-2", 1, 102)
        if suspect:  # as a replica that stopped holding it leaves it
            async with store.transaction() as db:
                await db.execute("UPDATE queue SET takeovers=1 WHERE guid='x-2'")
        worker.wake()
        await _claimed(store, "x-2")
        first_may_end.set()
        await worker.idle(timeout=30)
        assert ran == ["x-1", "x-2"]
        row = await store.fetchone("SELECT attempts FROM queue WHERE guid='x-1'")
        assert row is not None and row["attempts"] == 1
    finally:
        first_may_end.set()
        await worker.stop(drain_timeout=1.0)
        await store.close()


async def test_a_stop_out_of_time_lets_go_of_the_preclaims_of_what_never_ran(
        tmp_path: Path) -> None:
    """A delivery that waited in its lane when a stop ran out of time never ran: the claim of
    its forge change made with its own claim is let go of (kept, its next try was taken for a
    resumed one, and another replica waited on it)."""
    store = await open_store(tmp_path / "index.sqlite3")
    router = Router()
    first_started, never = asyncio.Event(), asyncio.Event()
    ran: list[str] = []

    @router.register("issue_comment")
    async def reply(event: sansio.Event, ctx: HandlerContext) -> None:
        ran.append(event.delivery_id)
        if event.delivery_id == "x-1":
            first_started.set()
            await never.wait()

    worker = Worker(store, router, Router(), lambda payload: False, context)
    try:
        await _deliver(store, "x-1", 1, 101)
        await _deliver(store, "x-2", 1, 102)  # the same issue's: waits in x-1's lane
        worker.start()
        await asyncio.wait_for(first_started.wait(), 30)
        await worker.stop(drain_timeout=0.3)  # runs out of time: the lane is cancelled
        assert ran == ["x-1"]
        keys = [r["key"] for r in await store.fetchall(
            "SELECT key FROM idempotency WHERE result IS NULL ORDER BY key")]
        assert not any(":102:" in k for k in keys), keys
    finally:
        never.set()
        await store.close()


async def test_a_retry_falling_due_is_claimed_while_lanes_keep_ending(
        tmp_path: Path, monkeypatch: Any) -> None:
    """While others run and nothing arrives, the worker still looks now and then (IDLE_LOOK)
    for what fell due: a lane's end does not put the look off (found by review: with lanes
    ending more often than a look, a retry waited for every one of them)."""
    monkeypatch.setattr(worker_module, "IDLE_LOOK", 0.5)
    store = await open_store(tmp_path / "index.sqlite3")
    router = Router()
    retried, slow_may_end = asyncio.Event(), asyncio.Event()
    tries: list[str] = []

    @router.register("issue_comment")
    async def reply(event: sansio.Event, ctx: HandlerContext) -> None:
        who = event.delivery_id
        if who == "retried":
            tries.append(who)
            if len(tries) == 1:
                raise RuntimeError("the forge was away")  # due again at once
            retried.set()
        elif who == "slow":
            await slow_may_end.wait()
        else:  # 100 lanes, one ending every 0.2 s, for 20 s
            await asyncio.sleep(0.2 * int(who.split("-")[1]))

    await _deliver(store, "slow", 1, 101)
    await _deliver(store, "retried", 2, 201)
    for n in range(1, 101):
        await _deliver(store, f"lane-{n}", 10 + n, 1000 + n)
    worker = Worker(store, router, Router(), lambda payload: False, context,
                    base_backoff=0.001)
    try:
        worker.start()
        await asyncio.wait_for(retried.wait(), 15)  # (before, after the last lane: 20 s)
    finally:
        slow_may_end.set()
        await worker.stop(drain_timeout=0.5)
        await store.close()


async def test_a_storm_about_one_issue_holds_no_other_issues_delivery(tmp_path: Path) -> None:
    """Deliveries about one issue run one at a time: a backlog of them behind a slow one would
    fill the room claims are made for, and another issue's delivery would wait for the slow
    one after all (found by review). A deep lane's issue is left alone by claims, and what it
    holds past DEEP counts for no room."""
    store = await open_store(tmp_path / "index.sqlite3")
    router = Router()
    slow_started, slow_may_end, other_done = asyncio.Event(), asyncio.Event(), asyncio.Event()
    ran: list[str] = []

    @router.register("issue_comment")
    async def reply(event: sansio.Event, ctx: HandlerContext) -> None:
        ran.append(event.delivery_id)
        if event.delivery_id == "x-0":
            slow_started.set()
            await slow_may_end.wait()
        elif event.delivery_id == "other":
            other_done.set()

    for n in range(200):  # about issue 1, more than a claim holds
        await _deliver(store, f"x-{n}", 1, 1000 + n)
    worker = Worker(store, router, Router(), lambda payload: False, context)
    try:
        worker.start()
        await asyncio.wait_for(slow_started.wait(), 30)
        await _deliver(store, "other", 2, 201)  # another issue's
        worker.wake()
        await asyncio.wait_for(other_done.wait(), 30)  # (before: never, while x-0 ran)
        slow_may_end.set()
        await worker.idle(timeout=60)
        assert [r for r in ran if r != "other"] == [f"x-{n}" for n in range(200)]
    finally:
        slow_may_end.set()
        await worker.stop(drain_timeout=1.0)
        await store.close()


async def test_a_claim_slower_than_a_look_is_not_followed_by_another_at_once(
        tmp_path: Path, monkeypatch: Any) -> None:
    """The look while lanes run is timed from the end of the last claim: timed from its start,
    a claim slower than a look (a loaded database) was followed by another at once, and the
    worker wrote without a pause while nothing arrived (found by review)."""
    clock = [1000.0]

    class Clock:  # the worker's monotonic clock, moved on by the claims alone
        monotonic = staticmethod(lambda: clock[0])
        perf_counter = staticmethod(time.perf_counter)
        time = staticmethod(time.time)

    monkeypatch.setattr(worker_module, "time", Clock)
    store = await open_store(tmp_path / "index.sqlite3")
    router = Router()
    slow_started, slow_may_end = asyncio.Event(), asyncio.Event()

    @router.register("issue_comment")
    async def reply(event: sansio.Event, ctx: HandlerContext) -> None:
        slow_started.set()
        await slow_may_end.wait()

    claims = 0
    original = store.finish_and_claim

    async def slow_claim(*args: Any, **kwargs: Any) -> Any:
        nonlocal claims
        claims += 1
        clock[0] += 2 * worker_module.IDLE_LOOK  # (slower than a look)
        return await original(*args, **kwargs)

    monkeypatch.setattr(store, "finish_and_claim", slow_claim)
    await _deliver(store, "slow", 1, 101)
    worker = Worker(store, router, Router(), lambda payload: False, context)
    try:
        worker.start()
        await asyncio.wait_for(slow_started.wait(), 30)
        first = claims
        # nothing arrives and nothing falls due: the next look is a whole IDLE_LOOK away (5 s
        # of the event loop's time; here 1 s is watched, in which, before, claims ran on)
        await asyncio.sleep(1.0)
        assert claims == first
    finally:
        slow_may_end.set()
        await worker.stop(drain_timeout=1.0)
        await store.close()


async def test_a_barrier_waits_for_a_deep_issues_deliveries_before_it(
        tmp_path: Path, database_url: str) -> None:
    """A claim leaves a deep lane's issue alone; it takes no barrier (a push: about no issue)
    after the first of that issue's deliveries it left, so the barrier still runs after
    everything before it (found by review: it ran between x-39 and x-40)."""
    store = await open_store(database_url or tmp_path / "index.sqlite3")
    await (store.join(sole=True) if store.engine == "sqlite" else store.join("a"))
    router = Router()
    slow_started, slow_may_end = asyncio.Event(), asyncio.Event()
    ran: list[str] = []

    @router.register("issue_comment")
    async def reply(event: sansio.Event, ctx: HandlerContext) -> None:
        ran.append(event.delivery_id)
        if event.delivery_id == "x-0":
            slow_started.set()
            await slow_may_end.wait()

    @router.register("push")
    async def pushed(event: sansio.Event, ctx: HandlerContext) -> None:
        ran.append(event.delivery_id)

    claimed = asyncio.Queue[list[str]]()
    original = store.finish_and_claim

    async def claim(*args: Any, **kwargs: Any) -> Any:
        taken, superseded = await original(*args, **kwargs)
        claimed.put_nowait([i.guid for i in taken])
        return taken, superseded

    store.finish_and_claim = claim  # type: ignore[method-assign]
    worker = Worker(store, router, Router(), lambda payload: False, context)
    deep = worker.deep + 8  # a lane deeper than DEEP: its issue is left alone by claims
    for n in range(deep):
        await _deliver(store, f"x-{n}", 1, 1000 + n)
    try:
        worker.start()
        await asyncio.wait_for(slow_started.wait(), 30)
        for n in range(deep, deep + 10):  # left alone while the lane is deep
            await _deliver(store, f"x-{n}", 1, 1000 + n)
        push = {"ref": "refs/heads/main", "repository": {"full_name": "acme/scout-vault"},
                "sender": {"login": "someone"}, "installation": {"id": 1}}
        while not claimed.empty():
            claimed.get_nowait()
        assert await store.enqueue_delivery("barrier", "push", push, json.dumps(push).encode())
        worker.wake()
        await asyncio.wait_for(claimed.get(), 30)  # a claim after the push arrived
        slow_may_end.set()
        await worker.idle(timeout=60)
        assert ran == [f"x-{n}" for n in range(deep + 10)] + ["barrier"]
    finally:
        slow_may_end.set()
        await worker.stop(drain_timeout=1.0)
        await store.close()


class _SlowPush:
    """A worker's router whose comment handler notes each delivery it runs and whose push
    handler waits until `end` is set (acme's forge slow to give its config), on a store of
    one replica; deliveries of acme's and globex's handed in by `comment` and `push`."""

    PUSH = {"ref": "refs/heads/main", "sender": {"login": "someone"},
            "installation": {"id": 1}, "repository": {
                "full_name": "acme/.github", "name": ".github", "owner": {"login": "acme"}}}

    def __init__(self, store: Store) -> None:
        self.store = store
        self.router = Router()
        self.started, self.end, self.globex_ran = asyncio.Event(), asyncio.Event(), \
            asyncio.Event()
        self.ran: list[str] = []

        @self.router.register("issue_comment")
        async def reply(event: sansio.Event, ctx: HandlerContext) -> None:
            self.ran.append(event.delivery_id)
            if event.delivery_id.startswith("globex"):
                self.globex_ran.set()

        @self.router.register("push")
        async def pushed(event: sansio.Event, ctx: HandlerContext) -> None:
            self.ran.append(f"{event.delivery_id} started")
            self.started.set()
            await self.end.wait()
            self.ran.append(f"{event.delivery_id} ended")

    async def comment(self, guid: str, org: str, issue: int) -> None:
        payload = {**_comment(issue, 100 + issue),
                   "repository": {"full_name": f"{org}/scout-vault"}}
        assert await self.store.enqueue_delivery(guid, "issue_comment", payload,
                                                 json.dumps(payload).encode())

    async def push(self, guid: str) -> None:
        assert await self.store.enqueue_delivery(guid, "push", self.PUSH,
                                                 json.dumps(self.PUSH).encode())

    def worker(self, **kwargs: Any) -> Worker:
        return Worker(self.store, self.router, Router(), lambda payload: False, context,
                      **kwargs)

    async def until_globex_ran_beside_the_push(self) -> None:
        await asyncio.wait_for(self.started.wait(), 30)
        await asyncio.wait_for(self.globex_ran.wait(), 30)  # while acme's push still runs


async def _one_replica(tmp_path: Path, database_url: str) -> Store:
    store = await open_store(database_url or tmp_path / "index.sqlite3")
    await (store.join(sole=True) if store.engine == "sqlite" else store.join("a"))
    return store


async def test_an_offices_delivery_about_no_issue_waits_for_its_own_office_alone(
        tmp_path: Path, database_url: str) -> None:
    """acme's config is pushed (a delivery about no issue: its office's config changes for
    what comes after it). It runs after acme's deliveries before it and before acme's after
    it, as it always did; globex's, before and after it, run beside it (before, it waited for
    every lane of every office and then ran alone, and every office's deliveries after it
    waited for it: one org's slow config reload held them all)."""
    scene = _SlowPush(await _one_replica(tmp_path, database_url))
    await scene.comment("acme-before", "acme", 1)
    await scene.push("push")
    await scene.comment("acme-after", "acme", 2)
    await scene.comment("globex-after", "globex", 1)
    worker = scene.worker()
    try:
        worker.start()
        await scene.until_globex_ran_beside_the_push()
        assert "acme-after" not in scene.ran and "push ended" not in scene.ran
        scene.end.set()
        await worker.idle(timeout=60)
        ran = scene.ran
        assert ran.index("acme-before") < ran.index("push started")
        assert ran.index("push ended") < ran.index("acme-after")
    finally:
        scene.end.set()
        await worker.stop(drain_timeout=1.0)
        await scene.store.close()


async def test_an_offices_deliveries_waiting_behind_its_slow_config_push_leave_room_for_others(
        tmp_path: Path, database_url: str) -> None:
    """acme's config push is slow (its forge is), and acme's deliveries after it, about as
    many issues as the worker holds at once, wait for it; globex's delivery, after them all,
    still runs beside the push (found by review: what waited behind the push was claimed and
    counted as running, so once acme's backlog filled the worker's room no claim was made,
    and globex waited for acme's config reload after all)."""
    scene = _SlowPush(await _one_replica(tmp_path, database_url))
    worker = scene.worker(concurrency=2)
    worker.batch, worker.refill = 4, 1  # (a small worker: its room filled by a few)
    await scene.push("push")
    for n in range(1, 2 * worker.batch):
        await scene.comment(f"acme-{n}", "acme", n)
    # and acme's next push, after them all: it runs after them, never before one the
    # worker has not taken yet
    await scene.push("push-2")
    await scene.comment("globex-1", "globex", 1)
    try:
        worker.start()
        await scene.until_globex_ran_beside_the_push()
        ran = scene.ran
        assert "push ended" not in ran and not any(r.startswith("acme") for r in ran)
        scene.end.set()
        await worker.idle(timeout=60)
        ran = [r for r in ran if not r.endswith(" started")]
        assert ran[:2] == ["globex-1", "push ended"]
        assert sorted(ran[2:-1]) == sorted(f"acme-{n}" for n in range(1, 2 * worker.batch))
        assert ran[-1] == "push-2 ended"
    finally:
        scene.end.set()
        await worker.stop(drain_timeout=1.0)
        await scene.store.close()


async def test_an_offices_deliveries_about_no_issue_behind_its_slow_push_are_not_all_claimed(
        tmp_path: Path, database_url: str) -> None:
    """acme's config push is slow, and many more of acme's deliveries about no issue (pushes)
    come after it. What waits behind the push counts for no room, and claims leave acme's
    deliveries about an issue alone meanwhile, but not those about no issue (a claim cannot
    tell whose they are): each claim took as many as it had room for, into the wait behind
    the push, and counted none, claim after claim, until acme's whole backlog was claimed and
    held in memory by this replica (found by review). globex's delivery still runs beside the
    push; the worker holds no more than its room."""
    scene = _SlowPush(await _one_replica(tmp_path, database_url))
    worker = scene.worker(concurrency=2)
    worker.batch, worker.refill = 4, 1  # (a small worker: its room filled by a few)
    pushes = [f"push-{n}" for n in range(4 * worker.batch)]
    for guid in pushes:
        await scene.push(guid)
    await scene.comment("globex-1", "globex", 1)
    try:
        worker.start()
        await scene.until_globex_ran_beside_the_push()
        assert sorted(scene.ran) == ["globex-1", "push-0 started"]
        assert len(worker._in_flight) <= worker.batch, \
            f"{len(worker._in_flight)} of acme's pushes claimed behind its slow one"
        scene.end.set()
        await worker.idle(timeout=60)
        assert [r for r in scene.ran if not r.endswith(" started")] == [
            "globex-1", *(f"{guid} ended" for guid in pushes)]
    finally:
        scene.end.set()
        await worker.stop(drain_timeout=1.0)
        await scene.store.close()


def office_comment(org: str, issue: int) -> dict[str, Any]:
    return {"action": "created", "issue": {"number": issue},
            "comment": {"id": issue, "updated_at": "2026-12-05T00:00:00Z"},
            "repository": {"full_name": f"{org}/scout-vault", "owner": {"login": org}},
            "organization": {"login": org}, "sender": {"login": "someone"},
            "installation": {"id": 1 if org == "acme" else 2}}


async def test_one_offices_backlog_does_not_hold_back_another_offices_delivery(
        tmp_path: Path, database_url: str, monkeypatch: Any) -> None:
    """acme's 40 deliveries fill the worker (8 in flight, each waiting on a slow forge) and 32
    wait; globex's one arrives after them. As acme's first ones end, the room they leave goes to
    globex's delivery first: acme runs its share of the worker (half) and more, and is served
    after the others. Before, claims took the oldest due deliveries whoever's they were, so
    globex's waited behind acme's whole backlog (on Gitea, an org's admins can sign any number
    of deliveries). The room is never left idle: what globex does not need goes to acme."""
    for engine in ("sqlite", "postgresql"):  # room for 8; a claim as soon as one ends
        monkeypatch.setitem(worker_module.BATCH, engine, 8)
        monkeypatch.setitem(worker_module.REFILL, engine, 1)
    store = await open_store(database_url or tmp_path / "index.sqlite3")
    if database_url:
        await store.join("replica-a")
    router = Router()
    gate = asyncio.Semaphore(0)  # acme's forge: one write each time it is let through
    started: list[str] = []

    @router.register("issue_comment")
    async def reply(event: sansio.Event, ctx: HandlerContext) -> None:
        started.append(event.delivery_id)
        if event.delivery_id.startswith("acme"):
            await gate.acquire()

    worker = Worker(store, router, Router(), lambda payload: False, context, concurrency=8)
    try:
        for n in range(1, 41):
            payload = office_comment("acme", n)
            assert await store.enqueue_delivery(f"acme-{n}", "issue_comment", payload,
                                                json.dumps(payload).encode())
        worker.start()
        for _ in range(3000):  # (a guard, never waited out: until the room is full)
            if len(started) == 8:
                break
            await asyncio.sleep(0.01)
        payload = office_comment("globex", 1)
        assert await store.enqueue_delivery("globex-1", "issue_comment", payload,
                                            json.dumps(payload).encode())
        for _ in range(4):
            gate.release()  # four of acme's end: room for four
        for _ in range(3000):
            if len(started) >= 12:
                break
            await asyncio.sleep(0.01)
        assert "globex-1" in started[8:12], started
        for _ in range(40):
            gate.release()
        await worker.idle(timeout=30)
        assert sorted(started) == sorted([f"acme-{n}" for n in range(1, 41)] + ["globex-1"])
    finally:
        for _ in range(40):
            gate.release()
        await worker.stop(drain_timeout=1.0)
        await store.close()


async def test_a_delivery_queued_before_its_vaults_rename_runs_before_one_after_it(
        tmp_path: Path, database_url: str) -> None:
    """x-1, about acme/scout-vault#1, is queued; the vault is renamed scout-mail (its queue
    row names acme/scout-mail#1 now: bot.store.offices.rename_vault_in); x-2, about
    acme/scout-mail#1, is queued after it. One issue: x-2 runs after x-1. Before, the store
    ordered them as one issue, and claimed them together, but the worker ran each in the lane
    of the name its payload gave: x-2 ran beside x-1, and ended first."""
    store = await open_store(database_url or tmp_path / "index.sqlite3")
    router = Router()
    first_started, first_may_end = asyncio.Event(), asyncio.Event()
    ran: list[str] = []

    @router.register("issue_comment")
    async def reply(event: sansio.Event, ctx: HandlerContext) -> None:
        ran.append(f"start {event.delivery_id}")
        if event.delivery_id == "x-1":
            first_started.set()
            await first_may_end.wait()
        ran.append(f"end {event.delivery_id}")

    worker = Worker(store, router, Router(), lambda payload: False, context)
    try:
        await _deliver(store, "x-1", 1, 101)
        async with store.transaction() as db:
            await offices.rename_vault_in(db, "acme/scout-vault", "acme/scout-mail")
        await _deliver(store, "x-2", 1, 102, vault="acme/scout-mail")
        worker.start()
        await asyncio.wait_for(first_started.wait(), 30)
        for _ in range(3000):  # until x-2 waits in x-1's lane, or runs
            if "start x-2" in ran or any({"x-1", "x-2"} <= {i.guid for i in lane.items}
                                         for lane in worker._lanes.values()):
                break
            await asyncio.sleep(0.01)
        first_may_end.set()
        await worker.idle(timeout=30)
        assert ran == ["start x-1", "end x-1", "start x-2", "end x-2"], ran
    finally:
        first_may_end.set()
        await worker.stop(drain_timeout=1.0)
        await store.close()


async def _one_issue_in_order(store: Store, before: str, after: str,
                              rename: tuple[str, str] | None = None,
                              queued: bool = False) -> list[str]:
    """x-1 about `before`#1 queued (`queued`: it is already), then (after `rename`, when
    given) x-2 about `after`#1; what ran, in order, x-1 held until x-2 waits in its lane or
    runs."""
    router = Router()
    first_started, first_may_end = asyncio.Event(), asyncio.Event()
    ran: list[str] = []

    @router.register("issue_comment")
    async def reply(event: sansio.Event, ctx: HandlerContext) -> None:
        ran.append(f"start {event.delivery_id}")
        if event.delivery_id == "x-1":
            first_started.set()
            await first_may_end.wait()
        ran.append(f"end {event.delivery_id}")

    worker = Worker(store, router, Router(), lambda payload: False, context)
    try:
        if not queued:
            await _deliver(store, "x-1", 1, 101, vault=before)
        if rename is not None:
            async with store.transaction() as db:
                await offices.rename_vault_in(db, *rename)
        await _deliver(store, "x-2", 1, 102, vault=after)
        worker.start()
        await asyncio.wait_for(first_started.wait(), 30)
        for _ in range(3000):  # until x-2 waits in x-1's lane, or runs
            if "start x-2" in ran or any({"x-1", "x-2"} <= {i.guid for i in lane.items}
                                         for lane in worker._lanes.values()):
                break
            await asyncio.sleep(0.01)
        first_may_end.set()
        await worker.idle(timeout=30)
        return ran
    finally:
        first_may_end.set()
        await worker.stop(drain_timeout=1.0)


async def test_a_delivery_queued_before_a_capitalised_vaults_rename_runs_before_one_after_it(
        tmp_path: Path, database_url: str) -> None:
    """GitHub's payloads spell a repository as its owner does: x-1 about
    Initech/Scout-Vault#1 is queued, the vault renamed Initech/Scout-Mail, x-2 about
    Initech/Scout-Mail#1 queued after. Before, the rename rewrote x-1's key in lower case
    (initech/scout-mail#1) while x-2 kept its payload's case: two issues, x-2 ran beside
    x-1 and ended first."""
    store = await open_store(database_url or tmp_path / "index.sqlite3")
    try:
        ran = await _one_issue_in_order(store, "Initech/Scout-Vault", "Initech/Scout-Mail",
                                        rename=("Initech/Scout-Vault", "Initech/Scout-Mail"))
        assert ran == ["start x-1", "end x-1", "start x-2", "end x-2"], ran
    finally:
        await store.close()


async def test_deliveries_spelling_one_repository_in_two_cases_run_in_arrival_order(
        tmp_path: Path, database_url: str) -> None:
    """GitHub's names are case-insensitive: x-1 names Acme/Scout-Vault#1, x-2
    acme/scout-vault#1, one issue. Before, each was keyed as spelt: x-2 ran beside x-1."""
    store = await open_store(database_url or tmp_path / "index.sqlite3")
    try:
        ran = await _one_issue_in_order(store, "Acme/Scout-Vault", "acme/scout-vault")
        assert ran == ["start x-1", "end x-1", "start x-2", "end x-2"], ran
    finally:
        await store.close()


async def test_keys_the_release_before_queued_in_their_payloads_case_order_with_this_ones(
        tmp_path: Path, empty_database_url: str) -> None:
    """A rolling deploy: x-1 about Initech/Scout-Vault#1 was queued by the release before
    (schema 42), keyed in its payload's case; the index is upgraded, and x-2, spelt
    initech/scout-vault#1, queued by this release. One issue: x-2 runs after x-1. A replica
    of the release before, still live, queues in its payload's case too: lowered as well."""
    payload = json.dumps(_comment(1, 101, "Initech/Scout-Vault"))
    insert = ("INSERT INTO queue(guid, event, installation_id, issue_key, office, payload,"
              " next_at, created_at) VALUES (?, 'issue_comment', 1, ?, 'initech', ?, 0, 0)")
    target = await older_index(tmp_path, empty_database_url, 42,
                               [(insert, ("x-1", "Initech/Scout-Vault#1", payload))])
    store = await open_store(target)
    try:
        async with store.transaction() as db:  # as the release before writes it, mid-deploy
            await db.execute(insert, ("x-0", "Initech/Scout-Vault#2", payload))
        keys = {r["guid"]: r["issue_key"] for r in await store.fetchall(
            "SELECT guid, issue_key FROM queue")}
        assert keys == {"x-1": "initech/scout-vault#1", "x-0": "initech/scout-vault#2"}
        ran = await _one_issue_in_order(store, "Initech/Scout-Vault", "initech/scout-vault",
                                        queued=True)
        assert ran.index("end x-1") < ran.index("start x-2"), ran
    finally:
        await store.close()
