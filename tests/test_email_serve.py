"""`vaultmail serve --smtp-port`: the app alone against a forge receives email; its one line
names the SMTP listener, and a message answered 250 is mail on the forge already."""

from __future__ import annotations

import asyncio
import re
import signal
import socket
import sys
from pathlib import Path

import aiohttp
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa

from bot.app.embedded import APP_EVENTS, APP_PERMISSIONS
from bot.office.config import load_office
from bot.office.seed import office_yaml, seed_office
from bot.office.source import CONFIG_PATH, CONFIG_REPO
from localforge import LocalForge
from tests.support import free_port, until
from tests.test_email_support import DOMAIN, message, send, wire


async def test_serve_with_an_smtp_port_turns_a_message_into_mail(tmp_path: Path) -> None:
    forge_port, app_port = free_port(), free_port()
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    private = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                serialization.NoEncryption()).decode()
    public = key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo).decode()
    office = load_office()
    forge = LocalForge()
    tokens = seed_office(forge, office)
    forge.put_file(f"{office.org}/{CONFIG_REPO}", CONFIG_PATH, office_yaml(office))
    app_id = forge.register_app(slug="vaultmail", name="vaultmail", public_key_pem=public,
                                webhook_url=f"http://127.0.0.1:{app_port}/webhook",
                                webhook_secret="whsec", events=APP_EVENTS,
                                permissions=APP_PERMISSIONS)
    forge.install_app(app_id, "acme")
    await forge.start(port=forge_port)
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "bot.cli.main", "serve", "--smtp-port", "0", cwd=str(tmp_path),
        env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "APP_ID": str(app_id),
             "PRIVATE_KEY": private, "WEBHOOK_SECRET": "whsec",
             "GITHUB_API_URL": f"http://127.0.0.1:{forge_port}", "HOST": "127.0.0.1",
             "PORT": str(app_port), "VAULTMAIL_DATA": str(tmp_path / "data"),
             # the operator vouches for acme's domain (no DNS here: bot.email.domains)
             "VAULTMAIL_SMTP_DOMAINS": f"{DOMAIN}=acme"},
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.DEVNULL)
    try:
        assert proc.stdout is not None
        line = (await asyncio.wait_for(proc.stdout.readline(), 60)).decode()
        m = re.search(r"smtp 127\.0\.0\.1:(\d+)$", line.strip())
        assert line.startswith("vaultmail serving on") and m is not None, line
        port = int(m.group(1))
        async with aiohttp.ClientSession() as session:
            async def ready() -> bool:
                async with session.get(f"http://127.0.0.1:{app_port}/readyz") as resp:
                    return resp.status == 200
            await until(ready, timeout=60)
            raw = wire(message("bob@example.org", f"scout@{DOMAIN}", "By serve", "hello"))
            answer = await send(port, raw, rcpts=[f"scout@{DOMAIN}"])
            assert answer.code == 250 and "delivered as" in answer.text, answer
            assert "scout-vault" not in answer.text, answer  # no repository named
            headers = {"Authorization": f"token {tokens['marco']}"}
            async with session.get(f"{forge.url}/repos/acme/scout-vault/issues/1",
                                   headers=headers) as resp:
                issue = await resp.json()
            assert issue["title"] == "By serve" and "email:bob@example.org" in issue["body"]
    finally:
        proc.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(proc.wait(), 30) == 0
        await forge.stop()


async def test_serve_with_its_smtp_port_in_use_fails_at_once(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "bot.cli.main", "serve", "--smtp-port", str(port),
            cwd=str(tmp_path), env={
                "PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "APP_ID": "1",
                "PRIVATE_KEY": "-----BEGIN PRIVATE KEY-----\\nx\\n-----END PRIVATE KEY-----",
                "WEBHOOK_SECRET": "s", "GITHUB_API_URL": "http://127.0.0.1:9",
                "HOST": "127.0.0.1", "PORT": str(free_port()),
                "VAULTMAIL_DATA": str(tmp_path / "data")},
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
        _, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode == 2
    assert f"cannot listen on 127.0.0.1:{port} for SMTP" in err.decode()
