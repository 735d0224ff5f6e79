"""The goal chain as the forge has it now: parents and children read from the forge, not only
from the index (issue 25).

Up (`ancestors`): each level is one read of the parent's issue (ETag-cached, so an unchanged
one is a 304). A REST issue says its sub-issue parent (`parent_issue_url`), so that one read
gives both the level and the link to the next; where it names none, the `Part of #N` text does
(the fallback, and Gitea's and Forgejo's only way). GitHub's `GET .../parent` would answer the
same parent, but a level linked by text would then cost a second read.

Down (`children`): on GitHub, one `GET .../sub_issues` a level (at most 100 sub-issues a
parent, so one page), then the items the index has under the level by `Part of` text; each of
the latter is read again (a 304 while unchanged) so that a link the forge no longer has is not
shown. On Gitea, which has no sub-issues, the index alone, as its webhooks keep it.

Whatever differs from the index on the way (a sub-issue added or moved while its webhooks were
lost) is written back, so the index, the decisions' scope and the inbox follow the forge; a
`Part of` link only someone without write access can have written is not (`Comments._linked`).
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from bot.forge.errors import NotFound
from bot.forge.gitea import GiteaForge
from bot.items.model import Item, item_from_issue, split_ref
from bot.store import comments as db

if TYPE_CHECKING:
    from bot.items.service import Comments

MAX_LEVELS = 8  # GitHub's nesting limit for sub-issues: no chain is longer
_REPO_URL = re.compile(r"/repos/(?P<repo>[^/]+/[^/]+)$")


@runtime_checkable
class SubIssues(Protocol):
    """A forge with GitHub's sub-issues API."""

    async def list_sub_issues(self, repo: str, number: int) -> list[dict[str, Any]]: ...


def sub_issues_of(service: Comments) -> SubIssues | None:
    forge = service.forge
    if isinstance(forge, GiteaForge) or not isinstance(forge, SubIssues):
        return None
    return forge


async def fresh_item(service: Comments, ref: str) -> Item | None:
    """The item `ref` names as the forge has it now (indexed where it changed), or None: gone,
    no item, or another office's."""
    where = split_ref(ref)
    if where is None or where[0].split("/", 1)[0] != service.office.org.lower():
        return None
    try:
        issue = await service.forge.get_issue(*where)
    except NotFound:
        return None
    item = item_from_issue(service.office, where[0], issue)
    return await service.index_item(item, if_changed=True) if item is not None else None


async def ancestors(service: Comments, item: Item) -> list[Item]:
    """The items above `item`, nearest first: one read a level; a loop stops the walk."""
    out: list[Item] = []
    seen = {item.ref}
    ref = item.parent
    while ref and ref not in seen and len(out) < MAX_LEVELS:
        seen.add(ref)
        parent = await fresh_item(service, ref)
        if parent is None:
            break
        out.append(parent)
        ref = parent.parent
    return out


def _repo_of(issue: dict[str, Any]) -> str | None:
    m = _REPO_URL.search(str(issue.get("repository_url") or ""))
    return m["repo"].lower() if m else None


async def children(service: Comments, ref: str) -> list[Item]:
    """The items directly under `ref`: its sub-issues in the forge's order, then those under
    it by `Part of` text (by repository and number)."""
    known = await db.children(service.services.store, ref)
    api = sub_issues_of(service)
    where = split_ref(ref)
    if api is None or where is None:
        return known
    try:
        listed = await api.list_sub_issues(*where)
    except NotFound:
        listed = []
    out: list[Item] = []
    org = service.office.org.lower()
    for issue in listed:
        repo = _repo_of(issue)
        if repo is None or repo.split("/", 1)[0] != org:  # (GitHub lists none, today)
            continue  # another org's issue is not this office's to index
        item = item_from_issue(service.office, repo, issue)
        if item is not None and item.ref not in {i.ref for i in out}:
            out.append(await service.index_item(item, if_changed=True))
    native = {i.ref for i in out}
    for old in known:
        if old.ref in native:
            continue
        now = await fresh_item(service, old.ref)  # by its text, or a link since removed?
        if now is not None and now.parent == ref:
            out.append(now)
    return out
