"""A long poll does not outlive its caller's right to it: `list_inbox` or `agent_chat` with
`wait` whose token is revoked, or whose principal leaves the office, while it sleeps is
answered 401 at its wake-up, saying why, and shown nothing (acted out: the poll answered the
inbox woken by the new mail, the mail itself in an agent's `inbox`, and marked a person's
unread comments read; a chat's wait answered the agent's answer), over HTTP and over MCP."""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp

from bot.app.embedded import Embedded
from bot.store import api_tokens
from bot.tools.polls import token_key
from tests.items_support import LEE, SARA, SCOUT, make_item
from tests.support import ToolClient
from tests.test_left_the_office import LEE_BLOCK, _without
from tests.test_mcp_sessions import _auth, open_session

BUILDER = "agent:builder"


async def _revoke_all(embedded: Embedded, principal: str) -> None:
    assert await api_tokens.revoke_principal(embedded.services.store, principal, "acme")


async def test_a_poll_whose_token_is_revoked_while_it_waits_is_refused_at_its_wake_up(
        embedded: Embedded, tools: Any) -> None:
    polls, store = embedded.services.long_polls, embedded.services.store
    builder: ToolClient = tools(BUILDER)
    token = await api_tokens.create_token(store, BUILDER, org="acme")
    waiting = asyncio.create_task(builder.raw("list_inbox", {"wait": 40}, token=token))
    await polls.until_held(token_key(token), 1)
    await _revoke_all(embedded, BUILDER)
    await tools(SCOUT)("mail_send", to="builder", subject="Secret plan", body="the numbers")

    status, body = await waiting
    assert status == 401 and body["error"]["code"] == "unauthenticated", body
    assert "revoked" in body["error"]["message"], body
    assert "Secret plan" not in str(body), "a revoked token was shown the mail that woke it"


async def test_an_mcp_poll_whose_token_is_revoked_while_it_waits_is_refused_at_its_wake_up(
        embedded: Embedded, tools: Any, session: aiohttp.ClientSession) -> None:
    polls, store = embedded.services.long_polls, embedded.services.store
    token = await api_tokens.create_token(store, BUILDER, org="acme")
    _, sid, _ = await open_session(session, embedded, token)
    call = {"jsonrpc": "2.0", "id": 2, "method": "tools/call",
            "params": {"name": "list_inbox", "arguments": {"wait": 40}}}

    async def poll() -> str:
        async with session.post(embedded.app_url + "/mcp", json=call,
                                headers=_auth(token, sid)) as resp:
            return await resp.text()

    waiting = asyncio.create_task(poll())
    await polls.until_held(token_key(token), 1)
    await _revoke_all(embedded, BUILDER)
    await tools(SCOUT)("mail_send", to="builder", subject="Secret plan", body="numbers")
    answer = await waiting
    assert "error 401 unauthenticated" in answer, answer
    assert "Secret plan" not in answer, "a revoked token was shown the mail that woke it"


async def test_a_person_whose_token_is_revoked_while_they_wait_has_nothing_marked_read(
        embedded: Embedded, person: Any, tools: Any) -> None:
    polls, store = embedded.services.long_polls, embedded.services.store
    goal = await make_item(embedded, person("sara"), "goal", "EU launch")
    token = await api_tokens.create_token(store, SARA, org="acme")
    waiting = asyncio.create_task(tools(SARA).raw("list_inbox", {"wait": 40}, token=token))
    await polls.until_held(token_key(token), 1)
    await _revoke_all(embedded, SARA)
    await tools(SCOUT)("add_comment", target=goal, targetType="goal", body="Numbers are in",
                       to=["sara@acme.com"])

    status, body = await waiting
    assert status == 401 and "Numbers are in" not in str(body), body
    again = await api_tokens.create_token(store, SARA, org="acme")
    status, body = await tools(SARA).raw("list_inbox", {}, token=again)
    assert [c["body"] for c in body["you"]["unread"]] == ["Numbers are in"], \
        "the refused poll marked the comment read"


async def test_a_chat_wait_whose_token_is_revoked_is_not_told_the_answer(
        embedded: Embedded, tools: Any) -> None:
    store, notifier = embedded.services.store, embedded.services.notifier
    token = await api_tokens.create_token(store, SARA, org="acme")
    told = asyncio.create_task(notifier.wait(SCOUT, 30, org="acme"))  # the chat is kept
    await asyncio.sleep(0)
    waiting = asyncio.create_task(tools(SARA).raw(
        "agent_chat", {"agent": "scout", "message": "the numbers?", "wait": 40}, token=token))
    assert await told
    await _revoke_all(embedded, SARA)
    scout = tools(SCOUT)
    chat = (await scout("list_inbox"))["inbox"]["chats"][0]
    await scout("chat_reply", chat=chat["chat"], message="Q3 is 42")

    status, body = await waiting
    assert status == 401 and "Q3 is 42" not in str(body), body


async def test_a_poll_of_someone_taken_out_of_the_office_while_they_wait_is_refused(
        embedded: Embedded, tools: Any) -> None:
    polls = embedded.services.long_polls
    waiting = asyncio.create_task(tools(LEE).raw("list_inbox", {"wait": 40}))
    await polls.until_held(f"principal:acme/{LEE}", 1)
    embedded.forge.put_file("acme/.github", "vaultmail.yml", _without(LEE_BLOCK),
                            pusher="admin")
    await embedded.settle()
    # a wake-up for every poll (as after another replica's message was missed)
    embedded.services.notifier.wake_everyone()

    status, body = await waiting  # (the config's change revoked lee's tokens)
    assert status == 401 and body["error"]["code"] == "unauthenticated", body
