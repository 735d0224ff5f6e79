"""The index's catch-up with the forge at start (an index restored from a backup) runs beside
the serving, each office's beside the others' (review r5, s46): an office whose forge reads
hang holds up no other office, and of its own only a keyed send waits for it."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import aiohttp
import yaml

from bot.app.replicas import Replica
from bot.office.config import parse_office
from bot.office.seed import seed_office
from tests.deployed import deploy
from tests.harness.runner import vaultmail
from tests.support import free_port, until
from tests.test_tenancy import EVIL


async def test_an_office_whose_catch_up_hangs_holds_up_only_its_own_keyed_sends(
        tmp_path: Path, database_url: str) -> None:
    """Acted out: with aardvark's vault listing held at the forge, /readyz and /webhook
    answered 503 for every office (25 s and more: a hung read costs ~4 tries of 30 s), the
    start awaiting every office's catch-up before serving."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    deployed = await deploy(f"{url}/webhook")
    forge = deployed.forge
    seed_office(forge, parse_office(yaml.safe_dump({**EVIL, "org": "aardvark"}), "a.yml",
                                    repository=False))
    deployed.install()
    forge.install_app(deployed.app_id, "aardvark")
    held = forge.faults.hold("GET /repos/{owner}/{repo}/issues", count=None,
                             repo="aardvark/scout-vault")
    env = {**deployed.env(str(tmp_path / "data")), "PORT": str(port),
           "DATABASE_URL": database_url, "VAULTMAIL_DOCTOR_SECONDS": "3600"}
    replica = Replica("r1", url, env, tmp_path / "r1.log")
    try:
        await replica.start()  # /readyz answers 200 (within its bound) with aardvark held
        await asyncio.wait_for(held.arrived.wait(), 60)  # aardvark's catch-up, at the forge
        heads = {}
        for org in ("acme", "aardvark"):
            code, out = await vaultmail(env, "token", "create", "agent:scout", "--org", org)
            assert code == 0, out
            heads[org] = {"Authorization": f"Bearer {out.split()[-1]}"}
        async with aiohttp.ClientSession() as s:
            async def tool(org: str, name: str, **args: Any) -> tuple[int, dict[str, Any],
                                                                      str | None]:
                async with s.post(f"{url}/api/v1/tools/{name}", headers=heads[org],
                                  json=args) as r:
                    return r.status, await r.json(), r.headers.get("Retry-After")

            send = {"to": "scout", "subject": "Hi", "body": "x", "idempotencyKey": "k1"}
            status, body, _ = await tool("acme", "mail_send", **send)
            assert status == 200, body
            status, body, wait = await tool("aardvark", "mail_send", **send)
            assert (status, body["error"]["code"]) == (503, "catching_up"), body
            assert wait is not None and int(wait) >= 1
            assert "caught up from the forge" in body["error"]["message"], body
            status, body, _ = await tool("aardvark", "mail_list")
            assert status == 200, body  # what the catch-up does not protect is served
            async with s.post(url + "/webhook", data=b"{}") as r:
                assert r.status != 503, await r.text()
            assert not held.released.is_set(), "all of it while aardvark's read was held"

            held.release()

            async def sent() -> bool:
                status, body, _ = await tool("aardvark", "mail_send", **send)
                assert status in (200, 503), body
                return status == 200
            await until(sent, timeout=60)
        log = (tmp_path / "r1.log").read_text()
        assert "the index's catch-up with the forge: office done" in log, log[-3000:]
    finally:
        held.release()
        await replica.kill()
        await forge.stop()
