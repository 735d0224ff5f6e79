"""A handler decides under the mail's lock what it applies under it (issue 27): a reply whose
view of the mail went stale (a close landed between its look and its write) still leaves the
issue in a state its labels describe."""

from __future__ import annotations

import aiohttp

from bot.app.embedded import Embedded
from bot.mail.mailer import Mailer
from bot.store import mails
from tests.support import ToolClient, label_names

MARCO, SCOUT = "human:marco@acme.com", "agent:scout"


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
