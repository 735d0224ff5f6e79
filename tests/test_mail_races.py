"""A handler decides under the mail's lock what it applies under it (issue 27): a reply whose
view of the mail went stale (a close landed between its look and its write) still leaves the
issue in a state its labels describe. A keyed reply whose try stalls with a write in flight,
taken over by another replica, is on the mail once and copied once."""

from __future__ import annotations

import asyncio
import copy
from typing import Any

import aiohttp
import pytest

from bot.app.embedded import Embedded
from bot.forge.github import GitHubForge
from bot.mail.mailer import Mailer
from bot.store import mails, open_store
from bot.store.db import Store
from bot.store.idempotency import Result
from tests.support import Actor, ToolClient, label_names
from tests.test_stalled_send import CREATE, GUARD, _silence

MARCO, SCOUT = "human:marco@acme.com", "agent:scout"
COMMENT = "POST /repos/{owner}/{repo}/issues/{issue_number}/comments"


async def test_a_reply_racing_a_close_never_leaves_a_closed_issue_labelled_replied(
        embedded: Embedded, session: aiohttp.ClientSession) -> None:
    marco, scout = ToolClient(session, embedded, MARCO), ToolClient(session, embedded, SCOUT)
    sent = (await marco("mail_send", to="scout", subject="Race", body="x"))["mail"]
    await scout("mail_open", mail=sent["ref"])
    await embedded.settle()
    store = embedded.services.store
    seen = await mails.get_mail(store, sent["mail_id"])  # the reply's look: working
    assert seen is not None and seen.state == "mail:working"
    await marco("mail_close", mail=sent["ref"])  # the close lands first
    await embedded.settle()
    services = embedded.services
    mailer = Mailer(services, services.forge_for_org("acme"), embedded.office)
    await mailer.reply(seen, SCOUT, "Done.", posted=False, key="r1")
    await embedded.settle()
    issue = await marco.session.get(
        f"{embedded.forge.url}/repos/acme/scout-vault/issues/{sent['number']}",
        headers={"Authorization": f"token {embedded.forge_tokens['admin']}"})
    found = await issue.json()
    labels = label_names(found)
    assert (found["state"], labels) == ("open", ["mail:replied"]), (found["state"], labels)
    row = await mails.get_mail(store, sent["mail_id"])
    assert row is not None and row.state == "mail:replied"


@pytest.mark.parametrize("held_at", [COMMENT, CREATE], ids=["the-comment", "the-copy"])
async def test_a_reply_whose_stalled_write_lands_late_is_on_the_mail_and_copied_once(
        embedded: Embedded, session: aiohttp.ClientSession, database_url: str,
        held_at: str) -> None:
    """builder mailed scout; scout's keyed reply (`mail_reply`'s once) is tried by replica a,
    whose write (its comment on the mail, or the copy's issue in builder's vault) is held at
    the forge; a stalls past DEAD_AFTER and b, the retry, takes the key over and finishes.
    a's write then lands, late: one "replied" comment stays on the mail, and builder has one
    copy in its inbox (a late one closed as a duplicate)."""
    builder = ToolClient(session, embedded, "agent:builder")
    sent = (await builder("mail_send", to="scout", subject="Stall", body="x"))["mail"]
    await embedded.settle()
    services = embedded.services
    mail = await mails.get_mail(services.store, sent["mail_id"])
    assert mail is not None
    forge = services.forge_for_org("acme")
    assert isinstance(forge, GitHubForge)
    index = database_url or str(embedded.data_dir / "index.sqlite3")
    a, b = await open_store(index), await open_store(index)
    await a.join("replica-a")
    await b.join("replica-b")

    async def reply(store: Store, its_forge: GitHubForge) -> Result:
        replica = copy.copy(services)  # another replica: its own store, its own forge client
        replica.store = store
        mailer = Mailer(replica, its_forge, embedded.office)

        async def work() -> Result:
            return {"mail": (await mailer.reply(mail, SCOUT, "Done.", posted=False,
                                                key="r1")).ref}
        return await store.once(f"tool:mail_reply:acme:{SCOUT}", "r1", "fp", work)

    try:
        held = embedded.forge.faults.hold(held_at, count=1)
        first = asyncio.create_task(reply(a, forge))
        await asyncio.wait_for(held.arrived.wait(), GUARD)  # a's write is at the forge
        await _silence(b, "replica-a")
        retried = await asyncio.wait_for(
            reply(b, GitHubForge(forge.client, forge.installation_id)), GUARD)
        held.release()  # a's write lands now, after b's
        assert await asyncio.wait_for(first, GUARD) == retried
    finally:
        await a.close()
        await b.close()
    await embedded.settle()
    marco = Actor(session, embedded, "marco")
    comments = await marco.comments("acme/scout-vault", sent["number"])
    replied = [c for c in comments if "replied:" in c["body"]]
    assert len(replied) == 1, [c["id"] for c in replied]
    copies: list[Any] = [i for i in await marco.issues("acme/builder-vault")
                         if i["title"] == "Re: Stall"]
    inbox = [i for i in copies if i["state"] == "open"]
    assert len(inbox) == 1 and label_names(inbox[0]) == ["mail:new"], [
        (i["number"], i["state"], label_names(i)) for i in copies]


async def test_a_tamper_warning_whose_stalled_comment_lands_late_is_on_the_mail_once(
        embedded: Embedded, session: aiohttp.ClientSession, database_url: str) -> None:
    """builder's mail to scout is found changed (the warning owed: flagged, ledgered); the
    warning is a comment on it, once. Replica a flagged it and posts the warning, its create
    held at the forge; the tamper lock is lost under a (PostgreSQL: its session ended by the
    server, a not told: docs/internals.md), and b, finding the warning still owed, posts it.
    a's create lands late: one warning stays."""
    builder = ToolClient(session, embedded, "agent:builder")
    sent = (await builder("mail_send", to="scout", subject="Tamper", body="x"))["mail"]
    await embedded.settle()
    services = embedded.services
    mail = await mails.get_mail(services.store, sent["mail_id"])
    assert mail is not None
    forge = services.forge_for_org("acme")
    assert isinstance(forge, GitHubForge)
    index = database_url or str(embedded.data_dir / "index.sqlite3")
    a, b = await open_store(index), await open_store(index)
    await a.join("replica-a")
    await b.join("replica-b")
    warning = "This mail was changed after it was sent (body changed after sending)"

    def mailer(store: Store, its_forge: GitHubForge) -> Mailer:
        replica = copy.copy(services)  # another replica: its own store, its own forge client
        replica.store = store
        return Mailer(replica, its_forge, embedded.office)

    async def flag_and_warn() -> None:  # (check_tamper's, under the tamper lock)
        its = mailer(a, forge)
        assert await its._flag_tampered(mail, "office", "body changed after sending")
        await its._warn_tampered(mail, warning)

    try:
        held = embedded.forge.faults.hold(COMMENT, count=1)
        first = asyncio.create_task(flag_and_warn())
        await asyncio.wait_for(held.arrived.wait(), GUARD)  # a's warning is at the forge
        assert await mails.tamper_flag(b, mail.mail_id) == mails.WARNING_OWED
        await asyncio.wait_for(mailer(b, GitHubForge(forge.client, forge.installation_id))
                               ._warn_tampered(mail, warning), GUARD)
        held.release()  # a's warning lands now, after b's
        await asyncio.wait_for(first, GUARD)
    finally:
        await a.close()
        await b.close()
    await embedded.settle()
    comments = await Actor(session, embedded, "marco").comments("acme/scout-vault",
                                                                sent["number"])
    warned = [c for c in comments if warning in c["body"]]
    assert len(warned) == 1, [c["id"] for c in warned]
