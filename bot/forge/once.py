"""A comment that must land once across the tries of one keyed write (`Store.once`), or
across writers of one marker: a try stalled with its create in flight may be taken over (its
replica silent past DEAD_AFTER), or another writer may look meanwhile, and its create land
after the other's."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

from bot.store import idempotency

if TYPE_CHECKING:
    from bot.forge.base import JSON, Forge


async def comment_once(forge: Forge, repo: str, number: int, text: str, marker: str, *,
                       look: bool = True,
                       find: Callable[[], Awaitable[JSON | None]] | None = None,
                       before: Callable[[], Awaitable[object]] | None = None) -> JSON:
    """`text` on `repo`#`number` once; returns the comment that stands for it. `look`: the
    write may have other tries, so the comment is looked for by `marker` first (`find()`,
    else `Forge.find_comment`; another replica's try, this one's taken over, may have put it
    there), and after, the first comment carrying `marker` is kept and the app's later ones
    deleted (a stalled try's create that landed late: this one's, or another's). Before the
    create, the fence (`idempotency.check_claim`: a try taken over writes nothing), then
    `before()`."""
    found = None
    if look:
        found = await find() if find is not None else await forge.find_comment(repo, number,
                                                                                marker)
    if found is None:
        await idempotency.check_claim()
        if before is not None:
            await before()
        found = await forge.create_comment(repo, number, text, marker=marker)
    if look:
        # (none when it is older than the forge's marker search looks: the one found)
        found = await forge.keep_first(repo, number, marker) or found
    return found
