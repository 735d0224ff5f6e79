"""Fixtures of the conformance suite: a seeded local forge, served over real HTTP, with the app
registered and installed and its webhooks pointed at a small receiver in the test."""

from __future__ import annotations

import asyncio
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

from . import validator

ORG = "acme"
VAULT = "acme/scout-vault"
SECRET = "It's a Secret to Everybody"
OFFICE_YML = "org: acme\nvault_pattern: \"{slug}-vault\"\n"
# The events an App subscribes to; installation and installation_repositories always go and
# are not subscribable on GitHub (they are not in the events enum of performed_via_github_app).
EVENTS = ["issues", "issue_comment", "label"]
PERMISSIONS = {"issues": "write", "metadata": "read", "contents": "read", "members": "read"}


# --------------------------------------------------------------------------------------------
# Figures for the lead


def pytest_terminal_summary(terminalreporter: Any) -> None:
    s = validator.STATS
    if not (s.responses or s.webhooks):
        return
    n_ops = len({o.operation_id for o in validator.rest_operations()})
    terminalreporter.write_sep("-", "conformance")
    terminalreporter.write_line(
        f"conformance: {len(s.operations)}/{n_ops} operations "
        f"({s.responses} responses, {len(s.statuses)} operation/status pairs), "
        f"{s.webhooks} webhook payloads validated ({len(s.webhook_names)} kinds), "
        f"{len(validator.KNOWN_DRIFTS)} known drifts "
        f"(applied: {dict(s.drifts_applied) or 'none'}), "
        f"{len(validator.ALLOWED_EXTRA_KEYS)} allowed extra fields "
        f"(applied: {dict(s.allowances_applied) or 'none'})")
    missing = sorted({o.operation_id for o in validator.rest_operations()} - s.operations)
    if missing and s.responses:
        terminalreporter.write_line(f"conformance: operations not validated: {missing}")


# --------------------------------------------------------------------------------------------
# Keys and the forge


@dataclass(frozen=True)
class AppKey:
    private_pem: bytes
    public_pem: bytes


@pytest.fixture(scope="session")
def app_key() -> AppKey:
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    return AppKey(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                          serialization.NoEncryption()),
        key.public_key().public_bytes(serialization.Encoding.PEM,
                                      serialization.PublicFormat.SubjectPublicKeyInfo),
    )


@dataclass
class Delivery:
    headers: dict[str, str]
    raw: bytes
    payload: dict[str, Any]

    @property
    def event(self) -> str:
        return self.headers.get("X-GitHub-Event", "")

    @property
    def action(self) -> str | None:
        return self.payload.get("action")

    def __repr__(self) -> str:
        return f"<{self.event}.{self.action} {self.headers.get('X-GitHub-Delivery')}>"


class Receiver:
    """The app's webhook endpoint: records every delivery, answers 200."""

    def __init__(self) -> None:
        self.deliveries: list[Delivery] = []
        self.url = ""
        self._runner: web.AppRunner | None = None
        self._arrived = asyncio.Event()

    async def start(self) -> None:
        app = web.Application()
        app.router.add_post("/webhook", self._handle)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        self.url = f"http://127.0.0.1:{port}/webhook"

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    async def _handle(self, request: web.Request) -> web.Response:
        raw = await request.read()
        # Keep the header names as sent (CIMultiDict is case-insensitive for lookups).
        headers = {k: v for k, v in request.headers.items()}
        self.deliveries.append(Delivery(_CI(headers), raw, json.loads(raw)))
        self._arrived.set()
        return web.json_response({"ok": True})

    def take(self) -> list[Delivery]:
        out, self.deliveries = self.deliveries, []
        return out


class _CI(dict):  # type: ignore[type-arg]
    """A dict of headers with case-insensitive get (for readable assertions)."""

    def get(self, key: str, default: Any = None) -> Any:  # type: ignore[override]
        for k, v in self.items():
            if k.lower() == key.lower():
                return v
        return default


@dataclass
class Resp:
    status: int
    headers: Any
    raw: bytes
    url: str

    @property
    def json(self) -> Any:
        return json.loads(self.raw) if self.raw else None


@dataclass
class World:
    """A seeded forge: org acme (owner admin; members marco, sara, scout-bot), team pricing,
    private repos acme/scout-vault and acme/.github (with vaultmail.yml), the app vaultmail
    registered and installed on acme, its webhooks going to `receiver`."""

    forge: Any
    http: aiohttp.ClientSession
    receiver: Receiver
    key: AppKey
    app_id: int
    installation_id: int
    tokens: dict[str, str]
    _inst_token: str | None = None
    exercised: list[tuple[str, int]] = field(default_factory=list)
    version: str = "2022-11-28"  # the REST API version asked for (X-GitHub-Api-Version)

    @property
    def url(self) -> str:
        return str(self.forge.url)

    def jwt(self, **override: Any) -> str:
        now = int(time.time())
        claims = {"iat": now - 60, "exp": now + 540, "iss": str(self.app_id)}
        claims.update(override)
        return jwt.encode(claims, self.key.private_pem, algorithm="RS256")

    async def installation_token(self) -> str:
        if self._inst_token is None:
            r = await self.call("POST", f"/app/installations/{self.installation_id}/access_tokens",
                                auth="jwt", expect=201)
            self._inst_token = r.json["token"]
        return self._inst_token

    async def auth_header(self, auth: str | None) -> dict[str, str]:
        if auth is None:
            return {}
        if auth == "jwt":
            return {"Authorization": f"Bearer {self.jwt()}"}
        if auth == "app":
            return {"Authorization": f"token {await self.installation_token()}"}
        return {"Authorization": f"token {self.tokens[auth]}"}

    async def call(self, method: str, path: str, *, auth: str | None = "app",
                   json_body: Any = None, params: dict[str, str] | None = None,
                   headers: dict[str, str] | None = None, expect: int | None = None,
                   validate: bool = True, data: bytes | None = None) -> Resp:
        """One request over HTTP; the response is held to the description (status documented,
        body, headers) and, with `expect`, must have that status."""
        h = {"Accept": "application/vnd.github+json", "X-GitHub-Api-Version": self.version,
             "User-Agent": "vaultmail-conformance"}
        h.update(await self.auth_header(auth))
        h.update(headers or {})
        url = path if path.startswith("http") else self.url + path
        kwargs: dict[str, Any] = {"headers": h, "params": params}
        if json_body is not None:
            kwargs["json"] = json_body
        elif data is not None:
            kwargs["data"] = data
        async with self.http.request(method, url, **kwargs) as resp:
            raw = await resp.read()
            r = Resp(resp.status, resp.headers, raw, str(resp.url))
        if expect is not None and r.status != expect:
            raise AssertionError(f"{method} {path}: expected {expect}, got {r.status}: "
                                 f"{raw[:500]!r}")
        if validate:
            op = validator.validate_response(method, url, r.status, r.headers, raw,
                                             version=self.version)
            self.exercised.append((op.operation_id, r.status))
        return r

    async def new_issue(self, title: str = "Quarterly numbers", body: str = "Can you look?",
                        labels: list[str] | None = None, auth: str = "app") -> dict[str, Any]:
        payload: dict[str, Any] = {"title": title, "body": body}
        if labels is not None:
            payload["labels"] = labels
        r = await self.call("POST", f"/repos/{VAULT}/issues", auth=auth, json_body=payload,
                            expect=201)
        return r.json  # type: ignore[no-any-return]


async def make_world(key: AppKey, http: aiohttp.ClientSession, receiver: Receiver) -> World:
    from localforge import LocalForge

    forge = LocalForge(dialect="github")
    await forge.start(host="127.0.0.1", port=0)
    tokens = {}
    tokens["admin"] = forge.add_user("admin", email="admin@acme.com", name="Ada Admin")
    tokens["marco"] = forge.add_user("marco", email="marco@acme.com", name="Marco")
    tokens["sara"] = forge.add_user("sara", email="sara@acme.com")
    tokens["scout-bot"] = forge.add_user("scout-bot")
    tokens["outsider"] = forge.add_user("outsider")
    forge.add_org(ORG, owner="admin")
    for login in ("marco", "sara", "scout-bot"):
        forge.add_org_member(ORG, login)
    forge.add_team(ORG, "pricing", ["sara", "marco"])
    forge.add_repo(ORG, "scout-vault")
    forge.add_repo(ORG, ".github")
    forge.set_permission(VAULT, "marco", "write")
    forge.set_permission(VAULT, "scout-bot", "write")
    forge.set_permission(VAULT, "sara", "read")
    forge.put_file(f"{ORG}/.github", "vaultmail.yml", OFFICE_YML)
    app_id = forge.register_app(
        slug="vaultmail", name="vaultmail", public_key_pem=key.public_pem,
        webhook_url=receiver.url, webhook_secret=SECRET, events=EVENTS,
        permissions=PERMISSIONS)
    installation_id = forge.install_app(app_id, ORG)
    await forge.webhooks_idle()
    return World(forge, http, receiver, key, app_id, installation_id, tokens)


@pytest.fixture
async def world(app_key: AppKey) -> AsyncIterator[World]:
    receiver = Receiver()
    await receiver.start()
    async with aiohttp.ClientSession() as http:
        w = await make_world(app_key, http, receiver)
        try:
            yield w
        finally:
            await w.forge.stop()
            await receiver.stop()
