"""Readiness tells the truth about writes (issue 28): with the index unable to take a write
(its disk full: SQLite's page limit stands in for it), /readyz says not ready, naming the
failed write, instead of staying green while every write fails; a write that lands again
makes it ready again."""

from __future__ import annotations

from typing import Any

import aiohttp
import pytest

from bot.app.embedded import Embedded


async def _ready(session: aiohttp.ClientSession, embedded: Embedded) -> tuple[int, Any]:
    async with session.get(embedded.app_url + "/readyz") as resp:
        return resp.status, await resp.json()


async def _page_limit(embedded: Embedded, pages: int | None) -> None:
    async with embedded.services.store.transaction() as db:
        if pages is None:
            await db.execute("PRAGMA max_page_count=1073741823")
            return
        await db.execute(f"PRAGMA max_page_count={pages}")


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
async def test_readiness_fails_while_writes_fail_and_recovers_after(
        embedded: Embedded, session: aiohttp.ClientSession, tools: Any) -> None:
    marco = tools("human:marco@acme.com")
    assert (await _ready(session, embedded))[0] == 200
    store = embedded.services.store
    pages = (await store.fetchone("PRAGMA page_count"))[0]
    await _page_limit(embedded, pages)  # the disk is full
    failed = None
    for i in range(200):  # until a write needs a page the file cannot have
        status, body = await marco.raw("mail_send", {"to": "scout", "subject": f"n{i}",
                                                     "body": "x" * 3000})
        if status != 200:
            failed = status
            break
    assert failed is not None, "a write failed"
    status, body = await _ready(session, embedded)
    assert status == 503 and "database" in body["failed"], body
    await _page_limit(embedded, None)  # room again
    assert (await marco.raw("mail_send", {"to": "scout", "subject": "again",
                                          "body": "x"}))[0] == 200
    assert (await _ready(session, embedded))[0] == 200
