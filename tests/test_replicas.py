"""Three replicas on one PostgreSQL database, the forge spreading its webhooks across them as a
load balancer would: in the middle of a burst of sends (tools, spread across the replicas, each
client retrying on the next replica with its key), mail opened by hand and replies to an agent
(webhooks), one replica is killed with SIGKILL and another restarted. Every accepted mail lands
exactly once, every reply is copied once, the forge refused nothing, the ledger's chain holds
and the index equals a fresh reindex of the forge."""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from bot.app.replicas import Replica
from bot.store import ledger, open_store
from localforge import LocalForge
from tests import pg
from tests.deployed import deploy
from tests.support import free_port

SCOUT, BUILDER = "acme/scout-vault", "acme/builder-vault"
SENDS, BY_HAND, REPLIES = 30, 6, 6


@dataclass
class Deployment:
    forge: LocalForge
    replicas: list[Replica]
    env: dict[str, str]
    tokens: dict[str, str]
    database_url: str


async def _vaultmail(env: dict[str, str], *args: str) -> tuple[int, str]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "bot.cli.main", *args, env={**os.environ, **env},
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT)
    out, _ = await proc.communicate()
    return proc.returncode or 0, out.decode()


@pytest.fixture
async def deployment(tmp_path: Path) -> AsyncIterator[Deployment]:
    ports = [free_port() for _ in range(3)]
    urls = [f"http://127.0.0.1:{p}" for p in ports]
    deployed = await deploy(f"{urls[0]}/webhook")
    forge, tokens = deployed.forge, deployed.tokens
    forge.balance(f"{urls[0]}/webhook", [f"{u}/webhook" for u in urls])  # a load balancer
    database_url = await pg.fresh_database()
    env = {**deployed.env(str(tmp_path / "data")), "DATABASE_URL": database_url}
    replicas = [Replica(f"replica-{n + 1}", url,
                        {**env, "PORT": str(port), "REPLICA_ID": f"replica-{n + 1}"},
                        tmp_path / f"replica-{n + 1}.log")
                for n, (port, url) in enumerate(zip(ports, urls, strict=True))]
    deployed.install()  # the replicas are not up: reconciliation brings it
    await asyncio.gather(*(r.start() for r in replicas))
    code, out = await _vaultmail(env, "token", "create", "agent:builder", "--org", deployed.org)
    assert code == 0, out
    tokens["api:agent:builder"] = out.split()[-1]
    try:
        yield Deployment(forge, replicas, env, tokens, database_url)
    finally:
        await asyncio.gather(*(r.kill() for r in replicas))
        await forge.stop()
        await pg.drop_database(database_url)


async def _until(check: Any, timeout: float = 90.0, pause: float = 0.1) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while loop.time() < deadline:
        if await check():
            return
        await asyncio.sleep(pause)
    raise AssertionError("timed out")


async def test_three_replicas_one_killed_one_restarted_every_mail_exactly_once(
        deployment: Deployment) -> None:
    d = deployment
    forge, replicas = d.forge, d.replicas
    api = {"Authorization": f"Bearer {d.tokens['api:agent:builder']}"}
    marco = {"Authorization": f"token {d.tokens['marco']}"}
    scout = {"Authorization": f"token {d.tokens['scout-bot']}"}
    accepted: dict[int, dict[str, Any]] = {}

    async def send(s: aiohttp.ClientSession, i: int) -> None:
        n = i
        while True:  # a client retries with its key, on the next replica, until answered
            url = replicas[n % len(replicas)].url
            with contextlib.suppress(aiohttp.ClientError):
                async with s.post(url + "/api/v1/tools/mail_send", headers=api, json={
                        "to": "scout", "subject": f"Tool {i}", "body": f"body {i}",
                        "idempotencyKey": f"burst-{i}"}) as resp:
                    if resp.status == 200:
                        accepted[i] = (await resp.json())["mail"]
                        return
            n += 1
            await asyncio.sleep(0.05)

    async def issues(s: aiohttp.ClientSession, repo: str) -> list[dict[str, Any]]:
        async with s.get(forge.url + f"/repos/{repo}/issues?state=all&per_page=100",
                         headers=marco) as resp:
            assert resp.status == 200, await resp.text()
            found: list[dict[str, Any]] = await resp.json()
            return found

    async with aiohttp.ClientSession() as s:
        senders = [asyncio.create_task(send(s, i)) for i in range(SENDS)]
        await _until(lambda: _at_least(accepted, 8))
        await replicas[1].kill()  # SIGKILL in the middle of the burst
        for i in range(BY_HAND):  # people keep writing: webhooks spread over who is alive
            async with s.post(forge.url + f"/repos/{SCOUT}/issues", headers=marco,
                              json={"title": f"By hand {i}", "body": "during the burst"}) as r:
                assert r.status == 201
        await _until(lambda: _at_least(accepted, 16))
        await replicas[2].stop()  # a rolling restart of another
        await replicas[2].start()
        await asyncio.gather(*senders)
        # scout replies by comment on builder's mails: each reply is copied into builder's
        # vault once, whichever replica its webhook reached
        replied = sorted(accepted)[:REPLIES]
        for i in replied:
            number = accepted[i]["number"]
            async with s.post(forge.url + f"/repos/{SCOUT}/issues/{number}/comments",
                              headers=scout, json={"body": f"Reply to {i}"}) as r:
                assert r.status == 201
        await replicas[1].start()  # back under its id: it takes back nothing twice

        async def settled() -> bool:
            await forge.webhooks_idle()
            async with s.get(replicas[0].url + "/healthz") as resp:
                if (await resp.json())["queue_pending"]:
                    return False
            labelled = [i for i in await issues(s, SCOUT) if i["labels"]]
            copies = [i for i in await issues(s, BUILDER) if i["title"].startswith("Re: ")]
            return len(labelled) == SENDS + BY_HAND and len(copies) >= REPLIES

        # (each look lists two vaults as marco: twice a second stays within the forge's
        # points a minute for the endpoint, however long a lost webhook's redelivery takes)
        await _until(settled, pause=0.5)
        in_scout = await issues(s, SCOUT)
        in_builder = await issues(s, BUILDER)

    titles = sorted(i["title"] for i in in_scout)
    assert titles == sorted([f"Tool {i}" for i in range(SENDS)]
                            + [f"By hand {i}" for i in range(BY_HAND)])
    copies = sorted(i["title"] for i in in_builder if i["title"].startswith("Re: "))
    assert copies == sorted(f"Re: Tool {i}" for i in replied)
    assert not forge.rates.refused, f"secondary limits hit: {forge.rates.refused}"

    code, out = await _vaultmail(d.env, "ledger", "--json")
    assert code == 0, out  # the chain, written by three replicas, holds
    store = await open_store(d.database_url)
    try:
        assert await ledger.verify_chain(store) is None
        indexed = await _mail_rows(store)
    finally:
        await store.close()
    # the index equals what a reindex of the forge alone rebuilds, in a database of its own
    fresh = await pg.fresh_database()
    try:
        code, out = await _vaultmail({**d.env, "DATABASE_URL": fresh}, "reindex")
        assert code == 0, out
        rebuilt_store = await open_store(fresh)
        try:
            rebuilt = await _mail_rows(rebuilt_store)
        finally:
            await rebuilt_store.close()
    finally:
        await pg.drop_database(fresh)
    assert indexed == rebuilt
    assert len(indexed) == SENDS + BY_HAND + REPLIES


async def _mail_rows(store: Any) -> list[tuple[Any, ...]]:
    rows = await store.fetchall(
        "SELECT mail_id, vault, number, subject, from_principal, to_principal, hops,"
        " in_reply_to, thread_id, state FROM mails ORDER BY vault, number")
    return [tuple(r) for r in rows]


async def _at_least(items: dict[int, Any], n: int) -> bool:
    return len(items) >= n


async def test_a_second_process_under_a_replicas_id_exits_saying_why(tmp_path: Path) -> None:
    """An operator who copies a replica's settings, REPLICA_ID included, gets a process that
    exits 1 saying what to do, not one that shares the first one's claims."""
    port = free_port()
    deployed = await deploy(f"http://127.0.0.1:{port}/webhook")
    database_url = await pg.fresh_database()
    env = {**deployed.env(str(tmp_path / "data")), "DATABASE_URL": database_url,
           "REPLICA_ID": "replica-1"}
    first = Replica("replica-1", f"http://127.0.0.1:{port}", {**env, "PORT": str(port)},
                    tmp_path / "replica-1.log")
    copy: asyncio.subprocess.Process | None = None
    try:
        await first.start()
        copy = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "bot.cli.main", "serve",
            env={**os.environ, **env, "PORT": str(free_port())},
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT)
        out, _ = await asyncio.wait_for(copy.communicate(), 60)
        assert copy.returncode == 1, out.decode()
        assert "REPLICA_ID 'replica-1' is in use" in out.decode().splitlines()[-1]
        await first.until_ready()  # the first goes on
    finally:
        if copy is not None and copy.returncode is None:
            copy.kill()
            await copy.wait()
        await first.kill()
        await deployed.forge.stop()
        await pg.drop_database(database_url)


async def test_a_replica_that_cannot_start_says_what_was_awaited_and_how_its_log_ends(
        tmp_path: Path) -> None:
    """Waiting for a replica to be ready fails, when it does, naming what it waited for, what
    it saw last and the end of the replica's log (before: "did not become ready", and a path
    to a log that a CI run does not keep)."""
    with socket.socket() as taken:  # its port, already someone's: it exits at once
        taken.bind(("127.0.0.1", 0))  # (not listening: asking /readyz there is refused)
        port = taken.getsockname()[1]
        key = "-----BEGIN PRIVATE KEY-----\\nx\\n-----END PRIVATE KEY-----"
        replica = Replica("replica-1", f"http://127.0.0.1:{port}", {
            "APP_ID": "1", "PRIVATE_KEY": key, "WEBHOOK_SECRET": "s",
            "GITHUB_API_URL": "http://127.0.0.1:9", "HOST": "127.0.0.1", "PORT": str(port),
            "VAULTMAIL_DATA": str(tmp_path / "data")},
            tmp_path / "replica-1.log")
        with pytest.raises(RuntimeError) as failed:
            await replica.start()
    said = str(failed.value)
    assert f"http://127.0.0.1:{port}/readyz never answered 200" in said, said
    assert "the process exited 2" in said, said
    assert f"cannot listen on 127.0.0.1:{port}" in said.splitlines()[-1], said
