"""The console's live stream (server-sent events) after sign-out, after the person's removal,
across offices, and when a page closes it (issue 21). Over real HTTP: an aiohttp client reads
the stream as a page's EventSource would.

Nothing is timed: a stream either ends (the client reads its end) or sends nothing more; the
test waits on the app's own count of open streams (`Streams.until`), and `asyncio.timeout`
only stops a test that would otherwise hang.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import re
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack
from typing import Any

import aiohttp
import pytest
import yaml

from bot.app.embedded import Embedded
from bot.console import live
from bot.errors import TooManyRequests
from bot.office.config import parse_office
from bot.office.seed import seed_office
from bot.store import api_tokens
from bot.tools.polls import LongPolls
from tests.console.test_console_http import _events, bearer
from tests.items_support import MARCO, SCOUT, TOKEN_TTL, make_item
from tests.support import ToolClient

LEE = "human:lee@acme.com"
WAIT = 30  # seconds: only to stop a hung test; each wait here ends in well under one


async def _stream(http: aiohttp.ClientSession, embedded: Embedded,
                  headers: dict[str, str] | None = None) -> aiohttp.ClientResponse:
    return await http.get(embedded.app_url + "/console/events", headers=headers or {})


async def _first(resp: aiohttp.ClientResponse) -> tuple[dict[str, Any], AsyncIterator[Any]]:
    assert resp.status == 200, await resp.text()
    changes = _events(resp)
    async with asyncio.timeout(WAIT):
        return await anext(changes), changes


async def _rest(changes: AsyncIterator[Any]) -> list[Any]:
    """Every further `change` until the stream ends."""
    async with asyncio.timeout(WAIT):
        return [change async for change in changes]


def _field(html: str, name: str) -> str:
    found = re.search(rf'name="{name}" value="([^"]*)"', html)
    assert found, name
    return found.group(1)


async def test_after_sign_out_the_stream_sends_nothing_more_and_ends(
        embedded: Embedded, person: Any, session: aiohttp.ClientSession) -> None:
    outcome = await make_item(embedded, person("marco"), "outcome", "Auth",
                              assignees=["scout-bot"])
    url = embedded.app_url + "/console"
    async with aiohttp.ClientSession(cookie_jar=aiohttp.CookieJar(unsafe=True)) as browser:
        async with browser.get(url + "/sign-in") as resp:
            page = await resp.text()
        async with browser.post(url + "/sign-in/token", data={
                "csrf": _field(page, "csrf"), "token": embedded.api_tokens[MARCO],
                "next": "/console/inbox"}) as resp:
            csrf = _field(await resp.text(), "csrf")
        async with await _stream(browser, embedded) as resp:
            first, changes = await _first(resp)
            assert first["badge"] == 0
            async with browser.post(url + "/sign-out", data={"csrf": csrf},
                                    allow_redirects=False) as out:
                assert out.status == 303
            # something new for marco wakes the stream: it finds no session, says nothing
            await ToolClient(session, embedded, SCOUT)("add_comment", target=outcome,
                                                       **TOKEN_TTL)
            assert await _rest(changes) == [], "no badge after sign-out"
        async with await _stream(browser, embedded) as resp:
            assert resp.status == 401


async def test_someone_taken_out_of_the_office_is_streamed_nothing_more(
        embedded: Embedded, person: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """Nothing wakes lee's stream after the config drops him: its next heartbeat looks again
    at who it is for, finds no person of the office, and ends it."""
    monkeypatch.setattr(live, "HEARTBEAT", 0.05)  # heartbeats come quickly here
    admin = person("admin")
    async with aiohttp.ClientSession() as http, \
            await _stream(http, embedded, bearer(embedded, LEE)) as resp:
        _, changes = await _first(resp)
        found = await admin.call("GET", "/repos/acme/.github/contents/vaultmail.yml",
                                 expect=200)
        config = yaml.safe_load(base64.b64decode(found["content"]))
        config["humans"] = [h for h in config["humans"] if h["email"] != "lee@acme.com"]
        config["teams"] = {k: [e for e in v if e != "lee@acme.com"]
                           for k, v in (config.get("teams") or {}).items()}
        embedded.forge.put_file("acme/.github", "vaultmail.yml", yaml.safe_dump(config),
                                pusher="admin")
        await embedded.settle()
        assert await _rest(changes) == []


async def test_a_closed_stream_is_let_go_at_once_not_at_its_heartbeat(
        embedded: Embedded, monkeypatch: pytest.MonkeyPatch) -> None:
    """With a heartbeat an hour away, a person opens as many streams as they may, closes them
    all, and opens as many again: each closed one was let go when its page closed it."""
    monkeypatch.setattr(live, "HEARTBEAT", 3600.0)
    streams = embedded.runner.app[live.STREAMS]
    async with aiohttp.ClientSession() as http:
        for _ in range(2):
            async with AsyncExitStack() as pages:
                for _ in range(live.PER_PERSON):
                    resp = await pages.enter_async_context(
                        await _stream(http, embedded, bearer(embedded, MARCO)))
                    await _first(resp)
                async with await _stream(http, embedded, bearer(embedded, MARCO)) as more:
                    assert more.status == 429 and "8 live streams" in await more.text()
            async with asyncio.timeout(WAIT):
                await streams.until("acme", MARCO, 0)


async def _evil_marco(embedded: Embedded) -> dict[str, str]:
    """`evil` declares acme's principal name `human:marco@acme.com` for its own admin: the
    headers of its console's calls as that name."""
    evil = {"org": "evil", "humans": [{"email": "marco@acme.com", "login": "eve",
                                       "permissions": ["mail.send", "editor"]}]}
    seed_office(embedded.forge, parse_office(yaml.safe_dump(evil), "evil.yml", repository=False))
    (app_id,) = embedded.forge.state.apps
    embedded.forge.install_app(int(app_id), "evil")
    await embedded.settle()
    return {"Authorization": "Bearer " + await api_tokens.create_token(
        embedded.services.store, MARCO, "evil")}


async def test_another_offices_streams_of_the_same_principal_take_none_of_the_cap(
        embedded: Embedded) -> None:
    """`evil` declares acme's principal name `human:marco@acme.com` for its own admin: the
    streams its console holds as that name are not acme marco's, nor his theirs."""
    eve = await _evil_marco(embedded)
    async with aiohttp.ClientSession() as http, AsyncExitStack() as pages:
        for _ in range(live.PER_PERSON):
            await _first(await pages.enter_async_context(await _stream(http, embedded, eve)))
        async with await _stream(http, embedded, bearer(embedded, MARCO)) as resp:
            await _first(resp)  # acme's marco is not refused for evil's streams
        async with await _stream(http, embedded, eve) as resp:
            assert resp.status == 429 and "office of evil" in await resp.text()


async def test_streams_closed_a_moment_ago_take_none_of_the_cap(
        embedded: Embedded, monkeypatch: pytest.MonkeyPatch) -> None:
    """A person's pages close their streams and new ones open at once (page views in a row):
    the cap counts the streams still open, not those whose handlers have yet to notice."""
    monkeypatch.setattr(live, "HEARTBEAT", 3600.0)
    async with aiohttp.ClientSession() as http:
        for _ in range(3):
            async with AsyncExitStack() as pages:
                for _ in range(live.PER_PERSON):
                    resp = await pages.enter_async_context(
                        await _stream(http, embedded, bearer(embedded, MARCO)))
                    await _first(resp)
        async with await _stream(http, embedded, bearer(embedded, MARCO)) as resp:
            await _first(resp)


async def test_a_refused_stream_says_when_to_try_again(embedded: Embedded) -> None:
    async with aiohttp.ClientSession() as http, AsyncExitStack() as pages:
        for _ in range(live.PER_PERSON):
            await _first(await pages.enter_async_context(
                await _stream(http, embedded, bearer(embedded, MARCO))))
        async with await _stream(http, embedded, bearer(embedded, MARCO)) as resp:
            assert resp.status == 429
            assert int(resp.headers["Retry-After"]) == live.RETRY_AFTER


async def test_a_head_request_opens_no_stream_and_leaves_its_connection_whole(
        embedded: Embedded) -> None:
    """HEAD /console/events (aiohttp answers a HEAD with the GET route's handler) opened a
    live stream and wrote its events after the headers, though a HEAD response has no body,
    on a connection that stays open for the client's next request: that request's answer
    began with `retry: 3000` (acted out: "Bad status line"), and the stream went on writing
    into the connection at every wake-up. A proxy that keeps its connections to the app for
    everyone's requests hands those bytes to whoever's request comes next on it. HEAD is
    refused now (405), and the connection carries the next request as it should."""
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=1)) as http:
        async with asyncio.timeout(WAIT):
            async with http.head(embedded.app_url + "/console/events",
                                 headers=bearer(embedded, MARCO)) as resp:
                assert resp.status == 405 and resp.headers["Allow"] == "GET"
            async with http.get(embedded.app_url + "/healthz") as resp:  # (the same connection)
                assert resp.status == 200 and (await resp.json())["status"] == "ok"
    assert embedded.runner.app[live.STREAMS].held("acme", MARCO) == 0


def test_an_offices_people_together_hold_at_most_its_share_of_streams() -> None:
    """Each person's cap bounds one person; an office's config may name any number of
    people (each a forge login its admins control), so the office's streams together are
    capped too (as its long polls: `LongPolls.per_office`), and another office's people are
    not counted against it."""
    polls, streams = LongPolls(per_office=3), live.Streams(per_person=2)
    with contextlib.ExitStack() as held:
        for person in ("human:a", "human:a", "human:b"):
            held.enter_context(streams.hold(polls, "evil", person))
        with pytest.raises(TooManyRequests) as refused:
            streams.check(polls, "evil", "human:c")
        assert "the evil office already holds 3" in refused.value.message
        held.enter_context(streams.hold(polls, "acme", "human:a"))  # another office's


async def test_one_offices_streams_leave_another_office_its_share(
        embedded: Embedded, session: aiohttp.ClientSession) -> None:
    """Live streams were capped per person and per office only: six offices of 125 people
    with 8 tabs each held 6,000 streams, whatever the room every office shares. Each stream
    is now a long poll held (`LongPolls`): past the total, an office holding its share gets
    none more, and the office it crowded out still gets its own, stream or `wait`."""
    eve = await _evil_marco(embedded)
    polls = embedded.services.long_polls
    polls.total = 4
    async with aiohttp.ClientSession() as http, AsyncExitStack() as pages:
        for _ in range(4):
            await _first(await pages.enter_async_context(await _stream(http, embedded, eve)))
        await _first(await pages.enter_async_context(
            await _stream(http, embedded, bearer(embedded, MARCO))))  # acme's share: owed
        async with await _stream(http, embedded, eve) as resp:
            assert resp.status == 429, "evil's fifth stream took acme's share"
            text = await resp.text()
            assert "the evil office holds its share (2)" in text, text
            assert int(resp.headers["Retry-After"]) == live.RETRY_AFTER
        scout = ToolClient(session, embedded, SCOUT)
        waiting = asyncio.create_task(scout.raw("list_inbox", {"wait": 40}))
        await polls.until_held("office:acme", 2)  # acme's own `wait`, within its share
        await ToolClient(session, embedded, MARCO)("mail_send", to="scout", subject="Up",
                                                   body="wake")
        assert (await waiting)[0] == 200


# What a browser sends for an image, as Chromium does for `<img src>` on a console page
IMAGE = {"Sec-Fetch-Dest": "image", "Sec-Fetch-Mode": "no-cors", "Sec-Fetch-Site": "same-origin"}


async def test_an_image_of_the_stream_holds_none_of_the_persons_streams(
        embedded: Embedded) -> None:
    """Someone's words on a console page may draw `![](/console/events)`: the reader's browser
    fetched it with their session cookie, and each such image held one of the person's
    PER_PERSON streams as long as the page was open (a few of them, and their own pages were
    refused theirs, 429). A GET of the stream is taken only from a script (`Sec-Fetch-Dest:
    empty`, an EventSource), a page (`document`) or a client that sends none; anything else
    is 403, saying so, and holds nothing."""
    url = embedded.app_url + "/console"
    async with aiohttp.ClientSession(cookie_jar=aiohttp.CookieJar(unsafe=True)) as browser, \
            AsyncExitStack() as images:
        async with browser.get(url + "/sign-in") as resp:
            page = await resp.text()
        async with browser.post(url + "/sign-in/token", data={
                "csrf": _field(page, "csrf"), "token": embedded.api_tokens[MARCO]}) as resp:
            assert resp.status == 200
        for _ in range(live.PER_PERSON):
            resp = await images.enter_async_context(await _stream(browser, embedded, IMAGE))
            assert resp.status == 403, resp.status
            text = await resp.text()
            assert "image" in text and "Sec-Fetch-Dest" in text, text
        assert embedded.runner.app[live.STREAMS].held("acme", MARCO) == 0
        eventsource = {**IMAGE, "Sec-Fetch-Dest": "empty", "Sec-Fetch-Mode": "cors"}
        async with await _stream(browser, embedded, eventsource) as resp:
            first, _ = await _first(resp)  # the page's own stream opens
