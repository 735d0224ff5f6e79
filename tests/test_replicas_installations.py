"""An org installs the App while two replicas run on one PostgreSQL: GitHub's
`installation.created` reaches one of them (a), and the other (b) serves the new office as
well, at once, without a restart. Before, b's in-memory installations only ever narrowed to
what the index showed installed: b refused the new org's people at sign-in ("not one of the
office's people") until it restarted, while a served them."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import pytest
import yaml

from bot.app.replicas import Replica
from bot.console.signin import CALLBACK
from bot.office.config import load_office
from bot.office.seed import seed_office
from bot.office.source import CONFIG_PATH, CONFIG_REPO
from bot.store import api_tokens, installations, open_store
from localforge import LocalForge
from tests import pg
from tests.app.test_installations import GLOBEX
from tests.deployed import deploy
from tests.support import free_port, until

GUARD = 90.0  # a hang guard, never a synchronisation


@dataclass
class Two:
    forge: LocalForge
    app_id: int
    a: Replica  # the one the forge's webhooks reach
    b: Replica
    database_url: str


@pytest.fixture
async def two(tmp_path: Path) -> AsyncIterator[Two]:
    ports = [free_port() for _ in range(2)]
    urls = [f"http://127.0.0.1:{p}" for p in ports]
    deployed = await deploy(f"{urls[0]}/webhook")  # (no balancer: every webhook to a)
    forge = deployed.forge
    forge.set_callback_urls(deployed.app_id, [u + CALLBACK for u in urls])
    client_id, client_secret = forge.client_credentials(deployed.app_id)
    database_url = await pg.fresh_database()
    env = {**deployed.env(str(tmp_path / "data")), "DATABASE_URL": database_url,
           "GITHUB_CLIENT_ID": client_id, "GITHUB_CLIENT_SECRET": client_secret}
    a, b = (Replica(f"replica-{n + 1}", url,
                    {**env, "PORT": str(port), "REPLICA_ID": f"replica-{n + 1}"},
                    tmp_path / f"replica-{n + 1}.log")
            for n, (port, url) in enumerate(zip(ports, urls, strict=True)))
    deployed.install()
    try:
        await asyncio.gather(a.start(), b.start())
        yield Two(forge, deployed.app_id, a, b, database_url)
    finally:
        await asyncio.gather(a.kill(), b.kill())
        await forge.stop()
        await pg.drop_database(database_url)


async def _installed_in_index(database_url: str, org: str) -> None:
    """Until the replica that heard the installation has written it in the shared index."""
    store = await open_store(database_url)

    async def written() -> bool:
        return org in await installations.live_orgs(store)

    try:
        await until(written, timeout=GUARD)
    finally:
        await store.close()


async def _sign_in(replica: Replica, forge: LocalForge, login: str) -> str:
    """`login` signs in with the forge on `replica`'s console: the page it lands on."""
    async with aiohttp.ClientSession(cookie_jar=aiohttp.CookieJar(unsafe=True)) as browser:
        async with browser.get(replica.url + "/console/sign-in/forge",
                               allow_redirects=False) as resp:
            authorize = resp.headers["Location"]
        async with browser.get(authorize, allow_redirects=False, headers={
                "Authorization": f"token {forge.user_token(login)}"}) as resp:
            back = resp.headers["Location"]
        async with browser.get(back) as resp:
            return f"{resp.status} {await resp.text()}"


async def test_an_org_installed_through_one_replica_is_served_by_the_other(
        two: Two, tmp_path: Path) -> None:
    forge = two.forge
    path = tmp_path / "globex.yml"
    path.write_text(GLOBEX)
    seed_office(forge, load_office(path))
    forge.put_file(f"globex/{CONFIG_REPO}", CONFIG_PATH, yaml.safe_dump(yaml.safe_load(GLOBEX)))
    forge.state.web.authorizations.setdefault("amy", []).append(two.app_id)
    forge.install_app(two.app_id, "globex")  # installation.created: to a only
    await forge.webhooks_idle()
    await _installed_in_index(two.database_url, "globex")
    store = await open_store(two.database_url)
    try:  # (a token from before offices names none: the one office that has amy is found)
        legacy = await api_tokens.create_token(store, "human:amy@globex.test")
    finally:
        await store.close()
    async with aiohttp.ClientSession() as s, s.post(
            two.b.url + "/api/v1/tools/mail_list", json={},
            headers={"Authorization": f"Bearer {legacy}"}) as resp:
        assert resp.status == 200, await resp.text()
    on_a = await _sign_in(two.a, forge, "amy")
    assert on_a.startswith("200") and '<span class="org">globex</span>' in on_a, on_a[:300]
    on_b = await _sign_in(two.b, forge, "amy")
    assert on_b.startswith("200") and '<span class="org">globex</span>' in on_b, on_b[:300]
