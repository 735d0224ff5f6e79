"""An index restored from an old backup, the forge having moved on (review r2, s46): the forge
is the source of truth. The app catches the index up from it at start, before serving; the
doctor never undoes a change the index has not heard of; a keyed send retried finds its mail;
reindex keeps the original of two issues carrying one mail id. SQLite: the backup is the
index's file copied aside and back, as an operator does it."""

from __future__ import annotations

import shutil
from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path

import aiohttp
import pytest

from bot.app.embedded import Embedded, start_embedded
from bot.mail.reindex import reindex
from bot.store import mails
from tests.support import ToolClient, app_key

MARCO, SCOUT_VAULT = "human:marco@acme.com", "acme/scout-vault"


class Office:
    """The embedded office on a forge kept in the data directory, stopped and started again
    as an operator does, with the index copied aside (a backup) and back (a restore)."""

    def __init__(self, data: Path) -> None:
        self.data, self.backup = data, data.parent / "backup.sqlite3"
        self.app: Embedded | None = None

    async def start(self) -> Embedded:
        self.app = await start_embedded(data_dir=self.data, port=0, forge_port=0,
                                        persist_forge=True, app_key=app_key())
        return self.app

    async def stop(self) -> None:
        assert self.app is not None
        await self.app.settle()
        await self.app.stop()
        self.app = None

    def back_up(self) -> None:
        shutil.copy(self.data / "index.sqlite3", self.backup)

    def restore(self) -> None:
        for f in self.data.glob("index.sqlite3*"):
            f.unlink()
        shutil.copy(self.backup, self.data / "index.sqlite3")


@pytest.fixture
async def office(tmp_path: Path) -> AsyncIterator[Office]:
    office = Office(tmp_path / "data")
    try:
        yield office
    finally:
        if office.app is not None:
            await office.app.stop()


async def test_reindex_keeps_the_original_of_two_issues_carrying_one_mail_id(
        office: Office, session: aiohttp.ClientSession) -> None:
    """A second issue the app opened with a mail's header (a send retried after a restore,
    before this fix) while the index points at it: reindex kept the one the index held,
    calling the original, with its replies, a copy."""
    app = await office.start()
    tools = ToolClient(session, app, MARCO)
    mail = (await tools("mail_send", to="scout", subject="New", body="new"))["mail"]
    await app.settle()
    forge = app.services.forge_for(None)
    number = int(mail["ref"].partition("#")[2])
    original = await forge.get_issue(SCOUT_VAULT, number)
    second = await forge.create_issue(SCOUT_VAULT, "New", original["body"],
                                      labels=["mail:new"])
    row = await mails.get_mail(app.services.store, mail["mail_id"])
    assert row is not None
    async with app.services.store.transaction() as db:  # the index at the second, as r2 had it
        await mails.put_mail(db, replace(row, number=int(second["number"])))
    report = await reindex(app.services.store, forge, app.office, app.services.keyring,
                           app_login=app.services.bot_login)
    assert report.copies == [f"{SCOUT_VAULT}#{second['number']}"], report
    row = await mails.get_mail(app.services.store, mail["mail_id"])
    assert row is not None and row.ref == mail["ref"]


