"""The updates page applies the visibility rule to repositories (issue 22, `bench.inbox`):
the keys of the viewer's updates (each one's seq and the repositories it names) are read,
each repository asked once, and the page's updates are read by their seqs, so a page is one
read of updates however many it may not see lie among them, and it is the page (and cursor)
of reading every update and hiding in Python those naming an item the viewer may not see, on
both engines. What is read is checked again in Python (a safety net): one it hides there
leaves the page short, its cursor on (`inbox.updates_page`). Counted, not timed."""

from __future__ import annotations

import random
from collections.abc import Awaitable, Callable, Iterable
from pathlib import Path
from typing import Any

import pytest

from bot.items import inbox
from bot.items.model import Item
from bot.items.views import iso
from bot.office.config import load_office
from bot.store import Store, open_store
from bot.store import comments as db
from tests.updates_support import SARA, SHOWN, by_chance, fill_updates, sees


async def every_update_hidden_in_python(
    store: Store,
    before: int | None,
    since: float | None,
    sees: Callable[[Iterable[str]], Awaitable[set[str]]],
    page: int = inbox.PAGE,
) -> dict[str, Any]:
    """The page as reading every update below `before` and hiding in Python those naming an
    item the viewer may not see gives it: the first `page` shown, its cursor on the last of
    them where any update (shown or not) lies below it."""
    office = load_office()
    who = inbox.Whose.of(office, SARA)
    logins = inbox.logins_of(office, who)
    rows = await db.updates_for(
        store, who.everyone, logins, who.everyone, before, since, 10**6, org=who.org
    )
    names = {r["seq"]: inbox.update_names(r) for r in rows}
    shown = await sees(set().union(*names.values()))
    kept = [r for r in rows if names[r["seq"]] <= shown][:page]
    updates = [
        {
            "item": r["item"],
            "kind": r["kind"],
            "actor": r["actor"],
            "summary": r["summary"],
            "at": iso(r["at"]),
            "cursor": int(r["seq"]),
            "contentIsData": True,
        }
        for r in kept
    ]
    last = int(kept[-1]["seq"]) if len(kept) == page else None
    more = last if last is not None and int(rows[-1]["seq"]) < last else None
    return {"updates": updates, "moreUpdatesBefore": more}


async def item_by_item(refs: Iterable[str]) -> set[str]:
    """As `sees`, but acme/shown#2 hidden too: the keys, judged per repository, pass its
    updates, and the Python check after the read hides them (the safety net)."""
    return {r for r in await sees(refs) if r != SHOWN + "#2"}


@pytest.mark.parametrize("window", [db.UPDATES_WINDOW, 4])  # (4: past it, the relevant set)
async def test_a_page_is_one_read_and_the_page_hiding_in_python_gives(
    tmp_path: Path, database_url: str, window: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(db, "UPDATES_WINDOW", window)
    store = await open_store(database_url or tmp_path / "index.sqlite3")
    reads: list[str] = []
    fetchall = store.fetchall

    async def counted(sql: Any, params: Any = ()) -> list[Any]:
        text = str(getattr(sql, "sqlite", sql))
        if "item_updates" in text and "summary" in text:  # (not the keys' reads)
            reads.append("read")
        return await fetchall(sql, params)

    store.fetchall = counted  # type: ignore[method-assign]
    office = load_office()
    try:
        cases: list[tuple[str, Any, int]] = [
            ("none hidden", lambda u: False, 100),
            ("every other", lambda u: u % 2 == 1, 100),  # (every seventh shown names one too)
            ("all hidden", lambda u: True, 150),
            ("every other, short", lambda u: u % 2 == 1, 40),
            ("a run past the rounds", lambda u: 20 <= u < 20 + 5 * inbox.PAGE, 200),
            *[
                (f"{share:.0%} by chance", by_chance(share, seed), count)
                for seed, (share, count) in enumerate(
                    [(0.3, 300), (0.5, 200), (0.8, 300), (0.5, 31), (0.1, 7)]
                )
            ],
        ]
        for name, hidden, count in cases:
            await fill_updates(store, hidden, count)
            for viewer_sees in (sees, item_by_item):
                for since in (None, 0.0):
                    before: int | None = None
                    while True:  # every page, by its cursor, as a client pages
                        want = await every_update_hidden_in_python(
                            store, before, since, viewer_sees
                        )
                        reads.clear()
                        got = await inbox.updates_page(
                            store, office, SARA, before, since, viewer_sees
                        )
                        # one read of updates: the page's, by their seqs (none where
                        # the page is empty)
                        assert len(reads) <= 1, (name, before, reads)
                        if viewer_sees is sees:
                            assert got == want, (name, before)
                        else:  # the safety net: a page it leaves short has its cursor on
                            shown = got["updates"]
                            assert shown == want["updates"][: len(shown)], (name, before)
                            assert got == want or (
                                len(shown) < inbox.PAGE and got["moreUpdatesBefore"]
                            ), (name, before)
                        before = got["moreUpdatesBefore"]
                        if before is None:
                            break
    finally:
        await store.close()


# The repositories the page asks `sees` about are those of the updates on the reader's
# outcomes (for a person, each is a forge request), at most MAX_UPDATE_REPOS of them: past it
# the page is read as the rounds read it. sara's outcomes are on REPOS; marco's, on OTHERS,
# have updates too, none of them on sara's page.
REPOS = [f"acme/r{i}" for i in range(8)]
OTHERS = [f"acme/other{i}" for i in range(5)]
MARCO = "human:marco@acme.com"
BOUND = inbox.MAX_UPDATE_REPOS


async def _fill_spread(store: Store, count: int, seed: int) -> None:
    chance = random.Random(seed)
    async with store.transaction() as tx:
        await tx.execute("DELETE FROM item_updates")
        await tx.execute("DELETE FROM items")
        for repo in REPOS + OTHERS:
            author = MARCO if repo in OTHERS else SARA
            await db.put_item(tx, Item(repo=repo, number=2, kind="outcome", title="o",
                                       state="open", author_login=author.split(":")[1],
                                       parent=None, author=author, assignees=(), claim=None))
        for u in range(count):
            on = chance.choice(OTHERS if u % 3 == 0 else REPOS)
            about = f"{chance.choice(REPOS)}#9" if u % 5 == 1 else None
            if u >= count - 60:  # the newest on two of sara's, most hidden: a page's first
                # read of keys names two repositories, the next (below them) all of REPOS
                on, about = ("acme/r0" if u % 6 == 0 else "acme/r1"), None
            await db.add_update(tx, f"{on}#2", "status", "agent:scout", f"u{u}", about=about)


async def sees_some(refs: Iterable[str]) -> set[str]:  # acme/r1, r4 and r6 hidden
    return {r for r in refs if r.split("#")[0] not in ("acme/r1", "acme/r4", "acme/r6")}


@pytest.mark.parametrize("window", [db.UPDATES_WINDOW, 4])
@pytest.mark.parametrize("bound", [2, 5, BOUND])
async def test_a_page_asks_only_about_the_repositories_of_the_readers_updates(
    tmp_path: Path, database_url: str, window: int, bound: int,
    monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(db, "UPDATES_WINDOW", window)
    monkeypatch.setattr(inbox, "MAX_UPDATE_REPOS", bound)
    store = await open_store(database_url or tmp_path / "index.sqlite3")
    office = load_office()
    asked: set[str] = set()
    by_repository: set[str] = set()  # asked with `#1`, the item that stands for a repository

    async def recorded(refs: Iterable[str]) -> set[str]:
        refs = set(refs)
        asked.update(r.split("#")[0] for r in refs)
        by_repository.update(r.split("#")[0] for r in refs if r.endswith("#1"))
        return await sees_some(refs)

    try:
        await _fill_spread(store, 300, seed=bound + window)
        every = (await every_update_hidden_in_python(store, None, None, sees_some,
                                                     page=10**6))["updates"]
        assert len(every) > 2 * inbox.PAGE  # (several pages)
        paged: list[Any] = []
        before: int | None = None
        while True:  # every page, by its cursor, as a client pages
            want = await every_update_hidden_in_python(store, before, None, sees_some)
            asked.clear()
            by_repository.clear()
            got = await inbox.updates_page(store, office, SARA, before, None, recorded)
            assert asked <= set(REPOS), (bound, before, asked)  # none of marco's
            # by repository, at most `bound` in all; else only the rounds ask, of what they
            # read (the old code's asks)
            assert not by_repository or len(asked) <= bound, (bound, before, asked)
            shown = got["updates"]
            assert shown == want["updates"][: len(shown)], (bound, before)
            if bound == BOUND:  # within it: the page hiding gives
                assert got == want, (bound, before)
            else:  # past it: as the rounds read (a cursor on the last update they read),
                # or, past it after a read, to where that read began; the list goes on past
                # a page left short
                assert got["moreUpdatesBefore"] or want["moreUpdatesBefore"] is None, (
                    bound, before)
            paged += shown
            before = got["moreUpdatesBefore"]
            if before is None:
                break
        assert paged == every  # no update left out, none twice
    finally:
        await store.close()


# A page stops at MAX_UPDATE_REPOS repositories where the update it looks at next would pass
# it, not above the whole read that holds that update: a read of keys after the first is as
# long as the share shown says the page lacks (29 times the first read's where it showed
# one), and on an office of many repositories it named past the bound however few of them
# the page needed, so the page ended at what the first read showed. sara, who may see one
# repository in ten of 300, took 77 pages of her 295 updates, most of 1 to 4, where
# ff090b3^'s rounds took 29.
MANY = [f"acme/m{i}" for i in range(300)]
MANY_SEEN = set(MANY[::10])


async def sees_one_in_ten(refs: Iterable[str]) -> set[str]:
    return {r for r in refs if r.split("#")[0] in MANY_SEEN}


def _repos(row: Any) -> set[str]:
    return {name.partition("#")[0].lower() for name in inbox.update_names(row)}


async def test_a_page_stops_at_the_update_that_would_pass_the_repository_bound(
    tmp_path: Path, database_url: str
) -> None:
    store = await open_store(database_url or tmp_path / "index.sqlite3")
    office = load_office()
    chance = random.Random(5)
    try:
        async with store.transaction() as tx:
            for repo in MANY:
                await db.put_item(tx, Item(repo=repo, number=1, kind="outcome", title="o",
                                           state="open", author_login="sara", parent=None,
                                           author=SARA, assignees=(), claim=None))
            for u in range(3000):
                about = f"{chance.choice(MANY)}#4" if u % 5 == 1 else None
                await db.add_update(tx, f"{chance.choice(MANY)}#1", "status", "agent:scout",
                                    f"u{u}", about=about)
        who = inbox.Whose.of(office, SARA)
        every = await db.updates_for(store, who.everyone, inbox.logins_of(office, who),
                                     who.everyone, None, None, 10**6, org=who.org)
        paged: list[Any] = []
        before: int | None = None
        while True:  # every page, by its cursor, as a client pages
            got = await inbox.updates_page(store, office, SARA, before, None,
                                           sees_one_in_ten)
            paged += got["updates"]
            more = got["moreUpdatesBefore"]
            if more is None:
                break
            if len(got["updates"]) < inbox.PAGE:  # ended short: by a bound
                looked = [r for r in every if more <= r["seq"] < (before or 2**62)]
                below = next(r for r in every if r["seq"] < more)
                named = set().union(*map(_repos, looked))
                assert len(looked) >= inbox.MAX_UPDATE_KEYS or (
                    len(named) <= inbox.MAX_UPDATE_REPOS
                    < len(named | _repos(below))), (before, len(looked), len(named))
            before = more
        want = await every_update_hidden_in_python(store, None, None, sees_one_in_ten,
                                                   page=10**6)
        assert paged == want["updates"]  # none left out, none twice
    finally:
        await store.close()
