"""Fixtures: a started local forge seeded with an org, a webhook receiver, a registered App."""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import jwt
import pytest
from aiohttp import web
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from multidict import CIMultiDict

from localforge import LocalForge

SECRET = "It's a Secret to Everybody"
EVENTS = ["issues", "issue_comment", "label", "repository_dispatch"]


@dataclass
class Keys:
    private_pem: str
    public_pem: str


@pytest.fixture(scope="session")
def keys() -> Keys:
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    private = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                serialization.NoEncryption()).decode()
    public = key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo).decode()
    return Keys(private, public)


@dataclass
class Received:
    headers: dict[str, str]
    body: bytes

    @property
    def event(self) -> str:
        return self.headers["X-GitHub-Event"]

    @property
    def payload(self) -> dict[str, Any]:
        data: dict[str, Any] = json.loads(self.body)
        return data

    @property
    def action(self) -> str | None:
        return self.payload.get("action")


@dataclass
class Hooks:
    url: str = ""
    received: list[Received] = field(default_factory=list)
    status: int = 200
    delay: float = 0.0

    def events(self) -> list[tuple[str, str | None]]:
        return [(r.event, r.action) for r in self.received]

    def clear(self) -> None:
        self.received.clear()


@pytest.fixture
async def hooks() -> AsyncIterator[Hooks]:
    box = Hooks()

    async def receive(request: web.Request) -> web.Response:
        box.received.append(Received(dict(request.headers), await request.read()))
        if box.delay:
            await asyncio.sleep(box.delay)
        return web.Response(status=box.status, text="ok")

    app = web.Application()
    app.router.add_post("/webhook", receive)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    box.url = f"http://127.0.0.1:{port}/webhook"
    yield box
    await runner.cleanup()


@dataclass
class World:
    """The forge seeded with org `acme` (owner `admin`), repo acme/vault (private) and users:
    marco (write), tina (triage), rita (read, org member), olga (outsider), plus an App
    `vaultmail` installed on all of acme's repos."""

    forge: LocalForge
    hooks: Hooks
    keys: Keys
    tokens: dict[str, str]
    app_id: int
    installation_id: int
    session: aiohttp.ClientSession

    @property
    def url(self) -> str:
        return self.forge.url

    def jwt(self, **claims: Any) -> str:
        now = int(time.time())
        payload: dict[str, Any] = {"iat": now - 60, "exp": now + 540, "iss": str(self.app_id)}
        payload.update(claims)
        # PyJWT's encode refuses a numeric iss; sign the raw claims to send one as GitHub allows.
        return jwt.PyJWS().encode(json.dumps(payload).encode(), self.keys.private_pem,
                                  algorithm="RS256")

    async def installation_token(self) -> str:
        status, _, body = await self.call(
            "POST", f"/app/installations/{self.installation_id}/access_tokens",
            auth=f"Bearer {self.jwt()}")
        assert status == 201, body
        token: str = body["token"]
        return token

    async def call(self, method: str, path: str, who: str | None = None,
                   json_body: Any = None, auth: str | None = None,
                   headers: dict[str, str] | None = None,
                   ) -> tuple[int, CIMultiDict[str], Any]:
        h = dict(headers or {})
        if auth is not None:
            h["Authorization"] = auth
        elif who is not None:
            h["Authorization"] = f"token {self.tokens.get(who, who)}"
        url = path if path.startswith("http") else self.url + path
        async with self.session.request(method, url, json=json_body, headers=h) as resp:
            raw = await resp.read()
            body = json.loads(raw) if raw else None
            return resp.status, CIMultiDict(resp.headers), body

    async def idle(self) -> None:
        await self.forge.webhooks_idle()


def verify_signature(secret: str, body: bytes, header: str) -> bool:
    digest = hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()
    return hmac.compare_digest(f"sha256={digest}", header)


async def make_world(forge: LocalForge, hooks: Hooks, keys: Keys,
                     session: aiohttp.ClientSession) -> World:
    tokens = {"admin": forge.add_user("admin")}
    forge.add_org("acme", owner="admin")
    for login in ("marco", "tina", "rita"):
        tokens[login] = forge.add_user(login, email=f"{login}@acme.com")
        forge.add_org_member("acme", login)
    tokens["olga"] = forge.add_user("olga")
    forge.add_repo("acme", "vault")
    forge.set_permission("acme/vault", "marco", "write")
    forge.set_permission("acme/vault", "tina", "triage")
    app_id = forge.register_app(
        slug="vaultmail", name="vaultmail", public_key_pem=keys.public_pem,
        webhook_url=hooks.url, webhook_secret=SECRET, events=EVENTS,
        permissions={"issues": "write", "metadata": "read", "contents": "write",
                     "members": "read"})
    inst = forge.install_app(app_id, "acme")
    await forge.webhooks_idle()
    hooks.clear()
    return World(forge, hooks, keys, tokens, app_id, inst, session)


@pytest.fixture
async def world(hooks: Hooks, keys: Keys) -> AsyncIterator[World]:
    forge = LocalForge()
    await forge.start("127.0.0.1", 0)
    async with aiohttp.ClientSession() as session:
        yield await make_world(forge, hooks, keys, session)
    await forge.stop()
