"""The browser tests' fixtures: one Chromium for the whole session, a fresh context (cookies,
viewport) and a fresh embedded office per test, all on the session's event loop; a screenshot
in `test-artifacts/` of every page of a test that fails."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
from playwright.async_api import Browser, BrowserContext, async_playwright

from bot.app.embedded import Embedded, start_embedded
from tests import needs
from tests.console.browser import ARGS, ARTIFACTS, CHROMIUM


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[Any]:
    report = yield
    if report.when == "call":
        item.stash[FAILED] = report.failed
    return report


FAILED = pytest.StashKey[bool]()


@pytest_asyncio.fixture(scope="session", loop_scope="session")
async def browser() -> AsyncIterator[Browser]:
    try:
        needs.chromium(CHROMIUM)
    except needs.Missing as exc:
        pytest.fail(str(exc), pytrace=False)
    async with async_playwright() as playwright:
        chromium = await playwright.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        yield chromium
        await chromium.close()


@pytest_asyncio.fixture(loop_scope="session")
async def office(tmp_path: Path) -> AsyncIterator[Embedded]:
    """The embedded default (`vaultmail up`), on the session's loop like the browser."""
    emb = await start_embedded(data_dir=tmp_path, port=0, forge_port=0)
    try:
        yield emb
    finally:
        await emb.stop()


@pytest_asyncio.fixture(loop_scope="session")
async def context(browser: Browser, request: pytest.FixtureRequest) -> AsyncIterator[
        BrowserContext]:
    # bypass_csp: only so that the test can inject the vendored axe-core into the pages
    ctx = await browser.new_context(bypass_csp=True, viewport={"width": 1280, "height": 900})
    ctx.set_default_timeout(15_000)
    try:
        yield ctx
    finally:
        if request.node.stash.get(FAILED, True):
            ARTIFACTS.mkdir(exist_ok=True)
            for i, open_page in enumerate(ctx.pages):
                await open_page.screenshot(
                    path=str(ARTIFACTS / f"{request.node.name}-{i}.png"), full_page=True)
        await ctx.close()
