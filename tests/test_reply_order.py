"""A thread's changes apply in the order they happened on the forge, not the order their
deliveries were handled (issue 28): a reply whose webhook arrives late (dropped, then asked
for again by the reconciler) does not reopen a mail closed after it."""

from __future__ import annotations

from typing import Any

from bot.app.embedded import Embedded
from bot.store import ledger, mails
from tests.support import label_names

SCOUT_VAULT = "acme/scout-vault"


async def test_a_reply_delivered_after_a_later_close_does_not_reopen_the_mail(
        embedded: Embedded, person: Any, tools: Any) -> None:
    marco, scout = tools("human:marco@acme.com"), person("scout-bot")
    sent = (await marco("mail_send", to="scout", subject="Prices", body="EU prices?"))["mail"]
    await embedded.settle()
    number = sent["ref"].rsplit("#", 1)[1]

    # scout answers on the forge; the webhook of its comment is lost on the way
    embedded.forge.faults.drop_webhooks(count=1)
    await scout.comment(SCOUT_VAULT, int(number), "EU prices are up 3 %.")
    await embedded.settle()
    row = await mails.get_mail(embedded.services.store, sent["mail_id"])
    assert row is not None and row.state == "mail:new", "the reply is not delivered yet"

    # later (on the forge's clock), marco closes the mail
    embedded.forge.clock.advance(5)
    closed = (await marco("mail_close", mail=sent["ref"]))["mail"]
    assert closed["state"] == "mail:closed"
    await embedded.settle()

    # the reply's delivery arrives now: it happened before the close, so the close stands
    assert await embedded.reconciler.run_once() == 1
    await embedded.settle()

    issue = await person("marco").issue(SCOUT_VAULT, int(number))
    assert issue["state"] == "closed" and label_names(issue) == ["mail:closed"], (
        issue["state"], label_names(issue))
    row = await mails.get_mail(embedded.services.store, sent["mail_id"])
    assert row is not None and row.state == "mail:closed"
    moves = [e.event for e in await ledger.entries(embedded.services.store)
             if e.data.get("mail") == sent["mail_id"] and e.event in
             ("mail.replied", "mail.closed", "mail.opened")]
    assert moves == ["mail.closed"], moves


async def test_a_close_by_hand_delivered_after_a_later_reply_leaves_the_mail_replied(
        embedded: Embedded, person: Any, tools: Any) -> None:
    """The other way round: marco closes the issue on the forge (its webhook is lost), scout
    replies after it (a reply on a closed mail reopens it); the close, delivered last, is
    older than the reply: the mail ends replied, its issue open, as the forge's order says."""
    marco, scout = person("marco"), person("scout-bot")
    sent = (await tools("human:marco@acme.com")("mail_send", to="scout", subject="Q",
                                                 body="?"))["mail"]
    await embedded.settle()
    number = int(sent["ref"].rsplit("#", 1)[1])

    embedded.forge.faults.drop_webhooks(count=1)
    await marco.call("PATCH", f"/repos/{SCOUT_VAULT}/issues/{number}", {"state": "closed"},
                     expect=200)
    await embedded.settle()
    embedded.forge.clock.advance(5)
    await scout.comment(SCOUT_VAULT, number, "Here is the answer.")
    await embedded.settle()

    assert await embedded.reconciler.run_once() == 1  # marco's close, late
    await embedded.settle()

    issue = await marco.issue(SCOUT_VAULT, number)
    row = await mails.get_mail(embedded.services.store, sent["mail_id"])
    assert row is not None and row.state == "mail:replied"
    assert (issue["state"], label_names(issue)) == ("open", ["mail:replied"]), (
        issue["state"], label_names(issue))
