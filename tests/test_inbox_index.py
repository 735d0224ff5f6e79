"""The inbox's derived index: `thread_waiting` and `item_assignees` kept by triggers and filled
for rows written before they existed, and the windowed updates page agreeing with a plain
filter over every update."""

from __future__ import annotations

import json
from pathlib import Path

from bot.items.model import Item
from bot.items.questions import Option, Question
from bot.items.threads import ThreadState
from bot.store import Store, open_store
from bot.store import comments as db

ASKER, SARA, SCOUT = "human:marco@acme.com", "human:sara@acme.com", "agent:scout"


def _question(tid: str, waiting: tuple[str, ...], *, resolved: bool = False) -> db.ThreadRow:
    state = ThreadState(asker=ASKER, members={ASKER: "personal"}, asked=waiting,
                        waiting_on=waiting, resolved=resolved,
                        question=Question(body="Which?", header="Pick",
                                          options=(Option("A"), Option("B"))))
    return db.ThreadRow(tid, "acme/x#1", "acme/x#1", state, None, None, None, 0.0)


async def _waiting(store: Store) -> set[tuple[str, str]]:
    rows = await store.fetchall("SELECT principal, thread FROM thread_waiting")
    return {(r["principal"], r["thread"]) for r in rows}


async def test_thread_waiting_follows_writes_and_is_filled_at_open(tmp_path: Path) -> None:
    store = await open_store(tmp_path / "index.sqlite3")
    async with store.transaction() as tx:
        await db.put_thread(tx, _question("t1", (SARA, SCOUT)))
        await db.put_thread(tx, _question("t2", (SARA,)))
    assert await _waiting(store) == {(SARA, "t1"), (SCOUT, "t1"), (SARA, "t2")}
    async with store.transaction() as tx:
        await db.put_thread(tx, _question("t1", (ASKER,)))  # answered: back to the asker
        await db.put_thread(tx, _question("t2", (SARA,), resolved=True))
    assert await _waiting(store) == {(ASKER, "t1")}
    found = await db.open_questions_involving(store, [SARA, ASKER], org="acme")
    assert [t.id for t in found] == ["t1"]
    assert [t.state.waiting_on for t in found] == [(ASKER,)]
    # an index written before the table existed (and before schema versions were recorded)
    # gets it filled when the store opens
    async with store.transaction() as tx:
        await tx.execute("DROP TABLE thread_waiting")
        await tx.execute("DROP TABLE item_assignees")
        await tx.execute("DROP TABLE schema_migrations")
    await store.close()
    store = await open_store(tmp_path / "index.sqlite3")
    try:
        assert await _waiting(store) == {(ASKER, "t1")}
    finally:
        await store.close()


async def test_updates_window_and_fallback_agree_with_a_plain_filter(tmp_path: Path) -> None:
    store = await open_store(tmp_path / "index.sqlite3")
    try:
        async with store.transaction() as tx:
            for n in range(1, 40):
                await db.put_item(tx, Item(repo="acme/x", number=n, kind="outcome",
                                           title=f"o{n}", state="open", author_login="sara",
                                           parent=None, author=SARA,
                                           assignees=("scout-bot",) if n == 3 else (),
                                           claim=SCOUT if n == 5 else None))
            await db.put_thread(tx, _question("t1", (SARA,)))  # marco asked on acme/x#1
            for u in range(3 * db.UPDATES_WINDOW):
                await db.add_update(tx, f"acme/x#{u % 39 + 1}", "status", SARA, f"u{u}")
        rows = await store.fetchall("SELECT * FROM item_updates ORDER BY seq DESC")
        for mine, logins, relevant in (([ASKER], ["marco"], {"acme/x#1"}),
                                       ([SCOUT], ["scout-bot"], {"acme/x#3", "acme/x#5"}),
                                       (["human:lee@acme.com"], ["lee"], set())):
            want = [r["seq"] for r in rows if r["item"] in relevant][:31]
            got = await db.updates_for(store, mine, logins, mine, None, None, 31, org="acme")
            assert [r["seq"] for r in got] == want
            assert sorted(await db.relevant_items(store, mine, logins, org="acme")) == sorted(
                relevant)
        async with store.transaction() as tx:
            assignees = await tx.fetchall("SELECT login, item FROM item_assignees")
        assert [tuple(r) for r in assignees] == [("scout-bot", "acme/x#3")]
        assert json.loads((await store.fetchone(
            "SELECT assignees FROM items WHERE ref='acme/x#3'"))["assignees"]) == ["scout-bot"]
    finally:
        await store.close()
