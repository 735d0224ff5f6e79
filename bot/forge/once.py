"""A comment or an issue that must land once across the tries of one keyed write
(`Store.once`), or across writers of one marker: a try stalled with its create in flight may be
taken over (its replica silent past DEAD_AFTER), or another writer may look meanwhile (two
questions at once, each opening the tracker they wait on), and its create land after the
other's."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING

from bot.forge import markers
from bot.store import idempotency

if TYPE_CHECKING:
    from bot.forge.base import JSON, Forge

log = logging.getLogger(__name__)


async def comment_once(forge: Forge, repo: str, number: int, text: str, marker: str, *,
                       look: bool = True,
                       find: Callable[[], Awaitable[JSON | None]] | None = None,
                       before: Callable[[], Awaitable[object]] | None = None,
                       fenced: bool = True) -> JSON:
    """`text` on `repo`#`number` once; returns the comment that stands for it. `look`: the
    write may have other tries, so the comment is looked for by `marker` first (`find()`,
    else `Forge.find_comment`; another replica's try, this one's taken over, may have put it
    there), and after, the first comment carrying `marker` is kept and the app's later ones
    deleted (a stalled try's create that landed late: this one's, or another's). Before the
    create, the fence (`idempotency.check_claim`: a try taken over writes nothing; not when
    `fenced` is False, for a note that tidies after whichever try), then `before()`."""
    found = None
    if look:
        found = await find() if find is not None else await forge.find_comment(repo, number,
                                                                                marker)
    if found is None:
        if fenced:
            await idempotency.check_claim()
        if before is not None:
            await before()
        found = await forge.create_comment(repo, number, text, marker=marker)
    if look:
        # (none when it is older than the forge's marker search looks: the one found)
        found = await forge.keep_first(repo, number, marker) or found
    return found


async def issue_once(forge: Forge, repo: str, title: str, body: str, marker: str, *,
                     labels: Sequence[str] = (),
                     find: Callable[[], Awaitable[JSON | None]] | None = None) -> JSON:
    """An open issue in `repo` carrying `marker` (in `body`), opened once; returns the one that
    stands for it. Looked for first (`find()`, else the first of `Forge.marked_issues`), then
    the fence (`idempotency.check_claim`), the create, and the first of the app's open issues
    carrying `marker` kept, its later ones closed as duplicates of it: a stalled try's create
    that landed late, or a writer's that looked before this one's landed. Each writer keeps
    the lowest number, so none goes on with one another closes."""
    found = await find() if find is not None else next(
        iter(await forge.marked_issues(repo, marker)), None)
    if found is None:
        await idempotency.check_claim()
        found = await forge.create_issue(repo, title, body, labels=labels, marker=marker,
                                         accept=lambda issue: issue.get("state") == "open")
    # (none when it is older than the forge's marker search looks: the one found)
    first, *late = await forge.marked_issues(repo, marker) or [found]
    for issue in late:
        await _close_duplicate(forge, repo, int(issue["number"]), first, marker)
    return first


async def _close_duplicate(forge: Forge, repo: str, number: int, first: JSON,
                           marker: str) -> None:
    """Close `repo`#`number` as a late duplicate of `first` (not planned), saying so once
    (unfenced: a try taken over tidies its own late create too)."""
    log.warning("a late duplicate issue closed", extra={
        "repo": repo, "duplicate": number, "kept": first["number"], "outcome": "duplicate"})
    await forge.update_issue(repo, number, state="closed", state_reason="not_planned")
    note = markers.marker("duplicate", markers.token(marker, 20))
    await comment_once(forge, repo, number, (
        f"A duplicate of #{first['number']}: two writers opened this issue at once. "
        f"#{first['number']} is the one kept; this copy is closed.\n\n{note}"), note,
        fenced=False)
