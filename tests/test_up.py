"""`vaultmail up` as a newcomer runs it: a real process, ready line, tokens.json, restart."""

from __future__ import annotations

import asyncio
import json
import signal
import socket
import sys
from pathlib import Path

import aiohttp

from bot.app.embedded import start_embedded
from tests.support import free_port


async def _up(data: Path, port: int, forge_port: int) -> tuple[asyncio.subprocess.Process, str]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "bot.cli.main", "up", "--data", str(data), "--port", str(port),
        "--forge-port", str(forge_port), stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.DEVNULL)
    assert proc.stdout is not None
    line = (await asyncio.wait_for(proc.stdout.readline(), 60)).decode()
    return proc, line


async def _stop(proc: asyncio.subprocess.Process) -> int:
    proc.send_signal(signal.SIGTERM)
    return await asyncio.wait_for(proc.wait(), 30)


async def test_up_serves_writes_tokens_and_continues_after_a_restart(tmp_path: Path) -> None:
    port, forge_port = free_port(), free_port()
    proc, line = await _up(tmp_path, port, forge_port)
    try:
        assert "ready" in line
        tokens = json.loads((tmp_path / "tokens.json").read_text())
        assert tokens["app_url"] == f"http://127.0.0.1:{port}"
        assert tokens["forge_url"] == f"http://127.0.0.1:{forge_port}"
        assert {"admin", "marco", "scout-bot"} <= set(tokens["forge_tokens"])
        assert "agent:scout" in tokens["api_tokens"]
        async with aiohttp.ClientSession() as s:
            async with s.get(tokens["app_url"] + "/healthz") as resp:
                assert resp.status == 200
            headers = {"Authorization": f"Bearer {tokens['api_tokens']['human:marco@acme.com']}"}
            async with s.post(tokens["app_url"] + "/api/v1/tools/mail_send", headers=headers,
                              json={"to": "scout", "subject": "Hi", "body": "x"}) as resp:
                assert resp.status == 200, await resp.text()
    finally:
        assert await _stop(proc) == 0

    proc, line = await _up(tmp_path, port, forge_port)
    try:
        assert "ready" in line
        again = json.loads((tmp_path / "tokens.json").read_text())
        assert again["forge_tokens"] == tokens["forge_tokens"]
        async with aiohttp.ClientSession() as s:
            headers = {"Authorization": f"token {again['forge_tokens']['marco']}"}
            url = again["forge_url"] + "/repos/acme/scout-vault/issues?state=all"
            async with s.get(url, headers=headers) as resp:
                issues = await resp.json()
            assert [i["title"] for i in issues] == ["Hi"], "the forge kept its state"
            headers = {"Authorization": f"Bearer {again['api_tokens']['agent:scout']}"}
            async with s.post(again["app_url"] + "/api/v1/tools/mail_list", headers=headers,
                              json={}) as resp:
                listed = await resp.json()
            assert [m["subject"] for m in listed["mails"]] == ["Hi"], "the index kept its state"
    finally:
        assert await _stop(proc) == 0


async def test_serve_without_configuration_says_what_is_missing(tmp_path: Path) -> None:
    """As Probot does: instead of exiting, it serves the registration page on its port and
    says in one line what is missing and where to go (tests/app/test_register.py goes on)."""
    port = free_port()
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "bot.cli.main", "serve", stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE, cwd=tmp_path,
        env={"PATH": "/usr/bin:/bin", "HOST": "127.0.0.1", "PORT": str(port)})
    try:
        assert proc.stderr is not None
        line = (await asyncio.wait_for(proc.stderr.readline(), 30)).decode()
        assert "GITHUB_WEBHOOK_SECRET" in line and "vaultmail up" in line, line
        assert f"not registered yet: open http://127.0.0.1:{port}/setup?key=" in line, line
        link = line.split("open ", 1)[1].split()[0]
        async with aiohttp.ClientSession() as s, s.get(link) as resp:
            assert resp.status == 200
            assert 'action="https://github.com/settings/apps/new?state=' in await resp.text()
    finally:
        assert await _stop(proc) == 0


async def test_up_with_replicas_runs_them_on_one_postgresql_and_spreads_the_webhooks(
        tmp_path: Path) -> None:
    """`vaultmail up --replicas 3 --database-url URL`: three app processes on one database,
    every replica's URL in tokens.json; mail sent through one is listed by another, a long
    poll on one is woken by a send through another, and mail opened in the forge is labelled
    whichever replica its webhook reached."""
    from tests import pg

    url = await pg.fresh_database()
    port, forge_port = free_port(), free_port()
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "bot.cli.main", "up", "--data", str(tmp_path), "--port",
        str(port), "--forge-port", str(forge_port), "--replicas", "3", "--database-url", url,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.DEVNULL)
    assert proc.stdout is not None
    try:
        line = (await asyncio.wait_for(proc.stdout.readline(), 90)).decode()
        assert "ready" in line and "replicas" in line, line
        tokens = json.loads((tmp_path / "tokens.json").read_text())
        first, *others = tokens["app_urls"]
        assert first == tokens["app_url"] and len(others) == 2
        marco = {"Authorization": f"Bearer {tokens['api_tokens']['human:marco@acme.com']}"}
        scout = {"Authorization": f"Bearer {tokens['api_tokens']['agent:scout']}"}
        async with aiohttp.ClientSession() as s:
            async with s.post(others[0] + "/api/v1/tools/list_inbox", headers=scout,
                              json={}) as resp:
                assert resp.status == 200
            poll = asyncio.create_task(s.post(others[0] + "/api/v1/tools/list_inbox",
                                              headers=scout, json={"wait": 30}))
            async with s.post(others[1] + "/api/v1/tools/mail_send", headers=marco,
                              json={"to": "scout", "subject": "Across", "body": "x"}) as resp:
                assert resp.status == 200, await resp.text()
            async with await asyncio.wait_for(poll, 20) as resp:  # woken, not timed out
                assert resp.status == 200
            async with s.post(first + "/api/v1/tools/mail_list", headers=scout,
                              json={}) as resp:
                assert [m["subject"] for m in (await resp.json())["mails"]] == ["Across"]
            forge = {"Authorization": f"token {tokens['forge_tokens']['marco']}"}
            for i in range(3):
                async with s.post(tokens["forge_url"] + "/repos/acme/scout-vault/issues",
                                  headers=forge, json={"title": f"Hand {i}", "body": "y"}) as r:
                    assert r.status == 201
            for _ in range(200):
                async with s.get(tokens["forge_url"] + "/repos/acme/scout-vault/issues",
                                 headers=forge) as resp:
                    issues = await resp.json()
                if all(i["labels"] for i in issues) and len(issues) == 4:
                    break
                await asyncio.sleep(0.1)
            assert sorted(i["title"] for i in issues if i["labels"]) == [
                "Across", "Hand 0", "Hand 1", "Hand 2"]
    finally:
        assert await _stop(proc) == 0
        await pg.drop_database(url)


async def test_a_second_process_on_one_sqlite_data_directory_exits_saying_why(
        tmp_path: Path) -> None:
    """A deploy that starts the new process before the old has exited, or two pods on one
    volume: the second says so in one line and exits 2; the first goes on (issue 27)."""
    proc, line = await _up(tmp_path, free_port(), free_port())
    try:
        assert "ready" in line
        second = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "bot.cli.main", "up", "--data", str(tmp_path), "--port",
            str(free_port()), "--forge-port", str(free_port()),
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
        out, err = await asyncio.wait_for(second.communicate(), 60)
        assert second.returncode == 2, (out.decode(), err.decode())
        [said] = err.decode().strip().splitlines()
        assert "served by another process" in said and f"pid {proc.pid}" in said, said
        url = json.loads((tmp_path / "tokens.json").read_text())["app_url"]
        async with aiohttp.ClientSession() as s, s.get(url + "/healthz") as resp:
            assert resp.status == 200  # the first goes on
    finally:
        assert await _stop(proc) == 0


async def test_up_with_a_port_in_use_says_which_in_one_line_and_exits_2(
        tmp_path: Path) -> None:
    """Issue 23: a port already taken (the app's, or the local forge's) is one line naming it
    and what to do, exit 2, no traceback and nothing left open ("Unclosed client session")."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        busy = str(taken.getsockname()[1])
        for flag, other, whose in (("--port", "--forge-port", "for the app"),
                                   ("--forge-port", "--port", "for the local forge")):
            proc = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "bot.cli.main", "up", "--data", str(tmp_path / flag),
                flag, busy, other, str(free_port()), stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE)
            out, err = await asyncio.wait_for(proc.communicate(), 60)
            assert proc.returncode == 2, (out.decode(), err.decode())
            [said] = err.decode().strip().splitlines()
            assert said.startswith("vaultmail up: cannot listen on") and busy in said, said
            assert whose in said and flag in said, said


async def test_up_bound_to_every_interface_prints_links_one_can_open(tmp_path: Path) -> None:
    """Issue 23: `up --host 0.0.0.0` printed http://0.0.0.0 links; they name loopback, where
    this machine reaches it."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "bot.cli.main", "up", "--data", str(tmp_path), "--host",
        "0.0.0.0", "--port", str(free_port()), "--forge-port", str(free_port()),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.DEVNULL)
    assert proc.stdout is not None
    try:
        line = (await asyncio.wait_for(proc.stdout.readline(), 60)).decode()
        assert "ready" in line and "0.0.0.0" not in line and "http://127.0.0.1:" in line, line
        url = json.loads((tmp_path / "tokens.json").read_text())["app_url"]
        async with aiohttp.ClientSession() as s, s.get(url + "/healthz") as resp:
            assert resp.status == 200
    finally:
        assert await _stop(proc) == 0


async def test_tokens_json_works_again_after_the_index_is_rebuilt_from_scratch(
        tmp_path: Path) -> None:
    """The index went (deleted, or restored from nothing) while the forge kept its state: the
    tokens tokens.json names are in no index any more. The next start makes new ones for those
    it does not know and writes them, so the file's tokens act (they were 401 unauthenticated);
    a token the index still knows is kept as it is."""
    first = await start_embedded(data_dir=tmp_path, port=0, forge_port=0,
                                 persist_forge=True)
    kept = dict(first.api_tokens)
    await first.stop()
    for index in tmp_path.glob("index.sqlite3*"):
        index.unlink()
    again = await start_embedded(data_dir=tmp_path, port=0, forge_port=0,
                                persist_forge=True)
    try:
        written = json.loads((tmp_path / "tokens.json").read_text())["api_tokens"]
        assert written == again.api_tokens and set(written) == set(kept)
        async with aiohttp.ClientSession() as s:
            for principal, token in written.items():
                async with s.post(again.app_url + "/api/v1/tools/list_inbox", json={},
                                  headers={"Authorization": f"Bearer {token}"}) as resp:
                    assert resp.status == 200, (principal, await resp.text())
    finally:
        await again.stop()
    third = await start_embedded(data_dir=tmp_path, port=0, forge_port=0,
                                 persist_forge=True)
    try:
        assert third.api_tokens == written, "tokens the index knows are kept"
    finally:
        await third.stop()
