"""Live updates in a real browser that do not stop (issue 23): many page views in a row each
get their stream (a closed one takes none of the person's cap), a page refused a stream (429)
shows that it is reconnecting and gets one once the cap has room again (after Retry-After),
and a stream cut by the server (the app restarted) is resumed and the next question arrives.

Nothing is timed: each step waits on what the page shows (Playwright's `expect`)."""

from __future__ import annotations

import re
from contextlib import AsyncExitStack
from pathlib import Path

import aiohttp
import pytest
from playwright.async_api import BrowserContext, Page, expect

from bot.app.embedded import Embedded, start_embedded
from bot.console import live as live_streams
from tests.console.browser import live, sign_in_with_token
from tests.items_support import MARCO, SCOUT, TOKEN_TTL, make_item
from tests.support import Actor, ToolClient

pytestmark = pytest.mark.asyncio(loop_scope="session")

RECONNECTING = re.compile("Live updates interrupted: reconnecting")


async def _a_question_arrives(office: Embedded, page: Page, header: str = "Token TTL") -> None:
    """scout asks marco a question while the page stays open: the card and badge appear."""
    async with aiohttp.ClientSession() as http:
        outcome = await make_item(office, Actor(http, office, "marco"), "outcome", "Auth",
                                  assignees=["scout-bot"])
        await ToolClient(http, office, SCOUT)("add_comment", target=outcome, **TOKEN_TTL)
    await expect(page.locator("article.card").get_by_role("heading", name=header)) \
        .to_be_visible()
    await expect(page.locator("#badge")).to_have_text("1")


async def test_twenty_page_views_in_a_row_still_get_live_updates(
        office: Embedded, context: BrowserContext) -> None:
    page = await context.new_page()
    await sign_in_with_token(page, office, MARCO)
    for n in range(20):  # each page view opens a stream and closes the one before
        path = ("/console/inbox", "/console/mail", "/console/ledger", "/console/agents")[n % 4]
        await page.goto(office.app_url + path)
        await live(page)
    await page.goto(office.app_url + "/console/inbox")
    await live(page)
    await _a_question_arrives(office, page)
    await expect(page.locator("#live-state")).to_be_hidden()


async def test_a_page_refused_a_stream_reconnects_once_there_is_room(
        office: Embedded, context: BrowserContext) -> None:
    """marco holds every stream he may (other tabs); a new page is answered 429 with
    Retry-After: it says it is reconnecting and keeps trying; a tab closes, and it is live."""
    page = await context.new_page()
    await sign_in_with_token(page, office, MARCO)
    await live(page)
    await page.goto("about:blank")
    streams = office.runner.app[live_streams.STREAMS]
    await streams.until("acme", MARCO, 0)
    headers = {"Authorization": f"Bearer {office.api_tokens[MARCO]}"}
    async with aiohttp.ClientSession() as http, AsyncExitStack() as tabs:
        for _ in range(live_streams.PER_PERSON):
            resp = await tabs.enter_async_context(
                await http.get(office.app_url + "/console/events", headers=headers))
            assert resp.status == 200
        async with http.get(office.app_url + "/console/events", headers=headers) as refused:
            assert refused.status == 429 and refused.headers["Retry-After"].isdigit()
        await page.goto(office.app_url + "/console/inbox")
        await expect(page.locator("#live-state")).to_have_text(RECONNECTING)
        await expect(page.locator("body")).to_have_attribute("data-stream", "reconnecting")
    # the tabs are closed: the page's next try, after Retry-After, gets a stream
    await live(page, timeout=30_000)
    await expect(page.locator("#live-state")).to_be_hidden()
    await _a_question_arrives(office, page)


async def test_a_stream_cut_by_the_server_is_resumed_and_the_next_update_arrives(
        context: BrowserContext, tmp_path: Path) -> None:
    """The app restarts under an open page (a deploy): the page says it is reconnecting, and
    once the app is back on its address it listens again and the next question arrives."""
    first = await start_embedded(data_dir=tmp_path, persist_forge=True, port=0, forge_port=0)
    app_port, forge_port = first.runner.addresses[0][1], int(first.forge.url.rsplit(":", 1)[1])
    try:
        page = await context.new_page()
        await sign_in_with_token(page, first, MARCO)
        await live(page)
    finally:
        await first.stop()
    await expect(page.locator("#live-state")).to_have_text(RECONNECTING)
    await expect(page.locator("body")).to_have_attribute("data-stream", "reconnecting")
    again = await start_embedded(data_dir=tmp_path, persist_forge=True, port=app_port,
                                 forge_port=forge_port)
    try:
        await live(page, timeout=60_000)  # its backoff may have grown while the app was away
        await expect(page.locator("#live-state")).to_be_hidden()
        await _a_question_arrives(again, page)
    finally:
        await again.stop()
