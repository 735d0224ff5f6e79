"""A keyed send whose replica stalls past DEAD_AFTER (issue 27): the key is taken over by the
client's retry on another replica, and the stalled try, woken, writes nothing more. Its issue
create, should it land after the retry sent the mail, is closed as a duplicate (not planned,
no state label, a comment naming the mail), never indexed or ledgered: one mail, one index row,
one ledger entry."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from bot.app.replicas import Replica
from bot.store import idempotency, ledger, open_store
from bot.store.db import Store
from bot.store.queue import DEAD_AFTER
from localforge import LocalForge
from tests import pg
from tests.deployed import deploy
from tests.harness.runner import vaultmail
from tests.support import free_port, until

SCOUT = "acme/scout-vault"
CREATE = "POST /repos/{owner}/{repo}/issues"
GUARD = 90.0  # a hang guard, never a synchronisation


async def _silence(store: Store, replica: str) -> None:
    """As if `replica` had stopped beating (a SIGSTOP) DEAD_AFTER and more ago."""
    async with store.transaction() as db:
        await db.execute("UPDATE replicas SET seen_at=? WHERE id=?",
                         (time.time() - DEAD_AFTER - 1, replica))


async def test_a_try_whose_key_was_taken_over_writes_nothing_and_gets_the_new_result(
        two_replicas: tuple[Store, Store]) -> None:
    """The cheap fence before a create: a's try stalls (before its forge write) past
    DEAD_AFTER; b's retry takes the key over and finishes. a, woken, checks its claim before
    writing, writes nothing, and answers b's result."""
    a, b = two_replicas
    claimed, woken = asyncio.Event(), asyncio.Event()
    wrote: list[str] = []

    async def stalled() -> dict[str, Any]:
        claimed.set()
        await woken.wait()
        await idempotency.check_claim()  # the fence (Mailer.deliver, before create_issue)
        wrote.append("a")
        return {"mail": "a's"}

    async def retry() -> dict[str, Any]:
        wrote.append("b")
        return {"mail": "b's"}

    first = asyncio.create_task(a.once("tool:mail_send:agent:builder", "k1", "fp", stalled))
    await asyncio.wait_for(claimed.wait(), GUARD)
    await _silence(b, "replica-a")
    assert await asyncio.wait_for(b.once("tool:mail_send:agent:builder", "k1", "fp", retry),
                                  GUARD) == {"mail": "b's"}
    woken.set()
    assert await asyncio.wait_for(first, GUARD) == {"mail": "b's"}
    assert wrote == ["b"], "a try that lost its claim wrote after the fence"


@dataclass
class Two:
    forge: LocalForge
    a: Replica
    b: Replica
    env: dict[str, str]
    database_url: str
    api: dict[str, str]
    marco: dict[str, str]


@pytest.fixture
async def two(tmp_path: Path) -> AsyncIterator[Two]:
    ports = [free_port() for _ in range(2)]
    urls = [f"http://127.0.0.1:{p}" for p in ports]
    deployed = await deploy(f"{urls[0]}/webhook")
    forge = deployed.forge
    forge.webhooks.timeout = 2.0  # a stopped replica holds a delivery this long, no more
    forge.balance(f"{urls[0]}/webhook", [f"{u}/webhook" for u in urls])
    database_url = await pg.fresh_database()
    env = {**deployed.env(str(tmp_path / "data")), "DATABASE_URL": database_url,
           "VAULTMAIL_DOCTOR_SECONDS": "3600"}
    a, b = (Replica(f"replica-{n + 1}", url,
                    {**env, "PORT": str(port), "REPLICA_ID": f"replica-{n + 1}"},
                    tmp_path / f"replica-{n + 1}.log")
            for n, (port, url) in enumerate(zip(ports, urls, strict=True)))
    deployed.install()
    try:
        await asyncio.gather(a.start(), b.start())
        code, out = await vaultmail(env, "token", "create", "agent:builder", "--org",
                                    deployed.org)
        assert code == 0, out
        yield Two(forge, a, b, env, database_url,
                  {"Authorization": f"Bearer {out.split()[-1]}"},
                  {"Authorization": f"token {deployed.tokens['marco']}"})
    finally:
        for r in (a, b):
            if r.proc is not None and r.proc.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    r.proc.send_signal(signal.SIGCONT)
        await asyncio.gather(a.kill(), b.kill())
        await forge.stop()
        await pg.drop_database(database_url)


async def test_a_replica_stopped_while_its_create_is_in_flight_leaves_one_mail(
        two: Two) -> None:
    """a's mail_send reaches the forge's create and is held there; a is SIGSTOPped past
    DEAD_AFTER; the client's retry on b sends the mail. The forge then creates a's issue and a
    is let go: its late issue is closed as a duplicate of b's, and both clients get b's mail."""
    forge = two.forge
    held = forge.faults.hold(CREATE, count=1)
    send = {"to": "scout", "subject": "Stalled", "body": "once", "idempotencyKey": "stall-1"}
    timeout = aiohttp.ClientTimeout(total=GUARD)
    async with aiohttp.ClientSession(timeout=timeout) as s:

        async def mail_send(replica: Replica) -> dict[str, Any]:
            async with s.post(replica.url + "/api/v1/tools/mail_send", headers=two.api,
                              json=send) as resp:
                assert resp.status == 200, await resp.text()
                mail: dict[str, Any] = (await resp.json())["mail"]
                return mail

        first = asyncio.create_task(mail_send(two.a))
        await asyncio.wait_for(held.arrived.wait(), GUARD)  # a's create is at the forge
        assert two.a.proc is not None
        two.a.proc.send_signal(signal.SIGSTOP)
        retried = await asyncio.wait_for(mail_send(two.b), GUARD)  # b takes the key over
        held.release()  # a's create lands now, after b's; its answer waits for a
        two.a.proc.send_signal(signal.SIGCONT)
        answered = await asyncio.wait_for(first, GUARD)
        assert answered == retried, "both tries answer the one mail"

        async def handled() -> bool:
            """The late issue's `opened`, handled (its worker closes it as a duplicate too,
            writing its comment and deleting the later one): what is read below is final."""
            await forge.webhooks_idle()
            for replica in (two.a, two.b):
                async with s.get(replica.url + "/healthz") as resp:
                    if (await resp.json())["queue_pending"]:
                        return False
            return True

        await until(handled, timeout=GUARD)
        marco = two.marco
        async with s.get(forge.url + f"/repos/{SCOUT}/issues?state=all&per_page=100",
                         headers=marco) as resp:
            issues = [i for i in await resp.json() if i["title"] == "Stalled"]
        late = [i for i in issues if i["number"] != retried["number"]]
        assert len(issues) == 2 and len(late) == 1, [i["number"] for i in issues]
        mail = next(i for i in issues if i["number"] == retried["number"])
        dup = late[0]
        assert (mail["state"], _labels(mail)) == ("open", ["mail:new"])
        assert (dup["state"], dup["state_reason"], _labels(dup)) == (
            "closed", "not_planned", []), "the late duplicate is closed, in no inbox"
        async with s.get(forge.url + f"/repos/{SCOUT}/issues/{dup['number']}/comments",
                         headers=marco) as resp:
            said = [c["body"] for c in await resp.json()]
        assert len(said) == 1 and f"duplicate of #{mail['number']}" in said[0], said

    store = await open_store(two.database_url)
    try:
        rows = await store.fetchall("SELECT vault, number FROM mails WHERE mail_id=?",
                                    (retried["mail_id"],))
        entries = await ledger.entries(store, limit=1000)
    finally:
        await store.close()
    assert [tuple(r) for r in rows] == [(SCOUT, mail["number"])]
    sent = [e.subject for e in entries
            if e.event == "mail.sent" and e.data.get("mail") == retried["mail_id"]]
    assert sent == [f"{SCOUT}#{mail['number']}"], "the send is ledgered once"


def _labels(issue: dict[str, Any]) -> list[str]:
    return sorted(lb["name"] for lb in issue["labels"] if lb["name"].startswith("mail:"))
