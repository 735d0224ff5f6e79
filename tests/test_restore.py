"""An index restored from an old backup, the forge having moved on (review r2, s46): the forge
is the source of truth. The app catches the index up from it at start, before serving; the
doctor never undoes a change the index has not heard of; a keyed send retried finds its mail;
reindex keeps the original of two issues carrying one mail id. On both engines: the backup
is the index copied aside with the app stopped, and copied back."""

from __future__ import annotations

import logging
import re
import shutil
from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path

import aiohttp
import asyncpg
import pytest

from bot.app.embedded import Embedded, start_embedded
from bot.email.keys import comment_key
from bot.mail.reindex import reindex
from bot.store import mails
from tests import pg
from tests.support import Actor, ToolClient, app_key, label_names
from tests.test_tamper import vaultmail

MARCO, SCOUT_VAULT = "human:marco@acme.com", "acme/scout-vault"


def _number(ref: str) -> int:
    return int(ref.partition("#")[2])


class Office:
    """The embedded office on a forge kept in the data directory, stopped and started again
    as an operator does, with the index copied aside (a backup) and back (a restore): on
    SQLite its file, on PostgreSQL its database (copied as a template)."""

    def __init__(self, data: Path, database_url: str) -> None:
        self.data, self.url = data, database_url
        self.backup = data.parent / "backup.sqlite3"
        self.app: Embedded | None = None

    async def start(self) -> Embedded:
        self.app = await start_embedded(data_dir=self.data, port=0, forge_port=0,
                                        persist_forge=True, database_url=self.url,
                                        app_key=app_key())
        await self.app.vaults_caught_up()  # (beside the start: what the tests look at)
        return self.app

    async def stop(self) -> None:
        assert self.app is not None
        await self.app.settle()
        await self.app.stop()
        self.app = None

    async def back_up(self) -> None:
        if not self.url:
            shutil.copy(self.data / "index.sqlite3", self.backup)
            return
        await _admin(f'CREATE DATABASE "{self._name}_b" TEMPLATE "{self._name}"')

    async def restore(self) -> None:
        if not self.url:
            for f in self.data.glob("index.sqlite3*"):
                f.unlink()
            shutil.copy(self.backup, self.data / "index.sqlite3")
            return
        await _admin(f'DROP DATABASE "{self._name}" WITH (FORCE)')
        await _admin(f'CREATE DATABASE "{self._name}" TEMPLATE "{self._name}_b"')
        await _admin(f'DROP DATABASE "{self._name}_b"')

    @property
    def _name(self) -> str:
        return self.url.rsplit("/", 1)[1]


async def _admin(statement: str) -> None:
    admin = await asyncpg.connect(pg.cluster_url())
    try:
        await admin.execute(statement)
    finally:
        await admin.close()


@pytest.fixture
async def office(tmp_path: Path, database_url: str) -> AsyncIterator[Office]:
    office = Office(tmp_path / "data", database_url)
    try:
        yield office
    finally:
        if office.app is not None:
            await office.app.stop()


async def test_a_mail_the_app_closed_after_the_backup_is_not_reopened(
        office: Office, session: aiohttp.ClientSession, caplog: pytest.LogCaptureFixture
) -> None:
    """Acted out: marco's "Old" sent, the index backed up, marco closed it, the backup
    restored. The doctor read the app's close as its own write lost (the index said
    mail:new) and would reopen the mail; the leader's pass every 900 s did."""
    app = await office.start()
    old = (await ToolClient(session, app, MARCO)("mail_send", to="scout", subject="Old",
                                                 body="old"))["mail"]
    await office.stop()
    await office.back_up()
    app = await office.start()
    await ToolClient(session, app, MARCO)("mail_close", mail=old["ref"])
    await office.stop()
    await office.restore()

    with caplog.at_level(logging.WARNING, logger="vaultmail.doctor"):
        app = await office.start()
    said = [r for r in caplog.records if r.getMessage().startswith(
        "the index was behind the forge")]
    assert [getattr(r, "issue", None) for r in said] == [old["ref"]], caplog.text
    code, out = await vaultmail(app, "doctor", "--dry-run")
    assert code == 0 and "would repair: 0" in out and "flagged: 0" in out, out
    _, out = await vaultmail(app, "doctor")
    number = int(old["ref"].partition("#")[2])
    issue = await Actor(session, app, "marco").issue(SCOUT_VAULT, number)
    assert (issue["state"], label_names(issue)) == ("closed", ["mail:closed"]), out
    row = await mails.get_mail(app.services.store, old["mail_id"])
    assert row is not None and row.state == "mail:closed", "the index caught up at start"
    got = await ToolClient(session, app, MARCO)("mail_get", mail=old["ref"])
    assert got["mail"]["state"] == "mail:closed"


async def test_the_doctor_by_hand_on_a_restored_index_catches_it_up_and_undoes_nothing(
        office: Office, session: aiohttp.ClientSession) -> None:
    """`vaultmail doctor` run on the restored index before the app starts again (the forge
    up, the app not): it said the close was the app's write lost (`would repair`), and
    without --dry-run reopened the mail; the mail sent after the backup it did not see."""
    app = await office.start()
    old = (await ToolClient(session, app, MARCO)("mail_send", to="scout", subject="Old",
                                                 body="old"))["mail"]
    await office.stop()
    await office.back_up()
    app = await office.start()
    new = (await ToolClient(session, app, MARCO)("mail_send", to="scout", subject="New",
                                                 body="new"))["mail"]
    await ToolClient(session, app, MARCO)("mail_close", mail=old["ref"])
    await app.settle()
    await app.runner.cleanup()  # the app stopped, its forge left up
    await office.restore()

    code, out = await vaultmail(app, "doctor", "--dry-run")
    assert re.search(rf"{old['ref']}\s+state .* would catch up", out), out
    assert re.search(rf"{new['ref']}\s+index .* would catch up", out), out
    assert "would repair: 0" in out and "repaired: 0" in out, out
    code, out = await vaultmail(app, "doctor")
    assert "caught up: 2" in out and "repaired: 0" in out, out
    issue = await Actor(session, app, "marco").issue(SCOUT_VAULT, _number(old["ref"]))
    assert (issue["state"], label_names(issue)) == ("closed", ["mail:closed"]), out
    await app.forge.stop()
    office.app = None
    app = await office.start()  # what the doctor took is the index's now
    got = await ToolClient(session, app, MARCO)("mail_list")
    assert {(m["ref"], m["state"]) for m in got["mails"]} == {
        (old["ref"], "mail:closed"), (new["ref"], "mail:new")}


async def test_a_keyed_send_retried_after_a_restore_returns_the_mail_it_sent(
        office: Office, session: aiohttp.ClientSession) -> None:
    """Acted out: after the backup marco sent "New" with key k1 (#2), scout opened and
    replied; the backup restored, marco's retry with k1 opened a second issue #3 with the
    same mail id, and reindex then kept #3 and called the original #2 a copy."""
    app = await office.start()
    await ToolClient(session, app, MARCO)("mail_send", to="scout", subject="Old", body="old")
    await office.stop()
    await office.back_up()
    app = await office.start()
    new = (await ToolClient(session, app, MARCO)(
        "mail_send", to="scout", subject="New", body="new", idempotencyKey="k1"))["mail"]
    await ToolClient(session, app, "agent:scout")("mail_open", mail=new["ref"])
    await ToolClient(session, app, "agent:scout")("mail_reply", mail=new["ref"], body="got it")
    await office.stop()
    await office.restore()

    app = await office.start()
    got = await ToolClient(session, app, "agent:scout")("mail_get", mail=new["mail_id"])
    assert got["mail"]["ref"] == new["ref"], "the index caught up at start"
    again = (await ToolClient(session, app, MARCO)(
        "mail_send", to="scout", subject="New", body="new", idempotencyKey="k1"))["mail"]
    assert (again["ref"], again["mail_id"]) == (new["ref"], new["mail_id"])
    await app.settle()
    issues = await Actor(session, app, "marco").issues(SCOUT_VAULT)
    assert sorted(i["title"] for i in issues) == ["New", "Old"], "no second issue"


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
                           app_login=app.services.bot_login,
                           comment_key=comment_key(app.services.settings.data_dir, "acme"))
    assert report.copies == [f"{SCOUT_VAULT}#{second['number']}"], report
    row = await mails.get_mail(app.services.store, mail["mail_id"])
    assert row is not None and row.ref == mail["ref"]


