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

    store = await Store.open(path)
    try:
        mail = await mails.get_mail(store, "m1")
        assert mail is not None and mail.other_labels == () and mail.agent_turns == 0
    finally:
        await store.close()
