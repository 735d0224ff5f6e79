"""The seed's loop guard (mail.md: "Two agents replying to each other could wake each other
forever ... Beyond 3 hops, the notification is still delivered, but without mail:new") for
comments on items: agents that address each other on a plan, through the tools or by hand on
the forge, woke each other's inbox waits with no count, for ever. Each conversation on an item
(a thread; the item's comments that reply to none) counts its agents' comments in a row (a
person's comment there ends the run); past LOOP_GUARD_HOPS an agent's comment
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
                await person(login).comment(*where(plan),
                                            f"to: {to}\n\n/reply {root} pong {n}")
        woke.append(await _woke(embedded, tools, to, write))
        speaker = to
    hops = LOOP_GUARD_HOPS
    assert woke == [True] * hops + [False] * (6 - hops), woke  # hops 1..3 wake; 4.. not
    guarded = [a for a in answers if a.get("loopGuard")]
    assert [a["comment"]["body"] for a in guarded] == ["pong 5"]
    assert f"beyond {hops} hops" in guarded[0]["loopGuard"]
    # it woke no agent, so the answer names none notified (marco, the plan's author, is), and
    # says whose inbox has it unwoken
    assert [r["principal"] for r in guarded[0]["notify"]] == [MARCO], guarded
    assert guarded[0]["deliveredUnwoken"] == [SCOUT], guarded
    assert all("deliveredUnwoken" not in a for a in answers if not a.get("loopGuard"))
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


async def test_agents_comments_in_different_threads_of_an_item_are_no_run(
        embedded: Embedded, person: Any, tools: Any) -> None:
    """marco asks scout one question and builder another on his plan; each agent answers its
    own, the other chimes in there, and they talk among the plan's comments: six agents'
    comments in a row on the item, but no conversation holds more than two, so none is held
    (the seed's guard counts per conversation, as mail counts per thread). Within one thread
    the run still counts: past 3 there an agent's reply is held; and a rebuild agrees."""
    embedded.forge.set_permission(VAULT, "builder-bot", "write")
    plan = await make_item(embedded, person("marco"), "plan", "Cache plan")
    base = {"targetType": "plan", "target": plan}
    marco = tools(MARCO)
    q1 = (await marco("add_comment", **base, body="TTL?", needsReply=True,
                      to=["agent:scout"]))["comment"]["id"]
    q2 = (await marco("add_comment", **base, body="Size?", needsReply=True,
                      to=["agent:builder"]))["comment"]["id"]
    said = [await tools(SCOUT)("add_comment", **base, parent=q1, body="60s"),
            await tools(BUILDER)("add_comment", **base, parent=q1, body="or 30s"),
            await tools(BUILDER)("add_comment", **base, parent=q2, body="1 GB"),
            await tools(SCOUT)("add_comment", **base, parent=q2, body="fits"),
            await tools(SCOUT)("add_comment", **base, body="shall we?", to=["agent:builder"]),
            await tools(BUILDER)("add_comment", **base, body="yes", to=["agent:scout"])]
    assert [a.get("loopGuard") for a in said] == [None] * 6, said
    # one thread's own run: marco's question, then five agents' replies: the fifth is held
    for n, speaker in enumerate([SCOUT, BUILDER, SCOUT]):
        said.append(await tools(speaker)("add_comment", **base, parent=q1, body=f"more {n}"))
    assert [bool(a.get("loopGuard")) for a in said] == [False] * 8 + [True], said
    ledgered = await events(embedded, "comment.loop_guard")
    assert [(e.data["thread"], e.data["hops"]) for e in ledgered] == [(q1, 4)]
    ids = [a["comment"]["id"] for a in said]
    store = embedded.services.store
    await _drop_work(embedded)
    await _reindex(embedded)
    rebuilt = await db.comments_by_ids(store, ids)
    assert [bool(rebuilt[i].data.get("loopGuard")) for i in ids] == [False] * 8 + [True]


async def test_agents_replying_in_one_thread_at_once_are_each_counted(
        embedded: Embedded, person: Any, tools: Any) -> None:
    """Three agents' comments in a row in scout's thread on a plan, then four more sent at
    once: each read the run before any of the others was recorded (3), so all four went
    unheld. The run is read and the comment recorded one at a time in a thread: 3, then held
    at 4, 5 and 6."""
    embedded.forge.set_permission(VAULT, "builder-bot", "write")
    plan = await make_item(embedded, person("marco"), "plan", "Cache plan")
    base = {"targetType": "plan", "target": plan}
    root = (await tools(SCOUT)("add_comment", **base, body="ping",
                               to=["agent:builder"]))["comment"]["id"]
    for speaker in (BUILDER, SCOUT):
        await tools(speaker)("add_comment", **base, parent=root, body="pong")
    burst = await asyncio.gather(*(tools(s)("add_comment", **base, parent=root, body=f"at once {n}")
                                   for n, s in enumerate([BUILDER, SCOUT, BUILDER, SCOUT])))
    assert sorted(bool(a.get("loopGuard")) for a in burst) == [False, True, True, True], burst
    ledgered = await events(embedded, "comment.loop_guard")
    assert sorted(e.data["hops"] for e in ledgered) == [4, 5, 6]
