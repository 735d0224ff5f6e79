"""Updates on outcomes (seed: `updates` in the inbox): status, plans, evidence and claims,
recorded from the forge's issue events for those who created, hold, are assigned to or asked
about the outcome.

Only the acts of someone with write access to the item's repository are news: on a public
repository the author of an issue a member took in as evidence may close, reopen and edit it
as often as they like, and each would otherwise be an update waking the outcome's people. The
item's state still follows the forge (`get_outcome`, `get_tree` show it)."""

from __future__ import annotations

from typing import Any

from bot.items.address import owner_of
from bot.items.model import Item
from bot.items.service import Comments
from bot.office.visibility import viewer_of
from bot.store import comments as db


def describe(item: Item, known: Item | None, data: dict[str, Any]) -> tuple[str, str] | None:
    """(kind, summary) of what happened to an item, as an update on its outcome, or None."""
    action = str(data.get("action"))
    became_item = action == "opened" or (action in ("labeled", "typed") and known is None)
    if item.kind in ("plan", "evidence"):
        if became_item:
            return item.kind, f"new {item.kind} {item.ref}: {item.title}"
        if action in ("closed", "reopened"):
            return item.kind, f"{item.kind} {item.ref} {action}: {item.title}"
        return None
    if item.kind != "outcome":
        return None
    if action in ("assigned", "unassigned"):
        login = (data.get("assignee") or {}).get("login", "?")
        claim = item.claim or "nobody"
        return "claim", f"{login} {action}; the claim is now held by {claim}"
    if action in ("closed", "reopened"):
        return "status", f"outcome {action}: {item.title}"
    return None


async def record_update(service: Comments, actor: str, item: Item, known: Item | None,
                        data: dict[str, Any]) -> None:
    what = describe(item, known, data)
    if what is None or not await service.can_write(item.repo, actor):
        return
    outcome = item.parent if item.kind in ("plan", "evidence") else item.ref
    if outcome is None:
        return
    kind, summary = what
    # who is woken: asked of the forge before the write, so a failed ask writes nothing twice
    woken = await _woken(service, outcome, item)
    async with service.services.store.transaction() as tx:
        await db.add_update(tx, outcome, kind, actor, summary, item.ref)
    service.services.notifier.notify(woken, org=service.office.org)


async def _woken(service: Comments, outcome: str, item: Item) -> list[str]:
    """Everyone whose Updates this reaches (`updates_for`) and who will be shown it
    (`updates_page`): it names `item`, with its title."""
    target = await db.get_item(service.services.store, outcome)
    if target is None:
        return []
    askers, logins = await db.followers_of(service.services.store, outcome)
    assigned = [who.principal for login in logins
                if (who := service.office.by_login(login)) is not None]
    people = [p for p in (target.author, target.claim, *askers, *assigned) if p]
    owners = {owner_of(service.office, p) for p in people}
    return [o for o in sorted(owners) if await viewer_of(
        service.services, service.forge, service.office, o).sees_ref(item.ref)]
