"""Updates on outcomes (handlers/item_updates.py) that name another item: a plan or evidence
under a visible outcome, in a repository the reader cannot see. Its ref and title are the
plan's, not the outcome's: they are shown, on every surface, only to who may see the plan, and
nobody else is woken for them (found by review r1).

lee is in the office and assigned to an outcome in scout's vault; the org's base permission
gives its members nothing, and lee is no collaborator of the private `acme/secret`; sara,
assigned too, may read it."""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from typing import Any

import aiohttp

from bot.app.embedded import Embedded
from tests.items_support import LEE, MARCO, SARA, make_item
from tests.support import Actor, ToolClient

SECRET = "acme/secret"
WORDS = "Launch codename Bluebird"  # a title nobody outside acme/secret may read


@dataclass
class Staged:
    marco: Actor
    outcome: str  # in scout's vault: lee and marco see it


async def _stage(embedded: Embedded, person: Any, tools: Any) -> Staged:
    embedded.forge.add_repo("acme", "secret")
    embedded.forge.set_permission(SECRET, "marco", "admin")
    embedded.forge.set_permission(SECRET, "sara", "read")
    embedded.forge.remove_org_member("acme", "lee")
    marco: Actor = person("marco")
    outcome = await make_item(embedded, marco, "outcome", "Public price list",
                              assignees=["scout-bot", "lee", "sara"])
    await tools(LEE)("get_outcome", outcome=outcome)  # lee sees the outcome
    return Staged(marco, outcome)


async def _secret_plan(embedded: Embedded, s: Staged) -> str:
    plan = await make_item(embedded, s.marco, "plan", f"{WORDS}: plan",
                           body=f"Part of {s.outcome}", repo=SECRET)
    await embedded.settle()
    return plan


def _leaks(body: Any) -> bool:
    text = json.dumps(body)
    return WORDS in text or SECRET in text


async def test_an_update_naming_a_plan_the_reader_cannot_see_is_not_listed(
        embedded: Embedded, person: Any, tools: Any) -> None:
    s = await _stage(embedded, person, tools)
    plan = await _secret_plan(embedded, s)
    lee: ToolClient = tools(LEE)
    status, body = await lee.raw("get_tree", {"goal": plan})  # the forge's judgement
    assert (status, body["error"]["code"]) == (404, "not_found"), body
    # closed and reopened: the same names again
    repo, _, n = plan.partition("#")
    for state in ("closed", "open"):
        await s.marco.call("PATCH", f"/repos/{repo}/issues/{n}", {"state": state}, expect=200)
        await embedded.settle()
    seen = await lee("list_inbox")
    assert not _leaks(seen["updates"]), seen["updates"]
    assert seen["moreUpdatesBefore"] is None
    # sara, assigned too, may see the plan: she is shown all three
    updates = (await tools(SARA)("list_inbox"))["updates"]
    assert [u["summary"] for u in updates if SECRET in u["summary"]] == [
        f"plan {plan} reopened: {WORDS}: plan", f"plan {plan} closed: {WORDS}: plan",
        f"new plan {plan}: {WORDS}: plan"]


async def test_a_page_of_updates_fills_past_those_the_reader_cannot_see(
        embedded: Embedded, person: Any, tools: Any) -> None:
    """More hidden updates than a page: lee's page still shows the visible one below them."""
    s = await _stage(embedded, person, tools)
    await make_item(embedded, s.marco, "plan", "Price list: plan", body=f"Part of {s.outcome}")
    plan = await _secret_plan(embedded, s)
    repo, _, n = plan.partition("#")
    for state in ("closed", "open") * 16:  # 32 hidden updates, above the visible one
        await s.marco.call("PATCH", f"/repos/{repo}/issues/{n}", {"state": state}, expect=200)
        await embedded.settle()
    seen = await tools(LEE)("list_inbox")
    assert not _leaks(seen["updates"]), seen["updates"]
    assert [u for u in seen["updates"] if u["summary"].endswith(": Price list: plan")]


async def test_the_console_inbox_shows_no_update_naming_a_plan_the_reader_cannot_see(
        embedded: Embedded, person: Any, tools: Any, session: aiohttp.ClientSession) -> None:
    s = await _stage(embedded, person, tools)
    await _secret_plan(embedded, s)
    headers = {"Authorization": f"Bearer {embedded.api_tokens[LEE]}"}
    async with session.get(f"{embedded.app_url}/console/inbox", headers=headers) as resp:
        html = await resp.text()
    assert resp.status == 200
    assert WORDS not in html and SECRET not in html, [
        line.strip() for line in html.splitlines() if WORDS in line or SECRET in line]


async def test_nobody_is_woken_for_an_update_they_will_not_be_shown(
        embedded: Embedded, person: Any, tools: Any) -> None:
    """lee's console waits on lee's principal: the hidden plan does not end that wait; a plan
    lee may see does."""
    s = await _stage(embedded, person, tools)
    notifier = embedded.services.notifier
    waiting = notifier.waiting()
    lee_waits = asyncio.ensure_future(notifier.wait_woken([LEE], 600, org="acme"))
    marco_waits = asyncio.ensure_future(notifier.wait_woken([MARCO], 600, org="acme"))
    await asyncio.sleep(0)  # one turn: each task registers before its first await
    assert notifier.waiting() == waiting + 2
    await _secret_plan(embedded, s)
    assert await marco_waits is not None  # marco may see it (woken, not timed out)
    assert not lee_waits.done()
    await make_item(embedded, s.marco, "plan", "Price list: plan", body=f"Part of {s.outcome}")
    await embedded.settle()
    assert await lee_waits is not None
