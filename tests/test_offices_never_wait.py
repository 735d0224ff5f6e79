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
from bot.store import QueueItem, open_store


def _comment(org: str, n: int) -> dict[str, Any]:
    return {"action": "created", "issue": {"number": n},
            "comment": {"id": 1000 + n, "updated_at": "2026-12-05T00:00:00Z"},
            "repository": {"full_name": f"{org}/scout-vault"}, "sender": {"login": "someone"},
            "installation": {"id": 2 if org == "evil" else 1}}


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
        row = await store.fetchone(
            "SELECT state, attempts, next_at, last_error FROM queue WHERE guid='evil-1'")
        assert row is not None and row["state"] == "pending" and row["attempts"] == 0
        assert float(row["next_at"]) > time.time() + 3000, "put off until its budget allows"
        assert "RateLimited" in row["last_error"]
    finally:
        await worker.stop(drain_timeout=1.0)
        await store.close()
