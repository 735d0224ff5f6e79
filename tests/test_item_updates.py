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
import pytest

from bot.app.embedded import Embedded
from bot.items.inbox import PAGE
from bot.store import comments as db
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


# The updates page applies the visibility rule to repositories (issue 22, `bench.inbox`):
# the keys of lee's updates (seq and repositories) are read, each repository asked once, and
# only the page's updates are read, so of a run of updates lee may not see, however long,
# only the keys leave the database. Before, they were read and hidden in Python, at most
# four rounds of them: past that the page came back short, and each round was a read.
HIDDEN_RUN = 4 * PAGE + 10  # more than the four rounds read past


async def _hidden_run(embedded: Embedded, s: Staged) -> tuple[str, list[str]]:
    """40 updates lee may see on the outcome, then HIDDEN_RUN newer ones naming the plan in
    acme/secret (as the handler writes them); returns the plan, and the 40 summaries newest
    first."""
    plan = await _secret_plan(embedded, s)
    shown = [f"outcome note {i}" for i in range(40)]
    async with embedded.services.store.transaction() as tx:
        for words in shown:
            await db.add_update(tx, s.outcome, "status", MARCO, words)
        for _ in range(HIDDEN_RUN):
            await db.add_update(tx, s.outcome, "plan", MARCO, f"plan {plan} closed: {WORDS}",
                                about=plan)
    return plan, shown[::-1]


async def test_a_run_of_updates_the_reader_cannot_see_longer_than_a_page_hides_no_visible_one(
        embedded: Embedded, person: Any, tools: Any) -> None:
    """lee's newest HIDDEN_RUN updates name a plan in acme/secret: lee's first page is the 30
    visible ones below them, its cursor on the 30th, and the next page the 10 after them;
    sara, who may read acme/secret, is shown the run."""
    s = await _stage(embedded, person, tools)
    plan, shown = await _hidden_run(embedded, s)
    lee: ToolClient = tools(LEE)
    first = await lee("list_inbox")
    assert not _leaks(first["updates"]), first["updates"]
    assert [u["summary"] for u in first["updates"]] == shown[:PAGE]
    assert first["moreUpdatesBefore"] == first["updates"][-1]["cursor"]
    second = await lee("list_inbox", updatesBefore=first["moreUpdatesBefore"])
    assert not _leaks(second["updates"]), second["updates"]
    assert [u["summary"] for u in second["updates"]][:10] == shown[PAGE:]
    assert [u["summary"] for u in (await tools(SARA)("list_inbox"))["updates"]] == [
        f"plan {plan} closed: {WORDS}"] * PAGE


async def test_an_updates_page_past_updates_the_reader_cannot_see_is_one_read(
        embedded: Embedded, person: Any, tools: Any) -> None:
    """lee's list_inbox over the hidden run reads updates once (before: a read a round, and
    it read past the rounds' four), besides the reads of their keys (each one's seq and the
    repositories it names), a page of them first, twice as many each time none is shown:
    three for the run; no row of them that names the hidden plan leaves the database."""
    s = await _stage(embedded, person, tools)
    await _hidden_run(embedded, s)
    await embedded.settle()
    store = embedded.services.store
    reads: list[str] = []
    returned: list[Any] = []
    fetchall = store.fetchall

    async def spy(sql: Any, params: Any = ()) -> list[Any]:
        rows = await fetchall(sql, params)
        text = str(getattr(sql, "sqlite", sql))
        if "item_updates" in text:
            reads.append("updates" if "summary" in text else "keys")
            returned.extend(rows)
        return rows

    store.fetchall = spy  # type: ignore[method-assign]
    try:
        page = await tools(LEE)("list_inbox")
    finally:
        del store.fetchall
    assert reads.count("updates") == 1, reads
    assert reads.count("keys") <= 3, reads  # 31, 62 and 124 keys: HIDDEN_RUN + 31 < 217
    assert len(page["updates"]) == PAGE
    values = [str(v) for row in returned for v in tuple(row)]
    assert not [v for v in values if WORDS in v or v.startswith(SECRET + "#")], (
        "an update naming the hidden plan left the database")


# Visibility is a forge request per repository and person (`Visibility`, cached 45 s): the
# updates page asks it about the repositories of the updates that may be on the reader's
# page, never about every repository the office's updates name (with many repositories and
# many people polling, that spent the installation's rate limit).
PERMISSION = "GET /repos/{owner}/{repo}/collaborators/{username}/permission"
ELSEWHERE = 6  # repositories with updates on marco's outcomes, none of them lee's


async def test_a_persons_updates_page_asks_the_forge_only_about_the_repositories_of_their_updates(
        embedded: Embedded, person: Any, tools: Any) -> None:
    """lee's list_inbox, asked with a cold visibility cache, makes the same permission requests
    before and after marco's outcomes in ELSEWHERE other repositories are closed (an update
    each, none on an outcome of lee's), and none about those repositories."""
    s = await _stage(embedded, person, tools)
    await make_item(embedded, s.marco, "plan", "Price list: plan", body=f"Part of {s.outcome}")
    lee: ToolClient = tools(LEE)

    async def asked() -> tuple[list[str], list[str]]:
        """lee's updates, and the repositories whose permission for lee the call asked."""
        embedded.services.visibility.forget()
        start = len(embedded.forge.requests)
        page = await lee("list_inbox")
        return [u["summary"] for u in page["updates"]], sorted(
            r.path for r in list(embedded.forge.requests)[start:]
            if r.route == PERMISSION and "/collaborators/lee/" in r.path)

    before = await asked()
    assert f"new plan {s.outcome[:-1]}2: Price list: plan" in before[0], before
    assert before[1], "lee's page asks about the repository of lee's updates"
    for i in range(ELSEWHERE):
        repo = f"acme/elsewhere-{i}"
        embedded.forge.add_repo("acme", repo.split("/")[1])
        embedded.forge.set_permission(repo, "marco", "admin")
        outcome = await make_item(embedded, s.marco, "outcome", f"Elsewhere {i}", repo=repo)
        await s.marco.call("PATCH", f"/repos/{repo}/issues/{outcome.partition('#')[2]}",
                           {"state": "closed"}, expect=200)
        await embedded.settle()
    written = await embedded.services.store.fetchall(
        "SELECT DISTINCT item FROM item_updates WHERE item LIKE 'acme/elsewhere-%'")
    assert len(written) == ELSEWHERE, written  # (an update on each)
    assert await asked() == before


# The keys a page reads are bounded as the rounds' rows were: a reader with a long run of
# updates they may not see (a person taken off the repository of their outcomes' plans, an
# agent whose login sees none) read every key below their cursor on each look before, newest
# first to the oldest (100,000 such updates: 106,156 rows in 18 reads, 0.7 s a list_inbox on
# SQLite, where the rounds read 124): a page looks at KEYS_A_PAGE keys at most, and one it
# leaves short has its cursor on the last of them.
KEYS_A_PAGE = 1024  # inbox.MAX_UPDATE_KEYS, as docs/using.md says it
LONG_RUN = 3 * KEYS_A_PAGE - 100


async def test_a_page_reads_a_bounded_number_of_keys_however_long_the_hidden_run(
        embedded: Embedded, person: Any, tools: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """lee's 40 visible updates lie below LONG_RUN that name the plan in acme/secret: each of
    lee's pages reads at most KEYS_A_PAGE keys (and one more, to tell whether any update lies
    below a full page), and paging on by `moreUpdatesBefore` shows the 40 and those before
    them, each once."""
    s = await _stage(embedded, person, tools)
    plan = await _secret_plan(embedded, s)
    lee: ToolClient = tools(LEE)
    earlier = [u["summary"] for u in (await lee("list_inbox"))["updates"]]
    shown = [f"outcome note {i}" for i in range(40)]
    async with embedded.services.store.transaction() as tx:
        for words in shown:
            await db.add_update(tx, s.outcome, "status", MARCO, words)
        for _ in range(LONG_RUN):
            await db.add_update(tx, s.outcome, "plan", MARCO, f"plan {plan} closed: {WORDS}",
                                about=plan)
    keys: list[int] = []  # the keys each page read
    updates_for = db.updates_for

    async def counted(*args: Any, **kwargs: Any) -> list[Any]:
        rows = await updates_for(*args, **kwargs)
        keys[-1] += len(rows) if kwargs.get("keys") else 0
        return rows

    monkeypatch.setattr(db, "updates_for", counted)
    paged: list[str] = []
    before: int | None = None
    for _ in range(LONG_RUN // KEYS_A_PAGE + 3):  # (pages enough, with a bound)
        keys.append(0)
        page = await lee("list_inbox", **({} if before is None else {"updatesBefore": before}))
        assert not _leaks(page["updates"]), page["updates"]
        paged += [u["summary"] for u in page["updates"]]
        before = page["moreUpdatesBefore"]
        if before is None:
            break
    assert max(keys) <= KEYS_A_PAGE + 1, keys
    assert before is None and paged == shown[::-1] + earlier, (keys, paged)
