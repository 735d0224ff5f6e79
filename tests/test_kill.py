"""Killed at random: `vaultmail serve` is killed with SIGKILL in the middle of a burst of mail,
restarted, and every mail still lands exactly once (clients retry with their keys; webhooks
missed while it was down are reconciled)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from bot.app.replicas import Replica
from bot.store import ledger, open_store
from localforge import LocalForge
from tests.deployed import APP_SLUG, deploy
from tests.support import free_port, until

VAULT = "acme/scout-vault"
VAULTMAIL = str(Path(sys.executable).parent / "vaultmail")


class App(Replica):
    """`vaultmail serve` as an operator runs it (its console script), in its own process."""

    async def start(self) -> None:
        assert self.log_path is not None
        with self.log_path.open("ab") as out:
            self.proc = await asyncio.create_subprocess_exec(
                VAULTMAIL, "serve", env={**os.environ, **self.env}, stdout=out, stderr=out)
        await self.until_ready()

    async def pending(self) -> int:
        async with aiohttp.ClientSession() as s, s.get(self.url + "/healthz") as resp:
            return int((await resp.json())["queue_pending"])


@pytest.fixture
async def deployed(tmp_path: Path) -> AsyncIterator[tuple[LocalForge, App, dict[str, str]]]:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    deployed = await deploy(f"{url}/webhook")
    forge, tokens = deployed.forge, deployed.tokens
    deployed.install()  # its webhook fails: reconciliation brings it
    (tmp_path / "key.pem").write_text(deployed.pem)  # the key as a file, this time
    env = {**deployed.env(str(tmp_path / "data")), "PORT": str(port),
           "GITHUB_PRIVATE_KEY_PATH": str(tmp_path / "key.pem")}
    del env["PRIVATE_KEY"]
    app = App("app", url, env, tmp_path / "app.log")
    await app.start()  # makes the data directory, which `token create` then writes to
    # (its office named: the app may not have heard of the installation yet, whose webhook
    # failed; a token made now cannot wait for reconciliation to bring it)
    made = await asyncio.create_subprocess_exec(
        VAULTMAIL, "token", "create", "agent:builder", "--org", deployed.org,
        env={**os.environ, **env}, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE)
    out, err = await made.communicate()
    assert made.returncode == 0, err.decode()
    tokens["api:agent:builder"] = out.decode().split()[-1]
    try:
        yield forge, app, tokens
    finally:
        if app.proc is not None and app.proc.returncode is None:
            await app.kill()
        await forge.stop()


async def _until(check: Any, timeout: float = 60.0) -> None:
    for _ in range(int(timeout / 0.1)):
        if await check():
            return
        await asyncio.sleep(0.1)
    raise AssertionError("timed out")


async def test_no_mail_lost_or_duplicated_when_the_app_is_killed(
        deployed: tuple[LocalForge, App, dict[str, str]]) -> None:
    forge, app, tokens = deployed
    api = {"Authorization": f"Bearer {tokens['api:agent:builder']}"}
    person = {"Authorization": f"token {tokens['marco']}"}
    delivered: set[int] = set()

    async def send(s: aiohttp.ClientSession, i: int) -> None:
        while True:  # a client retries with its key until it has an answer
            with contextlib.suppress(aiohttp.ClientError):
                async with s.post(app.url + "/api/v1/tools/mail_send", headers=api, json={
                        "to": "scout", "subject": f"Tool {i}", "body": f"body {i}",
                        "idempotencyKey": f"kill-{i}"}) as resp:
                    if resp.status == 200:
                        delivered.add(i)
                        return
            await asyncio.sleep(0.05)

    async with aiohttp.ClientSession() as s:
        senders = [asyncio.create_task(send(s, i)) for i in range(30)]
        await _until(lambda: _at_least(delivered, 8), timeout=30)
        await app.kill()
        for i in range(5):  # people keep writing while the app is down
            async with s.post(forge.url + f"/repos/{VAULT}/issues", headers=person,
                              json={"title": f"By hand {i}", "body": "while down"}) as resp:
                assert resp.status == 201
        await app.start()
        await asyncio.gather(*senders)

        async def settled() -> bool:
            await forge.webhooks_idle()
            if await app.pending():
                return False
            async with s.get(forge.url + f"/repos/{VAULT}/issues?state=all&per_page=100",
                             headers=person) as resp:
                issues = await resp.json()
            return sum(1 for i in issues if i["labels"]) == 35

        await _until(settled)
        async with s.get(forge.url + f"/repos/{VAULT}/issues?state=all&per_page=100",
                         headers=person) as resp:
            issues = await resp.json()
    titles = sorted(i["title"] for i in issues)
    assert titles == sorted([f"Tool {i}" for i in range(30)] + [f"By hand {i}" for i in range(5)])
    assert all([lab["name"] for lab in i["labels"]] == ["mail:new"] for i in issues)


async def _at_least(items: set[int], n: int) -> bool:
    return len(items) >= n


async def test_a_send_killed_after_its_create_landed_is_recorded_once_by_the_start(
        deployed: tuple[LocalForge, App, dict[str, str]], tmp_path: Path) -> None:
    """A keyed send's issue create lands and its answer is lost (a 502); the app's look for
    it on the forge is held there, its own webhook lost, and the app killed. The start's
    catch-up finds the issue, which this index began sending and never recorded: it is
    recorded as its sender would (one row, one `mail.sent`, its run admitted), and the
    client's retry returns it. Acted out (the fault harness, seed 2028, SQLite): the
    catch-up indexed the row alone, and the retry, finding it, ledgered nothing."""
    forge, app, tokens = deployed
    api = {"Authorization": f"Bearer {tokens['api:agent:builder']}"}
    person = {"Authorization": f"token {tokens['marco']}"}
    send = {"to": "scout", "subject": "Killed mid-send", "body": "once",
            "idempotencyKey": "killed-1"}
    async with aiohttp.ClientSession() as s:

        async def mail_send(args: dict[str, Any]) -> tuple[int, dict[str, Any]]:
            async with s.post(app.url + "/api/v1/tools/mail_send", headers=api,
                              json=args) as resp:
                return resp.status, await resp.json()

        async def answered(args: dict[str, Any]) -> None:
            async def ok() -> bool:
                status, body = await mail_send(args)
                assert status in (200, 503), body  # 503: the start's catch-up still runs
                return status == 200
            await until(ok, timeout=60)

        await answered({**send, "subject": "Before", "idempotencyKey": "before"})
        await forge.webhooks_idle()  # (what that send made is told)
        forge.faults.add("POST /repos/{owner}/{repo}/issues", status=502, mode="after",
                         count=1)
        # its `issues.opened`, which would record it (`record_found`), is not heard (nor
        # redelivered) until the start's catch-up is done: the catch-up finds the issue first
        forge.faults.drop_webhooks(rate=1.0, senders=(f"{APP_SLUG}[bot]",))
        held = forge.faults.hold("GET /repos/{owner}/{repo}/issues", count=1, repo=VAULT)
        first = asyncio.create_task(mail_send(send))
        await asyncio.wait_for(held.arrived.wait(), 60)  # did the create land? asked
        await app.kill()
        held.release()
        with contextlib.suppress(aiohttp.ClientError):
            await first

        async def landed() -> list[dict[str, Any]]:
            async with s.get(forge.url + f"/repos/{VAULT}/issues?state=all",
                             headers=person) as resp:
                return [i for i in await resp.json() if i["title"] == send["subject"]]

        async def one_landed() -> bool:
            return len(await landed()) == 1

        assert await one_landed()
        await app.start()
        await answered(send)  # (answered once the start's catch-up is done)
        forge.faults.drop_webhooks()
        status, body = await mail_send(send)
        assert status == 200, body
        mail = body["mail"]
        issues = await landed()
    await app.kill()
    assert [i["number"] for i in issues] == [mail["number"]]
    store = await open_store(str(tmp_path / "data" / "index.sqlite3"))
    try:
        rows = await store.fetchall("SELECT vault, number FROM mails WHERE mail_id=?",
                                    (mail["mail_id"],))
        runs = await store.fetchall("SELECT state FROM runs WHERE subject=?",
                                    (f"{VAULT}#{mail['number']}",))
        entries = await ledger.entries(store, limit=1000)
    finally:
        await store.close()
    assert [tuple(r) for r in rows] == [(VAULT, mail["number"])]
    sent = [e.subject for e in entries
            if e.event == "mail.sent" and e.data.get("mail") == mail["mail_id"]]
    assert sent == [f"{VAULT}#{mail['number']}"], "the send is ledgered once"
    assert len(runs) == 1, "its recipient's run admitted once"
