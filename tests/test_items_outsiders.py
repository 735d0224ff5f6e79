"""An outsider's issue on a public repository that a member took in as an item (issue 19, found
by an outside review): what its author, who has no write access, then does to it alone (as the
forge lets an issue's author: close, reopen, edit its title and body) fills no member's inbox,
moves nothing in the office's graph and takes no member's item key."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import aiohttp

from bot.app.embedded import Embedded
from bot.store import comments as db
from tests.items_support import MARCO, make_item
from tests.support import Actor

SITE = "acme/website"


@dataclass
class Report:
    marco: Actor
    troll: Actor
    outcome: dict[str, Any]  # marco's `[AC-7] Ship login`
    number: int  # troll's "Login crashes", which marco labelled evidence for it

    @property
    def ref(self) -> str:
        return f"{SITE}#{self.number}"

    async def troll_sets(self, fields: dict[str, Any]) -> None:
        await self.troll.call("PATCH", f"/repos/{SITE}/issues/{self.number}", fields,
                              expect=200)


async def _triaged_report(embedded: Embedded, session: aiohttp.ClientSession) -> Report:
    """marco's outcome `[AC-7] Ship login` on acme's public website, and troll's (no one of
    the office's) "Login crashes", `Part of` it, that marco triaged as evidence."""
    forge = embedded.forge
    forge.add_repo("acme", "website", private=False)
    forge.set_permission(SITE, "marco", "write")
    embedded.forge_tokens["troll"] = forge.add_user("troll")
    marco, troll = Actor(session, embedded, "marco"), Actor(session, embedded, "troll")
    outcome = await marco.open_issue(SITE, "[AC-7] Ship login", "login for all",
                                     labels=["outcome"])
    report = await troll.open_issue(SITE, "Login crashes",
                                    f"Part of #{outcome['number']}\nstack trace")
    await embedded.settle()
    await marco.call("PATCH", f"/repos/{SITE}/issues/{report['number']}",
                     {"labels": ["evidence"]}, expect=200)
    await embedded.settle()
    return Report(marco, troll, outcome, int(report["number"]))


async def test_an_outsiders_closes_and_reopens_of_their_own_issue_fill_no_inbox(
        embedded: Embedded, session: aiohttp.ClientSession, tools: Any) -> None:
    r = await _triaged_report(embedded, session)
    before = (await tools(MARCO)("list_inbox"))["updates"]
    for _ in range(10):
        await r.troll_sets({"state": "closed"})
        await r.troll_sets({"state": "open"})
    await embedded.settle()
    assert (await tools(MARCO)("list_inbox"))["updates"] == before
    # a member's close is news on the outcome, as before
    embedded.forge.set_permission(SITE, "sara", "write")
    await Actor(r.marco.session, embedded, "sara").call(
        "PATCH", f"/repos/{SITE}/issues/{r.number}", {"state": "closed"}, expect=200)
    await embedded.settle()
    [news, *_] = (await tools(MARCO)("list_inbox"))["updates"]
    assert news["summary"] == f"evidence {r.ref} closed: Login crashes"


async def test_an_outsiders_part_of_moves_nothing_until_someone_with_write_access_makes_it(
        embedded: Embedded, session: aiohttp.ClientSession, tools: Any) -> None:
    r = await _triaged_report(embedded, session)
    store = embedded.services.store
    login = f"{SITE}#{r.outcome['number']}"
    other = await r.marco.open_issue(SITE, "[AC-8] Pricing page", "prices", labels=["outcome"])
    await embedded.settle()
    elsewhere = f"{SITE}#{other['number']}"
    assert (await db.get_item(store, r.ref)).parent == login  # type: ignore[union-attr]
    # troll points his issue at another outcome, then comments on it and closes it
    await r.troll_sets({"body": f"Part of #{other['number']}\nstack trace"})
    await r.troll.comment(SITE, r.number, "still crashing")
    await r.troll_sets({"state": "closed"})
    await embedded.settle()
    assert (await db.get_item(store, r.ref)).parent == login  # type: ignore[union-attr]
    # a member's read of it from the forge takes the link no more than its webhooks did
    await tools(MARCO)("add_comment", targetType="evidence", target=r.ref, body="seen")
    assert (await db.get_item(store, r.ref)).parent == login  # type: ignore[union-attr]
    # someone with write access makes the link: now it moves
    await r.marco.call("PATCH", f"/repos/{SITE}/issues/{r.number}",
                       {"body": f"Part of #{other['number']}\nstack trace, moved"}, expect=200)
    await embedded.settle()
    assert (await db.get_item(store, r.ref)).parent == elsewhere  # type: ignore[union-attr]


async def test_an_outsiders_key_never_takes_or_shadows_a_members_item_key(
        embedded: Embedded, session: aiohttp.ClientSession, tools: Any) -> None:
    r = await _triaged_report(embedded, session)
    marco = tools(MARCO)
    login = f"{SITE}#{r.outcome['number']}"
    await r.troll_sets({"title": "[AC-7] Login crashes"})
    await embedded.settle()
    said = await marco("add_comment", targetType="outcome", target="AC-7", body="next")
    assert said["comment"]["item"] == login
    # a key no member's item gives itself is troll's item's, until one does
    await r.troll_sets({"title": "[AC-9] Login crashes"})
    await embedded.settle()
    found = await marco("add_comment", targetType="evidence", target="AC-9", body="seen")
    assert found["comment"]["item"] == r.ref
    mine = await r.marco.open_issue(SITE, "[AC-9] Checkout", "pay", labels=["outcome"])
    await embedded.settle()
    said = await marco("add_comment", targetType="outcome", target="AC-9", body="mine")
    assert said["comment"]["item"] == f"{SITE}#{mine['number']}"


async def _outsiders_report(embedded: Embedded, session: aiohttp.ClientSession,
                            ) -> tuple[Actor, Actor, str, str, int]:
    """marco's goal and outcome in the private vault, and troll's "Login crashes" on acme's
    public website, pointing at nothing: (marco, troll, goal, outcome, troll's number)."""
    forge = embedded.forge
    forge.add_repo("acme", "website", private=False)
    forge.set_permission(SITE, "marco", "write")
    embedded.forge_tokens["troll"] = forge.add_user("troll")
    marco, troll = Actor(session, embedded, "marco"), Actor(session, embedded, "troll")
    goal = await make_item(embedded, marco, "goal", "Safer sign-in")
    outcome = await make_item(embedded, marco, "outcome", "Auth migration",
                              body=f"Part of {goal}")
    report = await troll.open_issue(SITE, "Login crashes", "stack trace")
    await embedded.settle()
    return marco, troll, goal, outcome, int(report["number"])


async def _linked_nowhere(embedded: Embedded, tools: Any, goal: str, number: int) -> None:
    assert "Login crashes" not in str(await tools(MARCO)("get_tree", goal=goal))
    item = await db.get_item(embedded.services.store, f"{SITE}#{number}")
    assert item is not None and item.parent is None, item


async def test_an_outsiders_edit_delivered_before_a_members_label_links_nothing(
        embedded: Embedded, session: aiohttp.ClientSession, tools: Any) -> None:
    """Acted out: marco labelled troll's issue evidence; troll at once edited its body to
    `Part of` marco's outcome in the private vault, and his edit was delivered before marco's
    label. Handling the label, the app read the body as it was now, in marco's name, and hung
    troll's issue under the outcome (get_tree showed it, with the outcome's claim)."""
    marco, troll, goal, outcome, n = await _outsiders_report(embedded, session)
    forge = embedded.forge
    forge.faults.drop_webhooks(count=1, senders=("marco",))  # the label's delivery waits
    await marco.call("PATCH", f"/repos/{SITE}/issues/{n}", {"labels": ["evidence"]},
                     expect=200)
    await troll.call("PATCH", f"/repos/{SITE}/issues/{n}",
                     {"body": f"Part of {outcome}\nstack trace"}, expect=200)
    await embedded.settle()
    labelled = next(d for d in forge.state.deliveries.values()
                    if d.event == "issues" and d.action == "labeled"
                    and d.payload["issue"]["number"] == n)
    assert forge.webhooks.redeliver(labelled) is not None
    await embedded.settle()
    await _linked_nowhere(embedded, tools, goal, n)
    # nor does marco's later act that is not about the body take troll's line
    await marco.call("PATCH", f"/repos/{SITE}/issues/{n}", {"state": "closed"}, expect=200)
    await marco.comment(SITE, n, "seen")
    await embedded.settle()
    await _linked_nowhere(embedded, tools, goal, n)
    # marco writing the line himself links it
    await marco.call("PATCH", f"/repos/{SITE}/issues/{n}",
                     {"body": f"Part of {outcome}\nstack trace, triaged"}, expect=200)
    await embedded.settle()
    item = await db.get_item(embedded.services.store, f"{SITE}#{n}")
    assert item is not None and item.parent == outcome


async def test_an_outsiders_edit_before_a_members_label_is_handled_links_nothing(
        embedded: Embedded, session: aiohttp.ClientSession, tools: Any) -> None:
    """The same race the other way round: marco's label is delivered first, and troll's edit
    lands while the app handles it (its read of the issue waits at the forge)."""
    marco, troll, goal, outcome, n = await _outsiders_report(embedded, session)
    held = embedded.forge.faults.hold("GET /repos/{owner}/{repo}/issues/{issue_number}", repo=SITE)
    await marco.call("PATCH", f"/repos/{SITE}/issues/{n}", {"labels": ["evidence"]},
                     expect=200)
    await held.arrived.wait()
    await troll.call("PATCH", f"/repos/{SITE}/issues/{n}",
                     {"body": f"Part of {outcome}\nstack trace"}, expect=200)
    held.release()
    await embedded.settle()
    await _linked_nowhere(embedded, tools, goal, n)
