"""Fixtures: a real local forge over HTTP, an App with a fresh RSA key, an installed client."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass, replace
from typing import Any

import aiohttp
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa

from bot.forge.github import ForgeClient, ForgeConfig, GitHubForge
from bot.forge.tokens import AppAuth

REPO = "acme/vault"
# Tiny waits so fault tests stay fast; pacing off unless a test turns it on.
FAST = ForgeConfig(
    write_interval=0.0,
    timeout=5.0,
    backoff_base=0.01,
    backoff_max=0.05,
    secondary_wait=0.05,
    max_attempts=4,
    rate_limit_attempts=4,
    bot_login="vaultmail[bot]",
)


@pytest.fixture(scope="session")
def rsa_keys() -> tuple[str, str]:
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    private = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    ).decode()
    public = (
        key.public_key()
        .public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
        .decode()
    )
    return private, public


@pytest.fixture
async def forge() -> AsyncIterator[Any]:
    from localforge import LocalForge

    f = LocalForge(dialect="github")
    await f.start(host="127.0.0.1", port=0)
    try:
        yield f
    finally:
        await f.stop()


@dataclass
class Env:
    forge: Any
    session: aiohttp.ClientSession
    app_id: int
    installation_id: int
    private_pem: str

    def client(self, *, config: ForgeConfig = FAST, clock: Any = "forge", **kw: Any) -> ForgeClient:
        """A fresh client (its own token cache); clock="forge" reckons tokens on forge.clock."""
        auth = AppAuth(
            self.app_id,
            self.private_pem,
            self.forge.url,
            self.session,
            clock=self.forge.clock if clock == "forge" else clock,
        )
        return ForgeClient(auth, self.session, self.forge.url, config=config, **kw)

    def inst(self, **kw: Any) -> GitHubForge:
        return self.client(**kw).installation(self.installation_id)

    def fast_time(self) -> dict[str, Any]:
        """sleep/monotonic that move the forge clock instead of waiting in real time."""

        async def sleep(seconds: float) -> None:
            self.forge.clock.advance(seconds)
            await asyncio.sleep(0)

        return {"sleep": sleep, "monotonic": self.forge.clock.now}

    def records(self, method: str | None = None, suffix: str | None = None) -> list[Any]:
        return [
            r
            for r in self.forge.requests
            if (method is None or r.method == method)
            and (suffix is None or r.path.split("?")[0].endswith(suffix))
        ]


def with_config(**changes: Any) -> ForgeConfig:
    return replace(FAST, **changes)


@pytest.fixture
async def env(forge: Any, rsa_keys: tuple[str, str]) -> AsyncIterator[Env]:
    private, public = rsa_keys
    forge.add_user("admin")
    forge.add_user("marco", email="marco@acme.com")
    forge.add_org("acme", owner="admin")
    forge.add_org_member("acme", "marco")
    forge.add_repo("acme", "vault")
    forge.set_permission(REPO, "marco", "write")
    app_id = forge.register_app(
        slug="vaultmail",
        name="vaultmail",
        public_key_pem=public,
        events=["issues", "issue_comment", "label"],
        permissions={"issues": "write", "contents": "write", "metadata": "read"},
    )
    installation_id = forge.install_app(app_id, "acme")
    async with aiohttp.ClientSession() as session:
        yield Env(forge, session, app_id, installation_id, private)
