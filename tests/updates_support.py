"""What the updates page's tests share: sara's outcomes on a repository she may see and one
she may not, and updates on them (tests/test_inbox_updates_sql.py, test_inbox_updates_ahead.py)."""

from __future__ import annotations

import random
from collections.abc import Iterable
from typing import Any

from bot.items.model import Item
from bot.store import Store
from bot.store import comments as db

SARA = "human:sara@acme.com"
SHOWN, HIDDEN = "acme/shown", "acme/hidden"


async def sees(refs: Iterable[str]) -> set[str]:  # acme/shown only, as the forge would say
    return {r for r in refs if r.startswith(SHOWN + "#")}


async def fill_updates(store: Store, hidden: Any, count: int) -> None:
    """`count` updates on sara's outcomes, update `u` on acme/hidden where `hidden(u)` (and
    one in seven of the others on acme/shown telling of a plan in acme/hidden)."""
    async with store.transaction() as tx:
        await tx.execute("DELETE FROM item_updates")
        await tx.execute("DELETE FROM items")
        for repo in (SHOWN, HIDDEN):
            for n in (1, 2, 3):
                await db.put_item(
                    tx,
                    Item(
                        repo=repo,
                        number=n,
                        kind="outcome",
                        title=f"o{n}",
                        state="open",
                        author_login="sara",
                        parent=None,
                        author=SARA,
                        assignees=(),
                        claim=None,
                    ),
                )
        for u in range(count):
            on = HIDDEN if hidden(u) else SHOWN
            about = f"{HIDDEN}#9" if on == SHOWN and u % 7 == 3 else None
            await db.add_update(
                tx, f"{on}#{u % 3 + 1}", "status", "agent:scout", f"u{u}", about=about
            )


def by_chance(share: float, seed: int) -> Any:
    chance = random.Random(seed)
    drawn: dict[int, bool] = {}
    return lambda u: drawn.setdefault(u, chance.random() < share)
