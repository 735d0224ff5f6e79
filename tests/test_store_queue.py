"""The durable queue: deliveries arriving together are committed together, each id once."""

from __future__ import annotations

import asyncio
from pathlib import Path

from bot.store import Store


async def test_concurrent_deliveries_are_each_queued_once(tmp_path: Path) -> None:
    store = await Store.open(tmp_path / "index.sqlite3")
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
    store = await Store.open(tmp_path / "index.sqlite3")
    assert await store.enqueue_delivery("g", "ping", {}, b"{}")
    await store.close()
    reopened = await Store.open(tmp_path / "index.sqlite3")
    try:
        item = await reopened.next_due()
        assert item is not None and item.guid == "g"
    finally:
        await reopened.close()
