"""The updates page's rounds read ahead (issue 22, `bench.inbox`): where the updates a page
looks through are on more than `inbox.MAX_UPDATE_REPOS` repositories, it is read in rounds
hiding in Python (`inbox._updates_in_rounds`: here with the bound at 0, so every page is).
A page with updates the viewer may not see read past them in four reads, one per round; it
reads as many rows ahead as the share it saw says the page lacks, so it takes one or two
reads, and gives the same page and cursor as the rounds read one by one, on both engines.
Counted, not timed."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from bot.items import inbox
from bot.items.views import iso
from bot.office.config import load_office
from bot.store import Store, open_store
from bot.store import comments as db
from tests.updates_support import SARA, by_chance, fill_updates, sees


async def rounds_one_by_one(
    store: Store, before: int | None, since: float | None
) -> dict[str, Any]:
    """The page as the rounds read it one by one, each its own read of as many updates as
    the page lacks (and one more)."""
    office = load_office()
    who = inbox.Whose.of(office, SARA)
    logins = inbox.logins_of(office, who)
    updates: list[dict[str, Any]] = []
    cursor, more = before, None
    for _ in range(inbox.UPDATE_ROUNDS):
        want = inbox.PAGE - len(updates)
        rows = await db.updates_for(
            store, who.everyone, logins, who.everyone, cursor, since, want + 1, org=who.org
        )
        batch = rows[:want]
        names = {r["seq"]: inbox.update_names(r) for r in batch}
        shown = await sees(set().union(*names.values()))
        updates += [
            {
                "item": r["item"],
                "kind": r["kind"],
                "actor": r["actor"],
                "summary": r["summary"],
                "at": iso(r["at"]),
                "cursor": int(r["seq"]),
                "contentIsData": True,
            }
            for r in batch
            if names[r["seq"]] <= shown
        ]
        more = cursor = int(batch[-1]["seq"]) if len(rows) > want else None
        if more is None or len(updates) == inbox.PAGE:
            break
    return {"updates": updates, "moreUpdatesBefore": more}


async def test_a_page_reads_ahead_and_is_the_page_the_rounds_read_one_by_one(
    tmp_path: Path, database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(inbox, "MAX_UPDATE_REPOS", 0)  # past it at once: the rounds
    store = await open_store(database_url or tmp_path / "index.sqlite3")
    reads: list[str] = []
    fetchall = store.fetchall

    async def counted(sql: Any, params: Any = ()) -> list[Any]:
        text = str(getattr(sql, "sqlite", sql))
        if "item_updates" in text and "summary" in text:  # (not the keys' read before)
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
            *[
                (f"{share:.0%} by chance", by_chance(share, seed), count)
                for seed, (share, count) in enumerate(
                    [(0.3, 300), (0.5, 200), (0.8, 300), (0.5, 31), (0.1, 7)]
                )
            ],
        ]
        for name, hidden, count in cases:
            await fill_updates(store, hidden, count)
            for since in (None, 0.0):
                before: int | None = None
                while True:  # every page, by its cursor, as a client pages
                    reads.clear()
                    want = await rounds_one_by_one(store, before, since)
                    one_by_one = len(reads)
                    reads.clear()
                    got = await inbox.updates_page(store, office, SARA, before, since, sees)
                    assert got == want, (name, before)
                    assert len(reads) <= one_by_one, (name, before)  # never more reads
                    if before is None and name in ("every other", "all hidden"):
                        assert (one_by_one, len(reads)) == (4, 2), name
                    before = got["moreUpdatesBefore"]
                    if before is None:
                        break
    finally:
        await store.close()
