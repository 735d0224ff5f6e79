"""Replicas on PostgreSQL through a database restart or failover: every session is cut and no
new one is let in for a while (tests/pg.py:outage). A replica rides it out: its worker keeps
trying, its listener for the other replicas' wake-ups opens again, and mail sent once the
database is back is handled."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest

from bot.app.embedded import Embedded
from bot.store import Store
from tests import pg
from tests.support import label_names, until

SCOUT_VAULT = "acme/scout-vault"


@pytest.mark.parametrize("database_url", ["postgresql"], indirect=True)
async def test_mail_sent_after_a_database_restart_is_handled(
        embedded: Embedded, database_url: str, person: Any,
        caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="vaultmail.replica")
    async with pg.outage(database_url):
        # two heartbeats fail, a second apart: the worker, which looks for work every half
        # second, has found the database away too (it used to end there)
        await until(lambda: sum("heartbeat failed" in r.getMessage()
                                for r in caplog.records) >= 2, timeout=30)
    marco = person("marco")
    issue = await marco.open_issue(SCOUT_VAULT, "After the restart", "Still there?")
    await embedded.settle()
    assert label_names(await marco.issue(SCOUT_VAULT, issue["number"])) == ["mail:new"]


async def test_a_replica_hears_the_others_again_after_a_database_restart(
        two_replicas: tuple[Store, Store]) -> None:
    a, b = two_replicas
    heard: list[str] = []
    reopened = asyncio.Event()
    await a.listen(heard.extend, reopened.set)  # type: ignore[attr-defined]
    async with pg.outage(a._url):  # type: ignore[attr-defined]  # noqa: SLF001
        pass
    await asyncio.wait_for(reopened.wait(), 30)  # (long polls were woken to look again)
    await b.broadcast(["agent:scout"])  # type: ignore[attr-defined]
    await until(lambda: heard == ["agent:scout"])


@pytest.mark.parametrize("database_url", ["postgresql"], indirect=True)
async def test_a_tool_called_while_the_database_is_away_answers_503_with_retry_after(
        embedded: Embedded, database_url: str, tools: Any) -> None:
    """As intake does: a client that gets 503 with Retry-After tries again; a 500 says the
    app is broken (issue 29)."""
    marco = tools("human:marco@acme.com")
    async with pg.outage(database_url), marco.session.post(
            marco.url + "mail_list", json={},
            headers={"Authorization": f"Bearer {marco.token}"}) as resp:
        status, body, retry = resp.status, await resp.json(), resp.headers.get("Retry-After")
    assert status == 503 and retry == "5", body
    assert body["error"]["code"] == "unavailable" and "try again" in body["error"]["message"]
    assert (await marco("mail_list"))["mails"] == []  # and once it is back, it answers


@pytest.mark.parametrize("database_url", ["postgresql"], indirect=True)
async def test_mcp_while_the_database_is_away_answers_503_with_retry_after(
        embedded: Embedded, database_url: str, tools: Any) -> None:
    marco = tools("human:marco@acme.com")
    request = {"jsonrpc": "2.0", "id": 1, "method": "tools/list"}
    headers = {"Authorization": f"Bearer {marco.token}", "Accept":
               "application/json, text/event-stream", "MCP-Protocol-Version": "2025-11-25"}
    async with pg.outage(database_url), marco.session.post(
            embedded.app_url + "/mcp", json=request, headers=headers) as resp:
        status, body, retry = resp.status, await resp.json(), resp.headers.get("Retry-After")
    assert status == 503 and retry == "5", body
    assert body["error"]["data"]["code"] == "unavailable"


async def test_a_claim_a_failed_try_could_not_let_go_of_is_let_go_of_once_the_store_is_back(
        two_replicas: tuple[Store, Store]) -> None:
    """A try fails while the database is away, so its claim cannot be let go of then: it is
    with the worker's next write (`stray`, `let_go_in`). Else a replica given the key later
    waits, as long as this one lives, for a result no one is at work on."""
    a, b = two_replicas
    async with a.transaction() as db:  # a lives throughout (as its heartbeat would keep it)
        await db.execute("UPDATE replicas SET seen_at=vm_now()+3600 WHERE id=?",
                         (a.replica_id,))
    outage = pg.outage(a._url)  # type: ignore[attr-defined]  # noqa: SLF001

    async def fails_in_an_outage() -> dict[str, int]:
        await outage.__aenter__()
        raise RuntimeError("the forge answered 502")

    with pytest.raises(Exception):  # noqa: B017,PT011 (the store's own error: it is away)
        await a.once("forge", "k", "", fails_in_an_outage)
    await outage.__aexit__(None, None, None)
    row = await b.fetchone("SELECT owner FROM idempotency WHERE key='k'")
    assert row is not None and row["owner"] == a.replica_id  # still a's, a claim no one works on
    stray = a.stray()
    async with a.transaction() as db:  # (the worker's next write)
        await a.let_go_in(db, stray)

    async def runs() -> dict[str, int]:
        return {"n": 1}

    assert await asyncio.wait_for(b.once("forge", "k", "", runs), 10) == {"n": 1}
