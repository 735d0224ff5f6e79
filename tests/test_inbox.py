"""Inboxes: `you` and `agents`, unread delivered once, read pages, updates, wait, and the
`inbox` field on every agent tool result."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from bot.app.embedded import Embedded
from bot.store import comments as db
from tests.items_support import CRITIC, MARCO, SARA, SCOUT, TOKEN_TTL, make_item, where
from tests.support import ToolClient


async def test_you_and_agents_with_your_turn_unread_once_and_waiting_on_others(
        embedded: Embedded, person: Any, tools: Any) -> None:
    outcome = await make_item(embedded, person("marco"), "outcome", "Auth",
                              assignees=["scout-bot"])
    scout, marco, sara = tools(SCOUT), tools(MARCO), tools(SARA)
    q = await scout("add_comment", target=outcome, **{**TOKEN_TTL, "to": ["sara@acme.com"]})
    note = await sara("add_comment", targetType="outcome", target=outcome, body="On it",
                      cc=["marco@acme.com"])

    inbox = await marco("list_inbox")
    assert [c["id"] for c in inbox["you"]["unread"]] == [note["comment"]["id"]]
    assert inbox["you"]["unread"][0]["contentIsData"] is True and "never follow" in inbox["note"]
    assert [c["id"] for c in inbox["agents"]["unread"]] == [note["comment"]["id"]]
    assert inbox["agents"]["unread"][0]["forAgent"] == SCOUT
    [waiting] = inbox["agents"]["waitingOnOthers"]
    assert waiting["byAgent"] == SCOUT and waiting["header"] == "Token TTL"
    assert inbox["you"]["waitingOnOthers"] == [] and inbox["you"]["yourTurn"] == []
    again = await marco("list_inbox")
    assert again["you"]["unread"] == [], "delivered once"
    assert [c["id"] for c in again["agents"]["unread"]] == [note["comment"]["id"]], (
        "marco looking at his agents' box leaves it unread for them")
    seen = await scout("mail_list")
    assert [c["id"] for c in seen["inbox"]["unread"]] == [note["comment"]["id"]]
    after = await marco("list_inbox")
    assert after["agents"]["unread"] == [], "once the agent it is for has it, it is handled"

    sara_box = await sara("list_inbox")
    assert [t["thread"] for t in sara_box["you"]["yourTurn"]] == [q["comment"]["id"]]
    assert "then" not in sara_box["you"]["yourTurn"][0]["options"][0]

    # agents see their share in every tool result; the person's own inbox only as counts
    result = await tools(CRITIC)("list_changes")
    assert result["inbox"]["unreadForYourPerson"] == 0
    await sara("add_comment", targetType="outcome", target=outcome, parent=q["comment"]["id"],
               option=2, to=["marco@acme.com"], body="Ask Marco too")
    result = await tools(CRITIC)("list_changes")
    assert result["inbox"]["unreadForYourPerson"] == 1
    assert result["inbox"]["waitingOnYourPerson"] == 0
    [turn] = result["inbox"]["yourTurn"]
    assert turn["forAgent"] == SCOUT and turn["answer"]["option"] == "Force re-login"
    assert "then" not in turn["answer"], "then is for the asker, not its sibling agents"
    assert turn["asHistory"] is True and SCOUT in turn["note"], (
        "critic carries scout's answer as history: acting on it and resolving it are scout's")
    [turn] = (await scout("list_changes"))["inbox"]["yourTurn"]
    assert turn["answer"]["then"].startswith("Invalidate")


async def test_read_comments_page_newest_first(embedded: Embedded, person: Any,
                                               tools: Any) -> None:
    goal = await make_item(embedded, person("sara"), "goal", "Chatty")
    sara: ToolClient = tools(SARA)
    ids = [(await sara("add_comment", targetType="goal", target=goal, body=f"note {i}",
                       to=["marco@acme.com"]))["comment"]["id"] for i in range(35)]
    marco = tools(MARCO)
    first = await marco("list_inbox")
    assert len(first["you"]["unread"]) == 35
    page = await marco("list_inbox", read=True)
    assert [c["id"] for c in page["read"]] == ids[::-1][:30]
    assert page["moreReadBefore"] is not None
    rest = await marco("list_inbox", read=True, readBefore=page["moreReadBefore"])
    assert [c["id"] for c in rest["read"]] == ids[::-1][30:]
    assert rest["moreReadBefore"] is None


async def test_updates_on_my_outcomes_newest_first_30_at_a_time(embedded: Embedded,
                                                                person: Any,
                                                                tools: Any) -> None:
    marco, sara = person("marco"), person("sara")
    outcome = await make_item(embedded, marco, "outcome", "Checkout")
    repo, n = where(outcome)
    await make_item(embedded, sara, "plan", "Plan A", body=f"Part of #{n}")
    await make_item(embedded, sara, "evidence", "Logs", body=f"Part of #{n}")
    await sara.call("PATCH", f"/repos/{repo}/issues/{n}", {"assignees": ["builder-bot"]},
                    expect=200)
    await sara.call("PATCH", f"/repos/{repo}/issues/{n}", {"state": "closed"}, expect=200)
    await embedded.settle()
    got = await tools(MARCO)("list_inbox")
    assert [u["kind"] for u in got["updates"]] == ["status", "claim", "evidence", "plan"]
    assert "agent:builder" in got["updates"][1]["summary"]
    assert got["moreUpdatesBefore"] is None
    # the claim holder's person sees them too; nobody sees their own doings
    sara_updates = (await tools(SARA)("list_inbox"))["updates"]
    assert sara_updates == [], "sara did all of it herself"

    store = embedded.services.store
    cut_ms = int(time.time() * 1000) + 1  # a millisecond after every update above
    for _ in range(1000):  # and, once the clock has reached it, before every update below
        if time.time() * 1000 >= cut_ms:
            break
        await asyncio.sleep(0.0005)
    async with store.transaction() as tx:
        for i in range(40):
            await db.add_update(tx, outcome, "status", SARA, f"update {i}")
    page = await tools(MARCO)("list_inbox")
    assert len(page["updates"]) == 30 and page["updates"][0]["summary"] == "update 39"
    more = await tools(MARCO)("list_inbox", updatesBefore=page["moreUpdatesBefore"])
    assert [u["summary"] for u in more["updates"]][:10] == [f"update {i}" for i in
                                                           range(9, -1, -1)]
    assert len(more["updates"]) == 14 and more["moreUpdatesBefore"] is None
    since = await tools(MARCO)("list_inbox", updatesBefore=page["moreUpdatesBefore"],
                               since=time.strftime("%Y-%m-%dT%H:%M:%S",
                                                   time.gmtime(cut_ms // 1000))
                               + f".{cut_ms % 1000:03d}Z")
    assert len(since["updates"]) == 10, "stopped at since"


async def test_wait_returns_within_a_second_of_something_new(embedded: Embedded, person: Any,
                                                             tools: Any) -> None:
    goal = await make_item(embedded, person("sara"), "goal", "Quiet")
    marco = tools(MARCO)
    start = time.monotonic()
    empty = await marco("list_inbox", wait=0.5)
    assert 0.4 < time.monotonic() - start < 2 and empty["you"]["unread"] == []

    notifier = embedded.services.notifier
    waiting = asyncio.create_task(marco("list_inbox", wait=20))
    deadline = time.monotonic() + 5
    while notifier.waiting() == 0:  # until the long poll is registered and asleep
        assert not waiting.done(), waiting.result()
        assert time.monotonic() < deadline, "the long poll never started waiting"
        await asyncio.sleep(0.01)
    assert not waiting.done()
    sent_at = time.monotonic()
    await tools(SARA)("add_comment", targetType="goal", target=goal, body="Ping",
                      to=["marco@acme.com"])
    got = await asyncio.wait_for(waiting, 5)
    assert time.monotonic() - sent_at < 1.0
    assert [c["body"] for c in got["you"]["unread"]] == ["Ping"]
    status, err = await marco.raw("list_inbox", {"wait": 51})
    assert status == 422 and "wait" in err["error"]["message"]


async def test_a_cursor_says_nothing_of_the_rows_beside_it(embedded: Embedded, person: Any,
                                                          tools: Any) -> None:
    """A cursor was the row's place among every office's inbox rows and item updates, so the
    gap between two of an office's cursors told it how many the other offices had written
    (review of the ledger's seq, the same leak). A cursor is the place under a keyed
    permutation (bot.cursors): consecutive rows' cursors are not consecutive numbers, they
    page as before, and one this app never gave is refused saying so."""
    goal = await make_item(embedded, person("sara"), "goal", "Chatty")
    sara: ToolClient = tools(SARA)
    for i in range(31):
        await sara("add_comment", targetType="goal", target=goal, body=f"note {i}",
                   to=["marco@acme.com"])
    marco = tools(MARCO)
    await marco("list_inbox")
    page = await marco("list_inbox", read=True)
    places = await embedded.services.store.fetchall(
        "SELECT seq FROM inbox_deliveries ORDER BY seq DESC LIMIT 30")
    shown = [c["cursor"] for c in page["read"]]
    assert shown != [int(r["seq"]) for r in places], "the rows' own places"
    assert not any(abs(a - b) == 1 for a, b in zip(shown, shown[1:], strict=False)), shown
    rest = await marco("list_inbox", read=True, readBefore=page["moreReadBefore"])
    assert len(rest["read"]) == 1
    with pytest.raises(AssertionError, match="bad_cursor"):
        await marco("list_inbox", read=True, readBefore=2 ** 52)
    # a number the app never gave, inside the cursors' range, is no cursor either (it read
    # as a place past every row: the first page again, as if it were one)
    for never in (12345, 1, -1, 2 ** 40):
        status, err = await marco.raw("list_inbox", {"read": True, "readBefore": never})
        assert status == 422 and err["error"]["code"] == "bad_cursor", (never, err)
        status, err = await marco.raw("list_inbox", {"updatesBefore": never})
        assert status == 422 and err["error"]["code"] == "bad_cursor", (never, err)
    # readBefore pages the comments already read: without read, it was dropped unsaid
    status, err = await marco.raw("list_inbox", {"readBefore": page["moreReadBefore"]})
    assert status == 422 and "read: true" in err["error"]["message"], err


async def test_a_refused_cursor_marks_nothing_read(embedded: Embedded, person: Any,
                                                   tools: Any) -> None:
    """A person's look refused for a cursor this app never gave (422 bad_cursor) shows
    nothing, so it marks nothing read: the comments it would have shown once are still
    unread on the next look (they were marked read, then the cursor refused: never shown).
    An agent's refusal carries its `inbox`, where its share is shown (once). A long poll
    with such a cursor is refused before it waits."""
    outcome = await make_item(embedded, person("marco"), "outcome", "Cursors",
                              assignees=["scout-bot"])
    sara: ToolClient = tools(SARA)
    note = await sara("add_comment", targetType="outcome", target=outcome, body="Heads up",
                      to=["marco@acme.com"])
    marco: ToolClient = tools(MARCO)
    scout: ToolClient = tools(SCOUT)
    shown_to_scout = []
    for args in ({"updatesBefore": 12345}, {"read": True, "readBefore": 12345}):
        status, err = await marco.raw("list_inbox", args)
        assert status == 422 and err["error"]["code"] == "bad_cursor", (args, err)
        status, err = await scout.raw("list_inbox", args)
        assert status == 422 and err["error"]["code"] == "bad_cursor", (args, err)
        shown_to_scout += [c["id"] for c in err["inbox"]["unread"]]
    got = await marco("list_inbox")
    assert [c["id"] for c in got["you"]["unread"]] == [note["comment"]["id"]]
    assert shown_to_scout == [note["comment"]["id"]]  # in its refusal's inbox, once
    started = time.monotonic()
    status, err = await marco.raw("list_inbox", {"updatesBefore": 12345, "wait": 30})
    assert status == 422 and err["error"]["code"] == "bad_cursor", err
    assert time.monotonic() - started < 10, "refused before it waited"
