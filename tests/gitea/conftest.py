"""Fixtures for the Gitea dialect: a seeded local Gitea forge with the bot's org webhook
pointed at a receiver that records every delivery, and the embedded office on Gitea."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from bot.app.embedded import Embedded, start_embedded
from bot.office.config import load_office
from bot.office.seed import seed_office
from localforge import LocalForge
from localforge.gitea.seed import add_bot

SECRET = "It's a Secret to Everybody"


@dataclass
class Received:
    headers: dict[str, str]
    body: bytes
    payload: dict[str, Any]


@dataclass
class GiteaSetup:
    forge: LocalForge
    tokens: dict[str, str]
    bot_token: str
    received: list[Received] = field(default_factory=list)

    @property
    def api(self) -> str:
        return self.forge.url + "/api/v1"

    async def call(self, session: aiohttp.ClientSession, who: str, method: str, path: str,
                   json: Any = None, expect: int | None = None,
                   scheme: str = "token") -> tuple[int, Any, Any]:
        token = self.bot_token if who == "vaultmail" else self.tokens[who]
        headers = {"Authorization": f"{scheme} {token}"}
        async with session.request(method, self.api + path, json=json,
                                   headers=headers) as resp:
            body = await resp.json(content_type=None) if resp.status != 204 else None
            if expect is not None:
                assert resp.status == expect, (method, path, resp.status, body)
            return resp.status, body, resp.headers

    async def deliveries(self) -> list[Received]:
        await self.forge.webhooks_idle()
        return self.received


@pytest.fixture
async def gitea() -> AsyncIterator[GiteaSetup]:
    received: list[Received] = []

    async def hook(request: web.Request) -> web.Response:
        body = await request.read()
        received.append(Received(dict(request.headers), body, await request.json()))
        return web.Response(status=200)

    app = web.Application()
    app.router.add_post("/hook", hook)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    forge = LocalForge(dialect="gitea")
    await forge.start(port=0)
    tokens = seed_office(forge, load_office(None))
    bot, _ = add_bot(forge, "acme", "vaultmail", f"http://127.0.0.1:{port}/hook", SECRET)
    try:
        yield GiteaSetup(forge, tokens, bot, received)
    finally:
        await forge.stop()
        await runner.cleanup()


@pytest.fixture
async def session() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as s:
        yield s


@pytest.fixture
async def office(tmp_path: Path) -> AsyncIterator[Embedded]:
    """`vaultmail up --forge gitea` in-process, on free loopback ports."""
    emb = await start_embedded(data_dir=tmp_path, port=0, forge_port=0, dialect="gitea")
    try:
        yield emb
    finally:
        await emb.stop()
