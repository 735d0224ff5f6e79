"""The seed's loop guard (mail.md: "Two agents replying to each other could wake each other
forever ... Beyond 3 hops, the notification is still delivered, but without mail:new") for
comments on items: agents that address each other on a plan, through the tools or by hand on
the forge, woke each other's inbox waits with no count, for ever. An item counts its agents'
comments in a row (a person's comment ends the run); past LOOP_GUARD_HOPS an agent's comment
is recorded and shown, but wakes no agent, hands no agent the turn, and `comment.loop_guard`
is ledgered."""

from __future__ import annotations

import asyncio
from typing import Any

from bot.app.embedded import Embedded
from bot.items import inbox
from bot.mail.header import LOOP_GUARD_HOPS
from bot.store import comments as db
from tests.items_support import (
    BUILDER,
    MARCO,
    SCOUT,
    VAULT,
    events,
    forge_comments,
    make_item,
    where,
)
from tests.test_reindex import _drop_work, _reindex

MENTION = {SCOUT: "@scout-bot", BUILDER: "@builder-bot"}


async def _woke(embedded: Embedded, tools: Any, addressee: str, write: Any) -> bool:
    """Whether `write()` ended the addressee's inbox wait (list_inbox's long poll), which
    was registered after it had been shown all it had."""
    notifier = embedded.services.notifier
    await tools(addressee)("list_inbox")
    waiter = notifier.wait_any(inbox.wait_keys(embedded.office, addressee), 60, org="acme")
    task = asyncio.create_task(waiter)
    await asyncio.sleep(0)  # registered, as list_inbox's wait registers before it looks
    try:
        before = notifier.waiting()
        await write()
        await embedded.settle()
        return notifier.waiting() < before
    finally:
        task.cancel()


async def test_two_agents_answering_each_other_on_a_plan_stop_waking_each_other(
        embedded: Embedded, person: Any, tools: Any) -> None:
    """scout and builder answer each other on marco's plan, by tool call and by hand on the
    forge: the first LOOP_GUARD_HOPS + 1 wake the other's wait; past that each is still on
    the item (and in the other's inbox, saying why it woke no one), mentions no agent on the
    forge, and is ledgered; marco's comment starts the count again."""
    embedded.forge.set_permission(VAULT, "builder-bot", "write")
    plan = await make_item(embedded, person("marco"), "plan", "Cache plan")
    base = {"targetType": "plan", "target": plan}
    root = (await tools(SCOUT)("add_comment", **base, body="ping 0",
                               to=["agent:builder"]))["comment"]["id"]
    other = {SCOUT: BUILDER, BUILDER: SCOUT}
    woke, answers = [], []
    speaker = BUILDER
    for n in range(1, 7):
        to = other[speaker]

        async def write(speaker: str = speaker, to: str = to, n: int = n) -> None:
            if n % 2:  # by tool call
                answers.append(await tools(speaker)("add_comment", **base, parent=root,
                                                    body=f"pong {n}", to=[to]))
            else:  # by hand on the forge, from the agent's own account
                login = MENTION[speaker][1:]
                await person(login).comment(*where(plan), f"to: {to}\n\npong {n}")
        woke.append(await _woke(embedded, tools, to, write))
        speaker = to
    hops = LOOP_GUARD_HOPS
    assert woke == [True] * hops + [False] * (6 - hops), woke  # hops 1..3 wake; 4.. not
    guarded = [a for a in answers if a.get("loopGuard")]
    assert [a["comment"]["body"] for a in guarded] == ["pong 5"]
    assert f"beyond {hops} hops" in guarded[0]["loopGuard"]
    ledgered = await events(embedded, "comment.loop_guard")
    assert [(e.data["hops"], e.subject) for e in ledgered] == [(4, plan), (5, plan), (6, plan)]
    # still on the item, mentioning no agent there; and in the inbox, saying why
    forge = [c["body"] for c in await forge_comments(person("admin"), plan)]
    pong5 = next(b for b in forge if "pong 5" in b)
    assert "@scout-bot" not in pong5.split("\n")[1], pong5
    notes = [b for b in forge if "comment above is for you" in b]
    assert len(notes) == 1, "pong 2 pinged builder; past the guard pong 4 and 6 ping no agent"
    unread = (await tools(SCOUT)("list_inbox"))["agents"]["unread"]
    assert [c["body"] for c in unread] == ["pong 5"] and unread[0]["loopGuard"]
    # a person's comment ends the run: the next agent's wakes again
    await tools(MARCO)("add_comment", **base, parent=root, body="Keep it short")

    async def again() -> None:
        await tools(BUILDER)("add_comment", **base, parent=root, body="pong 7", to=[SCOUT])
    assert await _woke(embedded, tools, SCOUT, again)
    assert len(await events(embedded, "comment.loop_guard")) == 3


async def test_past_the_guard_an_agents_reply_hands_no_agent_the_turn_and_a_rebuild_agrees(
        embedded: Embedded, person: Any, tools: Any) -> None:
    """scout asks builder on a plan and they go back and forth in the question's thread: each
    follow-up and answer handed the turn to the other, for ever. Past the guard the reply
    stands but the question waits on no agent; a reindex from the forge reads it the same."""
    embedded.forge.set_permission(VAULT, "builder-bot", "write")
    plan = await make_item(embedded, person("marco"), "plan", "Cache plan")
    base = {"targetType": "plan", "target": plan}
    q = await tools(SCOUT)("add_comment", **base, body="TTL?", needsReply=True,
                           to=["agent:builder"])
    qid = q["comment"]["id"]
    turns = [q["thread"]["waitingOn"]]
    speaker, other = BUILDER, SCOUT
    for n in range(1, 6):
        said = await tools(speaker)("add_comment", **base, parent=qid, body=f"say {n}")
        turns.append(said["thread"]["waitingOn"])
        speaker, other = other, speaker
    assert turns == [[BUILDER], [SCOUT], [BUILDER], [SCOUT], [], []], turns
    assert qid not in [t["thread"] for t in
                       (await tools(SCOUT)("list_inbox"))["agents"]["yourTurn"]]
    store = embedded.services.store
    live = await db.get_thread(store, qid)
    await _drop_work(embedded)
    await _reindex(embedded)
    rebuilt = await db.get_thread(store, qid)
    assert live is not None and rebuilt is not None
    assert live.state.answer is not None and rebuilt.state.answer is not None
    assert (rebuilt.state.waiting_on, rebuilt.state.answer.comment) == (
        live.state.waiting_on, live.state.answer.comment)
