"""What builder's `list_inbox` reads (issue 22, `bench.inbox`): counted, not timed.

The updates page checks the newest updates one by one for relevance (`db.updates_for`, its
window of `UPDATES_WINDOW`): once a page is full it stops, so what lies below the page in the
window is not read at all (it was: every update of the window was checked, then sorted). The
repositories of the caller's open questions (`db.question_repos`, asked of visibility before
the pages are read) are found one index seek a repository, not by reading every question."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any, TypeVar

from bot.items.model import Item
from bot.items.questions import Option, Question
from bot.items.threads import ThreadState
from bot.store import Store, open_store
from bot.store import comments as db
from tests.support import sqlite_steps

SARA, BUILDER, MARCO = "human:sara@acme.com", "agent:builder", "human:marco@acme.com"
T = TypeVar("T")
PAGE = 31  # what inbox.updates_page asks for


async def _steps(store: Store, limit: int = PAGE) -> tuple[int, list[int]]:
    """The steps of one updates page for builder, and its seqs."""
    steps, rows = await sqlite_steps(store, lambda: db.updates_for(
        store, [SARA, BUILDER], ["builder-bot"], [SARA, BUILDER], None, None, limit,
        org="acme"))
    return steps, [int(r["seq"]) for r in rows]


async def _fill(store: Store, updates: int) -> None:
    async with store.transaction() as tx:
        for n in range(1, 11):  # builder holds every item: every update is relevant to it
            await db.put_item(tx, Item(repo="acme/x", number=n, kind="outcome",
                                       title=f"o{n}", state="open", author_login="marco",
                                       parent=None, author="human:marco@acme.com",
                                       assignees=(), claim=BUILDER))
        for u in range(updates):
            await db.add_update(tx, f"acme/x#{u % 10 + 1}", "status", "agent:scout", f"u{u}")


async def test_the_updates_below_a_full_page_are_not_read(tmp_path: Path) -> None:
    few = await open_store(tmp_path / "few.sqlite3")
    many = await open_store(tmp_path / "many.sqlite3")
    try:
        await _fill(few, PAGE + 1)
        await _fill(many, db.UPDATES_WINDOW)
        few_steps, few_seqs = await _steps(few)
        many_steps, many_seqs = await _steps(many)
        assert few_seqs == list(range(PAGE + 1, 1, -1))
        assert many_seqs == list(range(db.UPDATES_WINDOW, db.UPDATES_WINDOW - PAGE, -1))
        # the same page: the window's other 480 updates cost a few steps each (counted in an
        # index, for the window's bound), not a check of each (about 60 steps an update)
        assert many_steps < few_steps + 10 * db.UPDATES_WINDOW, (few_steps, many_steps)
    finally:
        await few.close()
        await many.close()


async def test_a_short_page_still_falls_back_past_the_window(tmp_path: Path) -> None:
    """Fewer relevant updates in the window than a page: the rest are found below it."""
    store = await open_store(tmp_path / "index.sqlite3")
    try:
        await _fill(store, 3)
        async with store.transaction() as tx:  # a window's worth of updates of no interest
            await db.put_item(tx, Item(repo="acme/y", number=1, kind="outcome", title="y",
                                       state="open", author_login="lee", parent=None,
                                       author="human:lee@acme.com", assignees=(), claim=None))
            for u in range(db.UPDATES_WINDOW + 5):
                await db.add_update(tx, "acme/y#1", "status", "agent:scout", f"y{u}")
            await db.add_update(tx, "acme/x#1", "status", "agent:scout", "newest")
        _, seqs = await _steps(store)
        newest = 3 + db.UPDATES_WINDOW + 5 + 1
        assert seqs == [newest, 3, 2, 1]
        _, seqs = await _steps(store, limit=2)
        assert seqs == [newest, 3]
        # an update by one of them is not theirs to be told of
        async with store.transaction() as tx:
            await db.add_update(tx, "acme/x#2", "status", BUILDER, "mine")
        _, seqs = await _steps(store, limit=2)
        assert seqs == [newest, 3]
    finally:
        await store.close()


def _question(tid: str, item: str, asker: str, waiting: tuple[str, ...]) -> db.ThreadRow:
    state = ThreadState(asker=asker, members={asker: "personal", **{w: "personal"
                                                                    for w in waiting}},
                        asked=waiting, waiting_on=waiting,
                        question=Question(body="Which?", header="Pick",
                                          options=(Option("A"), Option("B"))))
    return db.ThreadRow(tid, item, item, state, None, None, None, 0.0)


async def _questions(store: Store, n: int) -> None:
    """n open questions of marco's waiting on builder and n builder asked of sara, on
    acme/Many; one of each on acme/other; another office's on its own repository."""
    async with store.transaction() as tx:
        for k in range(n):
            await db.put_thread(tx, _question(f"w{k}", f"acme/Many#{k + 1}", MARCO, (BUILDER,)))
            await db.put_thread(tx, _question(f"a{k}", f"acme/Many#{k + 1}", BUILDER, (SARA,)))
        await db.put_thread(tx, _question("w-other", "acme/other#1", MARCO, (BUILDER,)))
        await db.put_thread(tx, _question("a-other", "acme/other#2", BUILDER, (MARCO,)))
        await db.put_thread(tx, _question("w-none", "acme-key", MARCO, (BUILDER,)))
        await db.put_thread(tx, _question("w-elsewhere", "beta/secret#1", MARCO, (BUILDER,)))


async def test_question_repositories_are_each_read_once(tmp_path: Path) -> None:
    few = await open_store(tmp_path / "few.sqlite3")
    many = await open_store(tmp_path / "many.sqlite3")
    try:
        await _questions(few, 2)
        await _questions(many, 200)
        few_steps, few_repos = await sqlite_steps(few, lambda: db.question_repos(
            few, [SARA, BUILDER], org="acme"))
        many_steps, many_repos = await sqlite_steps(many, lambda: db.question_repos(
            many, [SARA, BUILDER], org="acme"))
        assert few_repos == many_repos == ["acme/many", "acme/other"]
        # 396 more questions each way: not a step each (reading them was about 8 steps each)
        assert many_steps < few_steps + 100, (few_steps, many_steps)
    finally:
        await few.close()
        await many.close()


async def test_question_repositories_on_both_engines(tmp_path: Path, database_url: str) -> None:
    store = await open_store(database_url or tmp_path / "index.sqlite3")
    try:
        await _questions(store, 3)
        assert await db.question_repos(store, [BUILDER], org="ACME") == [
            "acme/many", "acme/other"]
        assert await db.question_repos(store, [SARA], org="acme") == ["acme/many"]
        assert await db.question_repos(store, [MARCO], org="acme") == [
            "acme/many", "acme/other"]  # (asked by him; one waiting on him)
        assert await db.question_repos(store, [MARCO, SARA, "agent:nobody"], org="acme") == [
            "acme/many", "acme/other"]
        assert await db.question_repos(store, [BUILDER], org="beta") == ["beta/secret"]
        assert await db.question_repos(store, ["agent:nobody"], org="acme") == []
        assert await db.question_repos(store, [], org="acme") == []
    finally:
        await store.close()


async def _inbox_office(store: Store) -> None:
    """sara's boxes: two unread comments of her own, two delivered to her agents (builder's
    and echo's), one read; a question waiting on builder, one on sara."""
    async with store.transaction() as tx:
        for n in range(5):
            await db.put_comment(tx, db.CommentRow(f"c{n}", "acme/x#1", "c0", None, MARCO,
                                                   f"words {n}", {"to": [SARA]}, None,
                                                   1.7e9 + n))
        await db.deliver(tx, SARA, "you", SARA, "c0", org="acme")
        await db.deliver(tx, SARA, "agents", BUILDER, "c1", org="acme")
        await db.deliver(tx, SARA, "you", SARA, "c2", org="acme")
        await db.deliver(tx, SARA, "agents", "agent:echo", "c3", org="acme")
        await db.deliver(tx, SARA, "you", SARA, "c4", org="acme")
        await tx.execute("UPDATE inbox_deliveries SET read_at=1.0 WHERE comment='c4'")
        await db.put_thread(tx, _question("q1", "acme/x#1", MARCO, (BUILDER,)))
        await db.put_thread(tx, _question("q2", "acme/x#2", MARCO, (SARA,)))


async def test_an_agents_look_reads_its_boxes_unread_in_one_statement(
        tmp_path: Path, database_url: str) -> None:
    """An agent with a person: its person's unread and its own unseen share of the agents' box
    are one read (they were two, one after the other: a trip more to the index's thread), the
    same rows in the same order; the person's look likewise, its agents' history with it."""
    from bot.items import inbox
    from bot.office.config import load_office

    store = await open_store(database_url or tmp_path / "index.sqlite3")
    try:
        await _inbox_office(store)
        reads: list[str] = []
        fetchall, fetchone = store.fetchall, store.fetchone

        async def spy_all(sql: Any, params: Any = ()) -> Any:
            reads.append(str(getattr(sql, "sqlite", sql)))
            return await fetchall(sql, params)

        async def spy_one(sql: Any, params: Any = ()) -> Any:
            reads.append(str(getattr(sql, "sqlite", sql)))
            return await fetchone(sql, params)

        store.fetchall = spy_all  # type: ignore[method-assign]
        store.fetchone = spy_one  # type: ignore[method-assign]

        async def sees(refs: Iterable[str]) -> set[str]:
            return set(refs)

        office = load_office()
        for viewer, you, agents in (
                (BUILDER, ["c0", "c2"], [("c1", BUILDER), ("c3", "agent:echo")]),
                (SARA, ["c0", "c2"], [("c1", BUILDER), ("c3", "agent:echo")])):
            for _ in range(2):  # (the second: the pages' threads decoded, as they stay)
                reads.clear()
                computed = await inbox.compute(store, office, viewer, mark_you=False,
                                               mark_agents=False, sees=sees)
            boxes = computed.boxes
            assert [c["id"] for c in boxes["you"]["unread"]] == you
            assert [(c["id"], c["forAgent"]) for c in boxes["agents"]["unread"]] == agents
            assert computed.person_unread == 2
            # the repositories, both boxes' unread, the pages, the comments
            assert len(reads) == 4, reads
    finally:
        await store.close()
