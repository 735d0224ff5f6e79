from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest

from bot.app.embedded import Embedded, start_embedded
from tests.support import Actor, ToolClient


@pytest.fixture
async def embedded(tmp_path: Path) -> AsyncIterator[Embedded]:
    """The embedded default (`vaultmail up`) on free loopback ports, with the example office."""
    emb = await start_embedded(data_dir=tmp_path, port=0, forge_port=0)
    try:
        yield emb
        # the app paces itself under GitHub's secondary limits: the forge refused it nothing
        # (faults a test injects are not counted here)
        assert not emb.forge.rates.refused, f"secondary limits hit: {emb.forge.rates.refused}"
    finally:
        await emb.stop()


@pytest.fixture
async def session() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as s:
        yield s


@pytest.fixture
def person(embedded: Embedded, session: aiohttp.ClientSession):  # type: ignore[no-untyped-def]
    return lambda login: Actor(session, embedded, login)


@pytest.fixture
def tools(embedded: Embedded, session: aiohttp.ClientSession):  # type: ignore[no-untyped-def]
    return lambda principal: ToolClient(session, embedded, principal)
