"""The seed's inbox sentences acted out ("Your inbox, and your agents'", and whose turn it is in
a question's thread): what wakes a long poll, the person's view of their agents' box, one read
mark per agent, the turn after a follow-up, and the MCP `inbox` prompt."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import mcp_types as types

from bot.app.embedded import Embedded
from tests.items_support import CRITIC, MARCO, SARA, SCOUT, TOKEN_TTL, make_item
from tests.support import ToolClient
from tests.test_mcp import mcp_http


async def _until(check: Any, timeout: float = 5.0) -> None:
    """Wait on the app's own state (the notifier's registrations), not on the clock."""
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.01)


async def _blocks(client: ToolClient, seconds: float = 1.0) -> dict[str, Any]:
    """list_inbox with `wait`, which must block for the whole wait (nothing new is theirs)."""
    started = time.monotonic()
    got: dict[str, Any] = await client("list_inbox", wait=seconds)
    assert time.monotonic() - started >= seconds * 0.9, "returned at once: a busy loop"
    return got


async def test_returns_as_soon_as_something_new_is_yours(embedded: Embedded, person: Any,
                                                         tools: Any) -> None:
    outcome = await make_item(embedded, person("marco"), "outcome", "Auth",
                              assignees=["scout-bot"])
    scout, marco, sara = tools(SCOUT), tools(MARCO), tools(SARA)
    notifier = embedded.services.notifier

    # marco has an unread comment of his own: it is his, not his agent's, to read
    await sara("add_comment", targetType="outcome", target=outcome, body="For Marco",
               to=["marco@acme.com"])
    await scout("mail_list")  # scout has seen everything of its own so far
    got = await _blocks(scout)
    assert got["agents"]["unread"] == []
    assert [c["body"] for c in got["you"]["unread"]] == ["For Marco"], (
        "list_inbox shows it all, for going through it with the person")

    # scout has an unread comment in the agents' box: it is not marco's notification
    await marco("list_inbox")
    await sara("add_comment", targetType="outcome", target=outcome, body="For the agent")
    got = await _blocks(marco)
    assert got["you"]["unread"] == []

    # and each returns as soon as something new is theirs
    await scout("mail_list")
    poll = asyncio.create_task(scout("list_inbox", wait=30))
    await _until(lambda: notifier.waiting() >= 1)
    await sara("add_comment", targetType="outcome", target=outcome, body="New for scout")
    got = await asyncio.wait_for(poll, 5)
    assert [c["body"] for c in got["agents"]["unread"]] == ["New for scout"]


async def test_you_see_it_as_history_never_as_a_notification(embedded: Embedded, person: Any,
                                                             tools: Any) -> None:
    outcome = await make_item(embedded, person("marco"), "outcome", "Auth",
                              assignees=["scout-bot"])
    goal = await make_item(embedded, person("sara"), "goal", "Launch")
    marco, sara = tools(MARCO), tools(SARA)
    notifier = embedded.services.notifier
    poll = asyncio.create_task(marco("list_inbox", wait=30))
    await _until(lambda: notifier.waiting() >= 1)
    waiting = notifier.waiting()
    handled = await sara("add_comment", targetType="outcome", target=outcome,
                         body="Scout's to handle")
    assert handled["notify"] == [{"principal": SCOUT, "way": "agents"}]
    assert notifier.waiting() == waiting, "marco's long poll was woken by his agents' box"
    assert not poll.done()
    await sara("add_comment", targetType="goal", target=goal, body="Marco's own",
               to=["marco@acme.com"])
    got = await asyncio.wait_for(poll, 5)
    assert [c["body"] for c in got["you"]["unread"]] == ["Marco's own"]
    # the agents' box is there as history: what his agents are handling
    history = got["agents"]
    assert history["title"] == "Your agents are handling"
    assert [(c["body"], c["forAgent"]) for c in history["unread"]] == [
        ("Scout's to handle", SCOUT)]
    again = await marco("list_inbox")
    assert [c["body"] for c in again["agents"]["unread"]] == ["Scout's to handle"], (
        "marco looking at it marks nothing read for scout")


async def test_every_agent_of_yours_shares_it(embedded: Embedded, person: Any,
                                              tools: Any) -> None:
    outcome = await make_item(embedded, person("marco"), "outcome", "Auth",
                              assignees=["scout-bot"])
    scout, critic = tools(SCOUT), tools(CRITIC)
    note = await tools(SARA)("add_comment", targetType="outcome", target=outcome,
                             body="Scout: the tokens expire early")
    [seen] = (await critic("mail_list"))["inbox"]["unread"]
    assert seen["id"] == note["comment"]["id"] and seen["forAgent"] == SCOUT
    [mine] = (await scout("mail_list"))["inbox"]["unread"]
    assert mine["id"] == note["comment"]["id"], "a sibling's mail_list consumed scout's item"
    assert (await scout("mail_list"))["inbox"]["unread"] == [], "shown once"
    assert (await critic("list_inbox"))["agents"]["unread"] == [], "shown once"
    # and each agent pages back through what it has read
    page = await scout("list_inbox", read=True)
    assert [c["id"] for c in page["read"]] == [note["comment"]["id"]]
    # marco's history no longer shows it: the agent it was for has it
    assert (await tools(MARCO)("list_inbox"))["agents"]["unread"] == []


async def test_the_people_asked_until_one_of_them_replies_then_yours(
        embedded: Embedded, person: Any, tools: Any) -> None:
    """ "A question's thread knows whose turn it is: the people asked, until one of them
    replies; then yours. Your follow-up hands it back to them." """
    outcome = await make_item(embedded, person("marco"), "outcome", "Auth",
                              assignees=["scout-bot"])
    scout, marco, sara = tools(SCOUT), tools(MARCO), tools(SARA)
    base = {"targetType": "outcome", "target": outcome}

    async def turn(who: ToolClient, **args: Any) -> list[str]:
        got = await who("add_comment", **base, **args)
        return list(got["thread"]["waitingOn"])

    for asked, client in ((SARA, sara), (MARCO, marco)):  # marco is scout's own person
        q = await scout("add_comment", **{**TOKEN_TTL, **base, "to": [asked[6:]]})
        qid = q["comment"]["id"]
        assert q["thread"]["waitingOn"] == [asked]
        assert await turn(client, parent=qid, option=2) == [SCOUT], asked
        assert await turn(scout, parent=qid, body="For all tenants?") == [asked], asked
        assert await turn(client, parent=qid, body="Yes, all of them") == [SCOUT], (
            f"{asked}'s reply to the follow-up gives the turn back to the asker")
        assert qid not in [t["thread"] for t in (await client("list_inbox"))["you"]["yourTurn"]]
        assert qid in [t["thread"] for t in (await scout("list_inbox"))["agents"]["yourTurn"]]
        assert await turn(scout, parent=qid, body="And the admins?") == [asked], asked
        await scout("resolve_comment", comment=qid)


async def _prompt(embedded: Embedded, principal: str) -> str:
    async with mcp_http(embedded, embedded.api_tokens[principal]) as client:
        got = await client.get_prompt("inbox")
    [message] = got.messages
    assert isinstance(message.content, types.TextContent)
    return message.content.text


async def test_the_inbox_prompt_shows_replies_to_yours_as_cards_to_read_and_act_on(
        embedded: Embedded, person: Any, tools: Any) -> None:
    """ "yourTurn (questions waiting on you, and replies to yours)": a reply to your own
    question is read and acted on, not answered. """
    outcome = await make_item(embedded, person("marco"), "outcome", "Auth",
                              assignees=["scout-bot"])
    marco, sara = tools(MARCO), tools(SARA)
    base = {"targetType": "outcome", "target": outcome}
    mine = await marco("add_comment", **{**TOKEN_TTL, **base, "to": ["sara@acme.com"]})
    await sara("add_comment", **base, parent=mine["comment"]["id"], option=2,
               body="Clean cut is simpler")
    theirs = await tools(SCOUT)("add_comment", **base, body="Ship on Friday?",
                                header="Ship day", options=[{"label": "Friday"},
                                                            {"label": "Monday"}],
                                to=["marco@acme.com"])
    text = await _prompt(embedded, MARCO)
    reply, question = text.split("Card 1 of 2")[1].split("Card 2 of 2")
    if "Ship day" in reply:
        reply, question = question, reply
    assert "Token TTL" in reply and "Force re-login" in reply and "Clean cut" in reply
    assert "Option 1." not in reply and "Defer" not in reply, "a reply is not a question"
    assert "resolve_comment" in text
    assert "Option 1. Friday" in question and "Defer" in question
    # doing what it says works: resolve the thread whose answer was used
    resolved = await marco("resolve_comment", comment=mine["comment"]["id"])
    assert resolved["thread"]["resolved"] is True
    [left] = (await marco("list_inbox"))["you"]["yourTurn"]
    assert left["thread"] == theirs["comment"]["id"]


async def test_fetching_the_prompt_marks_nothing_read_the_person_has_not_been_shown(
        embedded: Embedded, person: Any, tools: Any) -> None:
    goal = await make_item(embedded, person("sara"), "goal", "Launch")
    note = await tools(SARA)("add_comment", targetType="goal", target=goal,
                             body="The launch moved", to=["marco@acme.com"])
    text = await _prompt(embedded, MARCO)
    got = await tools(MARCO)("list_inbox")
    assert [c["id"] for c in got["you"]["unread"]] == [note["comment"]["id"]]
    assert "1 unread" in text, "the prompt says what else is there, and how to see it"


async def test_an_agents_long_poll_waits_past_mail_it_has_already_been_shown(
        embedded: Embedded, tools: Any) -> None:
    """A mail:new the agent has been shown (in every result's `inbox.mail`) and chose not to
    open yet is not new: the agent's next `list_inbox` with `wait` must wait, not return at
    once again and again (the busy loop of issue 10 item 1, by way of mail)."""
    await tools("agent:builder")("mail_send", to="scout", subject="Prices", body="EU")
    await embedded.settle()
    scout = tools("agent:scout")
    shown = await scout("list_inbox")
    assert [m["subject"] for m in shown["inbox"]["mail"]] == ["Prices"]
    poll = asyncio.create_task(scout("list_inbox", wait=5))
    done, _ = await asyncio.wait({poll}, timeout=1.0)  # a bound: it must still be waiting
    poll.cancel()
    assert not done, "list_inbox with wait returned at once for a mail already shown"


async def test_an_inbox_answer_is_a_page_not_a_megabyte(embedded: Embedded, person: Any,
                                                          tools: Any) -> None:
    """With more than a page of questions waiting on a person, `yourTurn` holds the newest
    30 and says how many more wait; answering one brings the next up."""
    from bot.items.inbox import PAGE

    sara, per_item = tools(SARA), 5  # at most 5 open questions of one asker on one item
    outcomes = [await make_item(embedded, person("marco"), "outcome", f"Area {k}")
                for k in range(-(-(PAGE + 2) // per_item))]
    asked = [await sara("add_comment", targetType="outcome", target=outcomes[i // per_item],
                        header=f"Q{i}", body=f"Question {i}?", to=["marco@acme.com"],
                        options=[{"label": "Yes"}, {"label": "No"}])
             for i in range(PAGE + 2)]
    await embedded.settle()
    marco = tools(MARCO)
    box = (await marco("list_inbox"))["you"]
    assert len(box["yourTurn"]) == PAGE and box["moreYourTurn"] == 2
    shown = {c["header"] for c in box["yourTurn"]}
    assert "Q0" not in shown and f"Q{PAGE + 1}" in shown, "the page holds the newest"
    top = box["yourTurn"][0]
    await marco("add_comment", targetType="outcome", target=top["item"], parent=top["thread"],
                option="1")
    box = (await marco("list_inbox"))["you"]
    assert len(box["yourTurn"]) == PAGE and box["moreYourTurn"] == 1
    assert len(asked) == PAGE + 2
