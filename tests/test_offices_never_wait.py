"""One office's wait for its own forge budget never holds another office's deliveries (issue
22): a delivery whose write would wait longer than the worker waits in line (the hour's
creations of its installation spent, a primary limit's reset) is put off until then, no
attempt counted, and the worker goes on claiming."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

from gidgethub import sansio
from gidgethub.routing import Router

from bot.app.context import HandlerContext
from bot.app.worker import Worker
from bot.forge.pacing import WritePacer
from bot.store import QueueItem, Store, open_store


def _comment(org: str, n: int) -> dict[str, Any]:
    return {"action": "created", "issue": {"number": n},
            "comment": {"id": 1000 + n, "updated_at": "2026-12-05T00:00:00Z"},
            "repository": {"full_name": f"{org}/scout-vault"}, "sender": {"login": "someone"},
            "installation": {"id": 2 if org == "evil" else 1}}


async def until_put_off(store: Store, guid: str) -> None:
    """Until the delivery `guid` has been put off (its error recorded)."""
    deadline = time.monotonic() + 30
    while (await store.fetchone("SELECT 1 FROM queue WHERE guid=? AND last_error IS NOT NULL",
                                (guid,))) is None:
        assert time.monotonic() < deadline, f"{guid} never put off"
        await asyncio.sleep(0.01)


async def test_an_office_out_of_budget_is_put_off_and_holds_no_other_office(
        tmp_path: Path) -> None:
    store = await open_store(tmp_path / "index.sqlite3")
    # evil's installation has made its 500 creations of the hour (its agents' own calls)
    evil_budget = WritePacer(min_interval=0, content_per_minute=80, content_per_hour=500)
    evil_budget._content.extend([time.monotonic() - 10] * 500)  # noqa: SLF001
    router = Router()
    handled: list[str] = []
    acme_done = asyncio.Event()

    @router.register("issue_comment")
    async def reply(event: sansio.Event, ctx: HandlerContext) -> None:
        if event.data["repository"]["full_name"].startswith("evil/"):
            async with evil_budget.turn(content=True):  # the app's reply in evil's vault
                pass
        handled.append(event.delivery_id)
        if event.delivery_id == "acme-2":
            acme_done.set()

    def context(item: QueueItem, log: Any) -> HandlerContext:
        return HandlerContext(services=None, forge=None,  # type: ignore[arg-type]
                              installation_id=item.installation_id, delivery_id=item.guid,
                              log=log)

    async def deliver(guid: str, payload: dict[str, Any]) -> None:
        assert await store.enqueue_delivery(guid, "issue_comment", payload,
                                            json.dumps(payload).encode())

    worker = Worker(store, router, Router(), lambda payload: False, context)
    try:
        await deliver("evil-1", _comment("evil", 1))
        await deliver("acme-1", _comment("acme", 2))
        worker.start()
        await deliver("acme-2", _comment("acme", 3))  # a later batch's
        worker.wake()
        await asyncio.wait_for(acme_done.wait(), 30)  # (a guard: not waited out, an hour)
        assert "evil-1" not in handled and {"acme-1", "acme-2"} <= set(handled)
        # (acme's ran beside evil's, which is put off once its budget has said so)
        await until_put_off(store, "evil-1")
        row = await store.fetchone(
            "SELECT state, attempts, next_at, last_error FROM queue WHERE guid='evil-1'")
        assert row is not None and row["state"] == "pending" and row["attempts"] == 0
        assert float(row["next_at"]) > time.time() + 3000, "put off until its budget allows"
        assert "PutOff" in row["last_error"]
    finally:
        await worker.stop(drain_timeout=1.0)
        await store.close()


async def test_a_forge_that_keeps_refusing_still_ends_in_dead_letters(tmp_path: Path) -> None:
    """Only a wait the forge's budget names is put off without counting: a rate limit the
    client gave up on (the forge kept answering 429) counts an attempt each time, no sooner
    than the forge said, and ends in dead letters, not put off for ever."""
    from bot.forge.errors import RateLimited

    store = await open_store(tmp_path / "index.sqlite3")
    router = Router()
    tries: list[str] = []

    @router.register("issue_comment")
    async def reply(event: sansio.Event, ctx: HandlerContext) -> None:
        tries.append(event.delivery_id)
        raise RateLimited("rate limited, gave up after 6 tries", retry_after=0.0)

    def context(item: QueueItem, log: Any) -> HandlerContext:
        return HandlerContext(services=None, forge=None,  # type: ignore[arg-type]
                              installation_id=item.installation_id, delivery_id=item.guid,
                              log=log)

    worker = Worker(store, router, Router(), lambda payload: False, context,
                    max_attempts=3, base_backoff=0.01)
    try:
        payload = _comment("acme", 1)
        assert await store.enqueue_delivery("acme-1", "issue_comment", payload,
                                            json.dumps(payload).encode())
        worker.start()
        await worker.idle(timeout=20)
        [dead] = await store.dead_letters()
        assert dead.guid == "acme-1" and dead.attempts == 3 and tries == ["acme-1"] * 3
    finally:
        await worker.stop(drain_timeout=1.0)
        await store.close()


async def test_work_a_delivery_starts_in_the_background_is_not_under_its_limit() -> None:
    """A run's dispatch (started by the delivery that delivered its mail) outlives it: it
    waits out a rate limit as before rather than being put off with nothing to put off, and
    an office's config fetch, shared by whoever asks, is no one delivery's either."""
    from bot.app import runs
    from bot.forge.pacing import wait_at_most, waiting_at_most

    seen: list[float | None] = []

    async def dispatch() -> None:
        seen.append(wait_at_most.get())

    class Background:
        background: set[asyncio.Task[None]] = set()

    with waiting_at_most(65.0):
        runs._background(Background(), dispatch())  # type: ignore[arg-type]
        assert wait_at_most.get() == 65.0
    await asyncio.gather(*Background.background)
    assert seen == [None]


def _on(org: str, n: int, guid: int) -> dict[str, Any]:
    """A comment `guid` on issue `n` of `org`'s scout vault."""
    payload = _comment(org, n)
    payload["comment"]["id"] = guid
    return payload


async def test_an_issue_cut_short_runs_nothing_past_a_barrier_before_what_it_left(
        tmp_path: Path) -> None:
    """A delivery about an issue that failed (retried later) holds back the issue's later
    ones in its batch, those after a barrier (a delivery about no issue) too: they run after
    it, in order (before, one after the barrier ran ahead of the retry)."""
    store = await open_store(tmp_path / "index.sqlite3")
    router = Router()
    handled: list[str] = []
    failed: set[str] = set()

    @router.register("issue_comment")
    async def reply(event: sansio.Event, ctx: HandlerContext) -> None:
        if event.delivery_id == "acme-1" and "acme-1" not in failed:
            failed.add("acme-1")
            raise RuntimeError("the forge was away")  # retried, after a backoff
        handled.append(event.delivery_id)

    @router.register("installation")
    async def installed(event: sansio.Event, ctx: HandlerContext) -> None:
        handled.append(event.delivery_id)

    def context(item: QueueItem, log: Any) -> HandlerContext:
        return HandlerContext(services=None, forge=None,  # type: ignore[arg-type]
                              installation_id=item.installation_id, delivery_id=item.guid,
                              log=log)

    async def deliver(guid: str, event: str, payload: dict[str, Any]) -> None:
        assert await store.enqueue_delivery(guid, event, payload, json.dumps(payload).encode())

    # issue 1: a failure at its 2nd; a barrier; one more about issue 1
    for i in range(3):
        await deliver(f"acme-{i}", "issue_comment", _on("acme", 1, 100 + i))
    await deliver("barrier", "installation", {"action": "created", "installation": {"id": 1},
                                             "sender": {"login": "admin"}})
    await deliver("acme-3", "issue_comment", _on("acme", 1, 103))
    worker = Worker(store, router, Router(), lambda payload: False, context, base_backoff=0.01)
    try:
        worker.start()
        await worker.idle(timeout=30)
        assert [g for g in handled if g.startswith("acme-")] == [
            "acme-0", "acme-1", "acme-2", "acme-3"]
        assert "barrier" in handled
    finally:
        await worker.stop(drain_timeout=1.0)
        await store.close()
