"""A keyed comment or question on an item (`add_comment` with an idempotencyKey) whose try
stalls with its forge write in flight, taken over by another replica, is on the item once,
indexed once, and the index points at the comment the item keeps."""

from __future__ import annotations

import asyncio
import copy
from typing import Any

import aiohttp
import pytest

from bot.app.embedded import Embedded
from bot.forge.github import GitHubForge
from bot.items.service import Comments, NewComment
from bot.store import comments as db
from bot.store import open_store
from bot.store.db import Store
from bot.store.idempotency import Result
from tests.items_support import MARCO, SCOUT, make_item, where
from tests.support import Actor, ToolClient, until
from tests.test_stalled_send import GUARD, _silence

COMMENT = "POST /repos/{owner}/{repo}/issues/{issue_number}/comments"
EDIT = "PATCH /repos/{owner}/{repo}/issues/comments/{comment_id}"
ASKS = {"comment": False, "question": True}  # needs_reply


@pytest.mark.parametrize("late", ["a", "b"], ids=["the-stalled-one-lands-last",
                                                   "the-retry-lands-last"])
@pytest.mark.parametrize("kind", list(ASKS))
async def test_a_keyed_comment_whose_stalled_create_lands_late_is_on_the_item_once(
        embedded: Embedded, session: aiohttp.ClientSession, database_url: str, kind: str,
        late: str) -> None:
    """scout's keyed comment (or question) on marco's outcome is tried by replica a, whose
    comment create is held at the forge; a stalls past DEAD_AFTER and b, the retry, takes the
    key over. Either a's create lands after b's (`late` "a"), or b looked before a's landed
    and its own lands last ("b"). One comment stays on the item, the first; the index, its
    ledger entry and marco's inbox hold the comment once, and point at the one kept."""
    marco = Actor(session, embedded, "marco")
    target = await make_item(embedded, marco, "outcome", "Faster checkout")
    repo, number = where(target)
    services = embedded.services
    forge = services.forge_for_org("acme")
    assert isinstance(forge, GitHubForge)
    index = database_url or str(embedded.data_dir / "index.sqlite3")
    a, b = await open_store(index), await open_store(index)
    await a.join("replica-a")
    await b.join("replica-b")

    async def add(store: Store, its_forge: GitHubForge) -> Result:
        replica = copy.copy(services)  # another replica: its own store, its own forge client
        replica.store = store
        comments = Comments(replica, its_forge, embedded.office)

        async def work() -> Result:
            item = await comments.load_item(repo, number)
            return await comments.add(SCOUT, item, NewComment(
                body="Started on it.", to=["marco@acme.com"], needs_reply=ASKS[kind], key="c1"))
        return await store.once(f"tool:add_comment:acme:{SCOUT}", "c1", "fp", work)

    async def on_item() -> list[dict[str, Any]]:
        return [c for c in await marco.comments(repo, number) if "Started on it." in c["body"]]

    async def landed() -> bool:  # a's create, let go, has reached the item
        return len(await on_item()) == 1

    try:
        held = embedded.forge.faults.hold(COMMENT, count=1)
        first = asyncio.create_task(add(a, forge))
        await asyncio.wait_for(held.arrived.wait(), GUARD)  # a's create is at the forge
        await _silence(b, "replica-a")
        retry = GitHubForge(forge.client, forge.installation_id)
        if late == "a":
            retried = await asyncio.wait_for(add(b, retry), GUARD)
            held.release()  # a's create lands now, after b's
        else:
            held_b = embedded.forge.faults.hold(COMMENT, count=1)
            second = asyncio.create_task(add(b, retry))
            await asyncio.wait_for(held_b.arrived.wait(), GUARD)  # b looked, and writes
            held.release()  # a's lands first
            await until(landed, GUARD)
            held_b.release()  # b's lands after it
            retried = await asyncio.wait_for(second, GUARD)
        answered = (await asyncio.wait_for(asyncio.gather(first, return_exceptions=True),
                                           GUARD))[0]
    finally:
        await a.close()
        await b.close()
    await embedded.settle()
    kept = await on_item()
    assert len(kept) == 1, [c["id"] for c in kept]
    assert answered == retried, "both tries answer the one comment"
    row = await db.get_comment(services.store, retried["comment"]["id"])
    assert row is not None
    thread = await db.get_thread(services.store, row.thread)
    assert thread is not None
    pointed = thread.card_id if kind == "question" else row.forge_id
    assert pointed == kept[0]["id"], "the index points at a comment the item no longer has"
    assert len(await embedded.ledger_events("comment.added")) == 1
    unread = await db.unread_in(services.store, MARCO, ["you"], org="acme")
    assert [d["comment"] for d in unread] == [row.id]


async def test_a_card_posted_again_by_a_stalled_answer_is_on_the_item_once(
        embedded: Embedded, session: aiohttp.ClientSession, database_url: str) -> None:
    """Someone deleted scout's question card; marco's keyed answer posts it again (its edit
    finds the card gone). Replica a's try is held with that card's create in flight, stalls
    past DEAD_AFTER, and b, the retry, takes the key over and posts the card itself; a's then
    lands: one card stays, and the thread points at it."""
    marco, admin = Actor(session, embedded, "marco"), Actor(session, embedded, "admin")
    target = await make_item(embedded, marco, "outcome", "Token TTL")
    repo, number = where(target)
    scout = ToolClient(session, embedded, SCOUT)
    asked = (await scout("add_comment", targetType="outcome", target=target, header="TTL",
                         body="How long?", options=[{"label": "30 days"}, {"label": "7 days"}],
                         to=["marco@acme.com"]))["comment"]["id"]
    [card] = [c for c in await admin.comments(repo, number) if "kind=question" in c["body"]]
    await admin.call("DELETE", f"/repos/{repo}/issues/comments/{card['id']}", expect=204)
    await embedded.settle()
    services = embedded.services
    forge = services.forge_for_org("acme")
    assert isinstance(forge, GitHubForge)
    index = database_url or str(embedded.data_dir / "index.sqlite3")
    a, b = await open_store(index), await open_store(index)
    await a.join("replica-a")
    await b.join("replica-b")

    async def answer(store: Store, its_forge: GitHubForge) -> Result:
        replica = copy.copy(services)
        replica.store = store
        comments = Comments(replica, its_forge, embedded.office)

        async def work() -> Result:
            item = await comments.load_item(repo, number)
            return await comments.add(MARCO, item, NewComment(parent=asked, option=1,
                                                              key="a1"))
        return await store.once(f"tool:add_comment:acme:{MARCO}", "a1", "fp", work)

    try:
        edit = embedded.forge.faults.hold(EDIT, count=1)
        first = asyncio.create_task(answer(a, forge))
        await asyncio.wait_for(edit.arrived.wait(), GUARD)  # a's answer is on the item
        held = embedded.forge.faults.hold(COMMENT, count=1)
        edit.release()  # the card is gone: a posts it again, held at the forge
        await asyncio.wait_for(held.arrived.wait(), GUARD)
        await _silence(b, "replica-a")
        retried = await asyncio.wait_for(
            answer(b, GitHubForge(forge.client, forge.installation_id)), GUARD)
        held.release()  # a's card lands now, after b's
        answered = (await asyncio.wait_for(asyncio.gather(first, return_exceptions=True),
                                           GUARD))[0]
    finally:
        await a.close()
        await b.close()
    await embedded.settle()
    cards = [c for c in await admin.comments(repo, number) if "kind=question" in c["body"]]
    assert len(cards) == 1, [c["id"] for c in cards]
    assert answered == retried
    thread = await db.get_thread(services.store, asked)
    assert thread is not None and thread.card_id == cards[0]["id"]
