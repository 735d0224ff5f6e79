"""`vaultmail serve` as an operator's container runs it: it starts before the forge answers and
becomes ready once it does, a port in use fails at once, and SIGTERM drains promptly."""

from __future__ import annotations

import asyncio
import json
import signal
import socket
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa

from bot.app.embedded import APP_EVENTS, APP_PERMISSIONS
from bot.office.config import load_office
from bot.office.seed import seed_office
from localforge import LocalForge

ROOT = Path(__file__).resolve().parents[2]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _key_pair() -> tuple[str, str]:
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    private = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                serialization.NoEncryption()).decode()
    public = key.public_key().public_bytes(serialization.Encoding.PEM,
                                           serialization.PublicFormat.SubjectPublicKeyInfo)
    return private, public.decode()


async def _serve(env: dict[str, str], cwd: Path) -> asyncio.subprocess.Process:
    return await asyncio.create_subprocess_exec(
        sys.executable, "-m", "bot.cli.main", "serve", cwd=str(cwd),
        env={"PATH": "/usr/bin:/bin", "HOME": str(cwd), **env},
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)


async def _json(session: aiohttp.ClientSession, method: str, url: str,
                **kw: Any) -> tuple[int, Any]:
    async with session.request(method, url, **kw) as resp:
        return resp.status, await resp.json(content_type=None)


async def _until_ready(session: aiohttp.ClientSession, url: str, tries: int = 300) -> Any:
    """Poll /readyz (the operator's probe) until it says ready; bounded."""
    body: Any = None
    for _ in range(tries):
        status, body = await _json(session, "GET", url + "/readyz")
        if status == 200:
            return body
        await asyncio.sleep(0.1)
    raise AssertionError(f"never ready: {body}")


@pytest.fixture
async def session() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as s:
        yield s


async def test_serve_starts_while_the_forge_is_unreachable_and_becomes_ready_once_it_answers(
        tmp_path: Path, session: aiohttp.ClientSession) -> None:
    forge_port, app_port = _free_port(), _free_port()
    app_url = f"http://127.0.0.1:{app_port}"
    private, public = _key_pair()
    secret = "whsec-test"
    forge = LocalForge()  # set up as an organisation would be, but not listening yet
    seed_office(forge, load_office())
    app_id = forge.register_app(slug="vaultmail", name="vaultmail", public_key_pem=public,
                                webhook_url=app_url + "/webhook", webhook_secret=secret,
                                events=APP_EVENTS, permissions=APP_PERMISSIONS)
    forge.install_app(app_id, "acme")
    proc = await _serve({"APP_ID": str(app_id), "PRIVATE_KEY": private, "WEBHOOK_SECRET": secret,
                         "GITHUB_API_URL": f"http://127.0.0.1:{forge_port}", "HOST": "127.0.0.1",
                         "PORT": str(app_port), "VAULTMAIL_DATA": str(tmp_path / "data")},
                        tmp_path)
    try:
        assert proc.stdout is not None
        line = (await asyncio.wait_for(proc.stdout.readline(), 60)).decode()
        assert line.strip() == f"vaultmail serving on {app_url}"
        status, health = await _json(session, "GET", app_url + "/healthz")
        assert (status, health["status"]) == (200, "starting"), "alive before the forge answers"
        status, ready = await _json(session, "GET", app_url + "/readyz")
        assert status == 503 and ready["failed"] == ["forge"], ready
        status, refused = await _json(session, "POST", app_url + "/webhook", data=b"{}")
        assert status == 503 and refused["error"]["code"] == "starting"

        await forge.start(port=forge_port)
        ready = await _until_ready(session, app_url)
        assert ready["failed"] == [] and ready["checks"]["forge"]["ok"]
    finally:
        proc.send_signal(signal.SIGTERM)
        await asyncio.wait_for(proc.wait(), 30)
        await forge.stop()
    assert proc.returncode == 0


async def test_a_port_in_use_fails_start_up_at_once_with_a_clear_message(
        tmp_path: Path) -> None:
    private, _ = _key_pair()
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        proc = await _serve({"APP_ID": "1", "PRIVATE_KEY": private, "WEBHOOK_SECRET": "s",
                             "GITHUB_API_URL": "http://127.0.0.1:9", "HOST": "127.0.0.1",
                             "PORT": str(port)}, tmp_path)
        out, err = await asyncio.wait_for(proc.communicate(), 30)
    assert proc.returncode == 2
    assert err.decode().strip().splitlines() == [
        f"vaultmail: cannot listen on 127.0.0.1:{port}: Address already in use: stop what uses "
        "that port or choose another (PORT / --port)"]


async def test_sigterm_answers_long_polls_at_once_and_exits_0(
        tmp_path: Path, session: aiohttp.ClientSession) -> None:
    port, forge_port = _free_port(), _free_port()
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "bot.cli.main", "up", "--data", str(tmp_path), "--port",
        str(port), "--forge-port", str(forge_port), stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.DEVNULL)
    assert proc.stdout is not None
    line = (await asyncio.wait_for(proc.stdout.readline(), 60)).decode()
    assert "ready" in line
    tokens = json.loads((tmp_path / "tokens.json").read_text())
    headers = {"Authorization": f"Bearer {tokens['api_tokens']['agent:scout']}"}
    url = tokens["app_url"] + "/api/v1/tools/list_inbox"
    poll = asyncio.create_task(_json(session, "POST", url, headers=headers, json={"wait": 50}))
    # the poll is held once the app counts it among the waiting (its own metric)
    for _ in range(200):
        async with session.get(tokens["app_url"] + "/metrics") as resp:
            text = await resp.text()
        held = [ln for ln in text.splitlines() if ln.startswith("vaultmail_long_polls_held ")]
        if held and float(held[0].split()[1]) >= 1:
            break
        await asyncio.sleep(0.05)
    else:
        raise AssertionError("the long poll was never held")
    proc.send_signal(signal.SIGTERM)
    status, body = await asyncio.wait_for(poll, 10)  # not the 50 s it asked for
    assert status == 200 and "inbox" in body, body
    assert await asyncio.wait_for(proc.wait(), 10) == 0
