"""One close, one ledger entry, however the retries overlap (issue 29): a client that retries
`mail_close` while its first call is still in flight, on one process or on replicas sharing the
index, closes the mail once and ledgers `mail.closed` once."""

from __future__ import annotations

import asyncio

import aiohttp

from bot.app.embedded import Embedded
from bot.store import ledger
from tests.support import ToolClient

MARCO = "human:marco@acme.com"


async def test_overlapping_close_retries_ledger_one_close(
        embedded: Embedded, session: aiohttp.ClientSession) -> None:
    marco = ToolClient(session, embedded, MARCO)
    sent = (await marco("mail_send", to="scout", subject="Close me", body="x"))["mail"]
    await embedded.settle()
    answers = await asyncio.gather(*(marco.raw("mail_close", {"mail": sent["ref"]})
                                     for _ in range(7)))
    assert {status for status, _ in answers} == {200}, answers
    await embedded.settle()
    closed = [e for e in await ledger.entries(embedded.services.store, event="mail.closed")
              if e.data.get("mail") == sent["mail_id"]]
    assert len(closed) == 1, [e.data for e in closed]


async def test_a_close_that_lost_the_race_to_another_writer_ledgers_nothing(
        embedded: Embedded, session: aiohttp.ClientSession) -> None:
    """A writer whose view of the mail is stale (another replica moved it meanwhile) changes
    the index only from the state it saw: the one that lost writes no second entry."""
    from bot.store import mails

    marco = ToolClient(session, embedded, MARCO)
    sent = (await marco("mail_send", to="scout", subject="Race", body="x"))["mail"]
    await embedded.settle()
    store = embedded.services.store
    async with store.transaction() as db:
        assert await mails.set_state(db, sent["mail_id"], "mail:closed",
                                     expected="mail:new")
    async with store.transaction() as db:  # the second writer still thinks it is new
        assert not await mails.set_state(db, sent["mail_id"], "mail:closed",
                                         expected="mail:new")
