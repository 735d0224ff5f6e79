"""The worker claims as room frees up, not batch by batch (issue 22): a delivery that arrives
while another is slow runs beside it, and one about the slow one's issue runs after it, in
order, even when a later claim took it; behind a retry it waits for the retry."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

from gidgethub import sansio
from gidgethub.routing import Router

from bot.app.context import HandlerContext
from bot.app.worker import Worker
from bot.store import QueueItem, Store, open_store


def _comment(issue: int, comment: int) -> dict[str, Any]:
    return {"action": "created", "issue": {"number": issue},
            "comment": {"id": comment, "updated_at": "2026-12-05T00:00:00Z"},
            "repository": {"full_name": "acme/scout-vault"}, "sender": {"login": "someone"},
            "installation": {"id": 1}}


def _context(item: QueueItem, log: Any) -> HandlerContext:
    return HandlerContext(services=None, forge=None,  # type: ignore[arg-type]
                          installation_id=item.installation_id, delivery_id=item.guid, log=log)


async def _deliver(store: Store, guid: str, issue: int, comment: int) -> None:
    payload = _comment(issue, comment)
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

    worker = Worker(store, router, Router(), lambda payload: False, _context)
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

    worker = Worker(store, router, Router(), lambda payload: False, _context)
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


async def test_what_a_later_claim_took_behind_a_retry_waits_for_the_retry(
        tmp_path: Path) -> None:
    """x-2, claimed while x-1 ran, does not run before x-1's retry when x-1 fails: it is let go
    of, held behind x-1 by the store, and runs after it."""
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

    worker = Worker(store, router, Router(), lambda payload: False, _context,
                    base_backoff=0.05)
    try:
        await _deliver(store, "x-1", 1, 101)
        worker.start()
        await asyncio.wait_for(first_started.wait(), 30)
        await _deliver(store, "x-2", 1, 102)
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
