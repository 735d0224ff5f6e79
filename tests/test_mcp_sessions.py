"""MCP sessions are capped per API token and per principal in its office (issue 21): one token
opened 145 sessions a second against the SDK's one cap for everyone (10,000), which would have
locked every client out until its sessions idled out (30 minutes).

A key at its cap ends its own least recently used idle session to make room; only when all of
them are busy is the next refused (429), and only for that key. Over real HTTP, with raw
JSON-RPC; the idle expiry with a clock the test moves (nothing is timed).
"""

from __future__ import annotations

import contextlib
from contextlib import AsyncExitStack

import aiohttp
import pytest

from bot.app.embedded import Embedded
from bot.errors import TooManyRequests
from bot.store import api_tokens
from bot.tools.mcp_server import MANAGER_KEY
from bot.tools.polls import (
    PER_TOKEN_SESSIONS,
    SESSION_IDLE,
    LongPolls,
    Sessions,
    session_keys,
)
from bot.tools.polls import token_key as key_of

BUILDER, SCOUT = "agent:builder", "agent:scout"
VERSION = "2025-06-18"
INITIALIZE = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
    "protocolVersion": VERSION, "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}}
ACCEPT = {"Accept": "application/json, text/event-stream"}


def _auth(token: str, session_id: str | None = None) -> dict[str, str]:
    headers = {**ACCEPT, "Authorization": f"Bearer {token}"}
    if session_id is not None:
        headers |= {"Mcp-Session-Id": session_id, "MCP-Protocol-Version": VERSION}
    return headers


async def open_session(http: aiohttp.ClientSession, embedded: Embedded,
                       token: str) -> tuple[int, str | None, str]:
    """initialize, then `notifications/initialized`: (status, session id, body)."""
    async with http.post(embedded.app_url + "/mcp", json=INITIALIZE,
                         headers=_auth(token)) as resp:
        status, sid, body = resp.status, resp.headers.get("Mcp-Session-Id"), await resp.text()
    if sid is not None:
        async with http.post(embedded.app_url + "/mcp", headers=_auth(token, sid), json={
                "jsonrpc": "2.0", "method": "notifications/initialized"}) as resp:
            assert resp.status == 202, await resp.text()
    return status, sid, body


async def ping(http: aiohttp.ClientSession, embedded: Embedded, token: str,
               session_id: str) -> int:
    async with http.post(embedded.app_url + "/mcp", headers=_auth(token, session_id),
                         json={"jsonrpc": "2.0", "id": 2, "method": "ping"}) as resp:
        await resp.read()
        return resp.status


async def test_one_token_cannot_use_up_the_sessions_of_everyone(
        embedded: Embedded, session: aiohttp.ClientSession) -> None:
    """With room for 40 sessions in all, a token opens 100: each opens, at the price of its own
    oldest; the last 32 live; another token still connects."""
    embedded.runner.app[MANAGER_KEY].max_sessions = PER_TOKEN_SESSIONS + 8
    builder = embedded.api_tokens[BUILDER]
    opened = []
    for _ in range(100):
        status, sid, body = await open_session(session, embedded, builder)
        assert status == 200 and sid is not None, body
        opened.append(sid)
    live = [sid for sid in opened if await ping(session, embedded, builder, sid) == 200]
    assert live == opened[-PER_TOKEN_SESSIONS:], "the oldest were ended to make room"

    status, sid, body = await open_session(session, embedded, embedded.api_tokens[SCOUT])
    assert status == 200 and sid is not None, body


async def test_a_head_request_leaves_its_connection_whole(embedded: Embedded) -> None:
    """HEAD /mcp with a token reached the SDK, whose 405 answer the bridge wrote body and all
    (82 bytes of JSON-RPC error), though a HEAD answer has no body, on a connection kept open
    for the client's next request: that request's answer began with `{"jsonrpc"` (aiohttp's
    client: "Bad status line"). Behind a proxy that reuses its connections to the app for
    everyone's requests, whoever's request came next on it got those bytes. The status and
    headers are still the SDK's; the body is not written."""
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=1)) as http:
        async with http.head(embedded.app_url + "/mcp",
                             headers=_auth(embedded.api_tokens[SCOUT])) as resp:
            assert resp.status == 405
        async with http.get(embedded.app_url + "/healthz") as resp:  # (the same connection)
            assert resp.status == 200 and (await resp.json())["status"] == "ok"


async def test_a_second_token_of_the_principal_shares_its_cap(
        embedded: Embedded, session: aiohttp.ClientSession) -> None:
    """More tokens for one principal buy no more sessions: they count in its office too."""
    first = embedded.api_tokens[BUILDER]
    second = await api_tokens.create_token(embedded.services.store, BUILDER)
    opened = [(await open_session(session, embedded, first))[1]
              for _ in range(PER_TOKEN_SESSIONS)]
    status, sid, _ = await open_session(session, embedded, second)
    assert status == 200 and sid is not None
    assert await ping(session, embedded, first, str(opened[0])) == 404, "its oldest ended"
    assert await ping(session, embedded, second, sid) == 200
    assert await ping(session, embedded, first, str(opened[1])) == 200


async def test_when_all_its_sessions_are_busy_only_that_token_is_refused(
        embedded: Embedded, session: aiohttp.ClientSession) -> None:
    """Each session holding an open stream (GET /mcp) is busy: the next is refused with why;
    ending one (DELETE) makes room again, and another token connects all along."""
    builder = embedded.api_tokens[BUILDER]
    async with AsyncExitStack() as streams:
        opened = []
        for _ in range(PER_TOKEN_SESSIONS):
            _, sid, _ = await open_session(session, embedded, builder)
            assert sid is not None
            stream = await streams.enter_async_context(session.get(
                embedded.app_url + "/mcp", headers=_auth(builder, sid)))
            assert stream.status == 200 and "event-stream" in stream.headers["Content-Type"]
            opened.append(sid)

        status, sid, body = await open_session(session, embedded, builder)
        assert status == 429 and sid is None, body
        assert f"{PER_TOKEN_SESSIONS} MCP sessions are open for this API token" in body
        assert "too_many_sessions" in body and "DELETE /mcp" in body

        status, sid, _ = await open_session(session, embedded, embedded.api_tokens[SCOUT])
        assert status == 200 and sid is not None, "another token is not refused"

        async with session.delete(embedded.app_url + "/mcp",
                                  headers=_auth(builder, opened[0])) as resp:
            assert resp.status == 200
        status, sid, body = await open_session(session, embedded, builder)
        assert status == 200 and sid is not None, body


# -- the bookkeeping alone, with a clock the test moves ------------------------------------------


class Clock:
    def __init__(self) -> None:
        self.t = 1_000.0

    def __call__(self) -> float:
        return self.t


def test_a_session_unused_for_the_idle_time_is_ended_at_the_next_opening() -> None:
    clock = Clock()
    sessions = Sessions(per_key=2, clock=clock)
    a, b = session_keys("a", "agent:a", "acme"), session_keys("b", "agent:b", "acme")
    ticket, ending = sessions.admit(a, "agent:a")
    sessions.opened(ticket, "s1")
    clock.t += SESSION_IDLE - 1
    with sessions.using("s1", a):
        clock.t += 10  # busy past its idle time: not idle
    ticket, ending = sessions.admit(b, "agent:b")
    sessions.opened(ticket, "s2")
    assert ending == []
    clock.t += SESSION_IDLE
    ticket, ending = sessions.admit(b, "agent:b")
    assert ending == [("s1", "agent:a"), ("s2", "agent:b")], "every key's, oldest first"
    assert sessions.held(a[0]) == 0


def test_least_recently_used_idle_first_and_a_refusal_changes_nothing() -> None:
    clock = Clock()
    sessions = Sessions(per_key=2, clock=clock)
    keys = session_keys(key_of("vm_x"), "agent:a", None)
    for sid in ("s1", "s2"):
        ticket, _ = sessions.admit(keys, "agent:a")
        sessions.opened(ticket, sid)
        clock.t += 1
    with sessions.using("s1", keys):
        clock.t += 1
    assert sessions.admit(keys, "agent:a")[1] == [("s2", "agent:a")], "s1 was used since"

    busy = [sessions.admit(keys, "agent:a")[0]]  # with the one above: two opening, busy
    with pytest.raises(TooManyRequests) as refused:
        sessions.admit(keys, "agent:a")
    assert refused.value.code == "too_many_sessions" and refused.value.status == 429
    assert "2 MCP sessions are open for this API token" in refused.value.message
    assert sessions.held(keys[0]) == 2 and busy


def test_an_office_at_its_cap_ends_its_own_oldest_idle_session_never_another_offices() -> None:
    """However many principals an office's config names (each with its own cap), the office
    holds at most `per_office` of the sessions every office shares: its next one ends its own
    least recently used idle session, and another office's opening ends nothing of it."""
    clock = Clock()
    sessions = Sessions(per_key=5, per_office=3, clock=clock)
    evil = [session_keys(f"e{n}", f"agent:e{n}", "evil") for n in range(4)]
    for n, keys in enumerate(evil[:3]):
        ticket, ending = sessions.admit(keys, keys[-1])
        sessions.opened(ticket, f"evil{n}")
        assert ending == []
        clock.t += 1
    ticket, ending = sessions.admit(evil[3], evil[3][-1])  # a fourth principal of evil's
    sessions.opened(ticket, "evil3")
    assert ending == [("evil0", evil[0][-1])], "its own oldest idle one"
    acme = session_keys("a", "agent:a", "acme")
    ticket, ending = sessions.admit(acme, acme[-1])
    assert ending == [] and sessions.held(acme[1]) == 1
    with contextlib.ExitStack() as streams:  # each of evil's with a stream open: busy, kept
        for sid, keys in (("evil1", evil[1]), ("evil2", evil[2]), ("evil3", evil[3])):
            streams.enter_context(sessions.using(sid, keys))
        with pytest.raises(TooManyRequests) as refused:
            sessions.admit(evil[0], evil[0][-1])
    assert "3 MCP sessions are open for the evil office" in refused.value.message
    assert sessions.admit(session_keys("b", "agent:b", "acme"), "agent:b")[1] == []


def test_when_every_offices_sessions_fill_the_room_the_biggest_office_gives_way() -> None:
    """Each office's cap bounds one office; five free GitHub orgs at their caps filled the
    room the MCP SDK keeps for every office. With the room full, a session of the office
    holding the most ends (its least recently used, idle first, busy if none is) for an
    office holding fewer; the biggest office itself, or one as big, is refused."""
    clock = Clock()
    sessions = Sessions(per_key=10, per_office=10, total=5, clock=clock)
    evil = [session_keys(f"e{n}", f"agent:e{n}", "evil") for n in range(4)]
    with contextlib.ExitStack() as streams:  # each of evil's with a stream open: busy
        for n, keys in enumerate(evil):
            ticket, _ = sessions.admit(keys, keys[-1])
            sessions.opened(ticket, f"evil{n}")
            streams.enter_context(sessions.using(f"evil{n}", keys))
            clock.t += 1
        acme = session_keys("a", "agent:a", "acme")
        ticket, ending = sessions.admit(acme, acme[-1])  # the fifth: room for it
        sessions.opened(ticket, "acme0")
        assert ending == []
        ticket, ending = sessions.admit(acme, acme[-1])  # acme 2 against evil's 4
        sessions.opened(ticket, "acme1")
        assert ending == [("evil0", evil[0][-1])], "evil's oldest, busy as it is"
        with pytest.raises(TooManyRequests) as refused:
            sessions.admit(evil[0], evil[0][-1])  # evil holds the most: it waits
        assert "keeps 5 MCP sessions at most" in refused.value.message
        assert refused.value.code == "too_many_sessions"
        globex = session_keys("g", "agent:g", "globex")
        ticket, ending = sessions.admit(globex, globex[-1])
        assert ending == [("evil1", evil[1][-1])]


def test_long_polls_past_the_total_go_to_offices_below_their_share() -> None:
    """Each office's cap bounds one office; with every office's polls together at `total`,
    only an office holding less than its share gets one more."""
    polls = LongPolls(per_token=10, per_principal=10, per_office=10, total=4)
    wait = {"wait": 30}
    with contextlib.ExitStack() as held:
        for n in range(4):
            held.enter_context(polls.hold(f"e{n}", "list_inbox", wait, ("evil", f"agent:e{n}")))
        for _ in range(2):  # two offices holding: acme's share is 2
            held.enter_context(polls.hold("a", "list_inbox", wait, ("acme", "agent:a")))
        with pytest.raises(TooManyRequests) as refused:
            polls.hold("a", "list_inbox", wait, ("acme", "agent:a")).__enter__()
        assert "the acme office holds its share (2)" in refused.value.message
        with pytest.raises(TooManyRequests):
            polls.hold("e9", "list_inbox", wait, ("evil", "agent:e9")).__enter__()
        # a third office: its share is 2 of the 4
        held.enter_context(polls.hold("g", "list_inbox", wait, ("globex", "agent:g")))
        assert polls.held("office:globex") == 1 and polls.held("office:evil") == 4
    assert polls.held("all") == 0


def test_another_principals_requests_neither_use_nor_end_a_session() -> None:
    sessions = Sessions(per_key=1, clock=Clock())
    mine, theirs = session_keys("m", "agent:a", "acme"), session_keys("t", "agent:b", "acme")
    ticket, _ = sessions.admit(mine, "agent:a")
    sessions.opened(ticket, "s1")
    with sessions.using("s1", theirs):
        pass
    sessions.gone("s1", theirs)
    assert sessions.held(mine[1]) == 1
    with sessions.using("s1", mine), pytest.raises(TooManyRequests):
        sessions.admit(mine, "agent:a")
    sessions.gone("s1", mine)
    assert sessions.held(mine[1]) == 0
