"""`vaultmail up` receives email: its ready line names the SMTP port, the one-line Python
example it prints sends a message to scout, and the message becomes mail in scout's vault."""

from __future__ import annotations

import asyncio
import json
import re
import signal
import socket
import sys
from pathlib import Path

import aiohttp
import pytest

from tests.support import free_port, until


async def test_up_prints_its_smtp_port_and_an_example_that_mails_scout(tmp_path: Path) -> None:
    smtp_port = free_port()
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "bot.cli.main", "up", "--data", str(tmp_path), "--port",
        str(free_port()), "--forge-port", str(free_port()), "--smtp-port", str(smtp_port),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.DEVNULL)
    assert proc.stdout is not None
    try:
        ready = (await asyncio.wait_for(proc.stdout.readline(), 60)).decode()
        assert "ready" in ready and f"smtp 127.0.0.1:{smtp_port}" in ready
        example = (await asyncio.wait_for(proc.stdout.readline(), 10)).decode()
        m = re.match(r"^mail scout by email: (python3 -c .*)$", example.strip())
        assert m is not None, example
        shell = await asyncio.create_subprocess_shell(m.group(1).replace(
            "python3", sys.executable, 1))
        assert await asyncio.wait_for(shell.wait(), 60) == 0
        tokens = json.loads((tmp_path / "tokens.json").read_text())
        headers = {"Authorization": f"token {tokens['forge_tokens']['marco']}"}
        url = tokens["forge_url"] + "/repos/acme/scout-vault/issues?state=all"
        found: list[dict[str, object]] = []

        async def landed() -> bool:
            async with aiohttp.ClientSession() as s, s.get(url, headers=headers) as resp:
                found[:] = await resp.json()
            return bool(found)

        await until(landed, timeout=30)
        assert found[0]["title"] == "Hello"
        assert "email:you@example.org" in str(found[0]["body"])
    finally:
        proc.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(proc.wait(), 30) == 0


def test_email_dns_prints_the_records_with_the_offices_dkim_key(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from bot.cli.main import main
    from bot.email import keys

    assert main(["email", "dns", "--org", "acme", "--domain", "mail.acme.example",
                 "--data", str(tmp_path)]) == 0
    lines = [line.split("\t") for line in capsys.readouterr().out.splitlines()]
    assert [kind for _, kind, _ in lines] == ["MX", "TXT", "TXT", "TXT", "TXT"]
    # the domain proven acme's office's (bot.email.domains): the record names acme's id on
    # the forge, which the command says where it is not given
    assert ["_vaultmail.mail.acme.example", "TXT",
            "vaultmail-office-id=<the id of acme on the forge>"] in lines
    name, value = keys.dns_record(keys.office_key(tmp_path, "acme"), "mail.acme.example")
    assert [name, "TXT", value] in lines
    assert ["_dmarc.mail.acme.example", "TXT",
            "v=DMARC1; p=quarantine; adkim=r; aspf=r"] in lines
    assert main(["email", "dns", "--org", "acme", "--org-id", "4021", "--domain",
                 "mail.acme.example", "--data", str(tmp_path)]) == 0
    assert "_vaultmail.mail.acme.example\tTXT\tvaultmail-office-id=4021" in \
        capsys.readouterr().out.splitlines()
    assert main(["email", "dns", "--org", "acme", "--domain", "not a domain",
                 "--data", str(tmp_path)]) == 2


async def test_an_smtp_port_in_use_stops_up_at_once_with_a_clear_line(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "bot.cli.main", "up", "--data", str(tmp_path), "--port", "0",
            "--forge-port", "0", "--smtp-port", str(port),
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
        _, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode == 2
    assert err.decode().strip() == (
        f"vaultmail up: cannot listen on 127.0.0.1:{port} for SMTP: Address already in use: "
        "stop what uses that port or choose another (--smtp-port / VAULTMAIL_SMTP_PORT)")
