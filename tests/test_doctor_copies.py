"""the doctor finds a vanished reply copy by its mail id anywhere in the body of an
issue the app opened, and the app opens issues whose bodies others wrote (every mail)."""

from __future__ import annotations

import asyncio
from typing import Any

from bot.app.doctor import Doctor
from bot.app.embedded import Embedded
from bot.mail.mailer import keyed_mail_ids
from bot.store import mails
from tests.support import label_names

SCOUT_VAULT, BUILDER_VAULT = "acme/scout-vault", "acme/builder-vault"
CREATE_ISSUE = "POST /repos/{owner}/{repo}/issues"


async def test_a_mail_naming_a_lost_copys_id_is_not_taken_for_the_copy(
        embedded: Embedded, person: Any, tools: Any) -> None:
    marco, builder, scout = (tools("human:marco@acme.com"), tools("agent:builder"),
                             tools("agent:scout"))
    store = embedded.services.store
    asked = (await builder("mail_send", to="scout", subject="Spec", body="Spec v1?"))["mail"]
    await embedded.settle()
    # scout's reply copy in builder's vault is answered, then lost by the forge
    lose = embedded.forge.faults.add(route=CREATE_ISSUE, mode="lost", count=1)
    await scout("mail_reply", mail=asked["ref"], body="Spec v1 looks right.",
                idempotencyKey="reply-1")
    assert lose.fired == 1
    await embedded.settle()
    copy = next(m for m in await mails.list_mails(store, org="acme", vault=BUILDER_VAULT)
                if m.in_reply_to == asked["ref"])
    # the copy's id is computable from what the forge shows (the org's account, the mail id
    # in the signed header of the mail it answers) and the reply's key
    (copy_id, *_) = await keyed_mail_ids(embedded.services, "acme", "agent:scout",
                                         f"reply\n{asked['mail_id']}\nreply-1")
    assert copy.mail_id == copy_id
    # someone who may mail builder writes that id in a mail: the app opens its issue
    other = (await marco("mail_send", to="builder", subject="Unrelated",
                         body=f"ref {copy.mail_id}"))["mail"]
    await embedded.settle()
    try:
        await Doctor(embedded.services).run(["acme"])
    except Exception as exc:  # every later pass too: the offices after this one go unchecked
        raise AssertionError(f"the doctor's pass broke off: {exc!r}") from exc
    row = await mails.get_mail(store, copy.mail_id)
    assert row is not None and row.ref != other["ref"], (
        f"the lost copy now points at marco's mail {other['ref']}")


async def test_a_lost_copy_opened_again_is_not_closed_as_a_duplicate_of_its_lost_issue(
        embedded: Embedded, person: Any, tools: Any) -> None:
    """The doctor opens a lost reply copy again under its mail id, then indexes the new issue.
    The app's own `issues.opened` of that issue may be handled in between (another replica's
    worker; here the doctor's look after a 502 is held): the index still names the lost
    issue, and the new one, the app's with a genuine header of the mail, is no late duplicate
    of a send but the mail itself. Closing it would leave the mail indexed at an issue closed
    'not planned', in no inbox, saying it duplicates an issue that is gone."""
    builder, scout = tools("agent:builder"), tools("agent:scout")
    store, faults = embedded.services.store, embedded.forge.faults
    asked = (await builder("mail_send", to="scout", subject="Spec", body="Spec v1?"))["mail"]
    await embedded.settle()
    lose = faults.add(route=CREATE_ISSUE, mode="lost", count=1)
    await scout("mail_reply", mail=asked["ref"], body="Spec v1 looks right.")
    assert lose.fired == 1
    await embedded.settle()
    copy = next(m for m in await mails.list_mails(store, org="acme", vault=BUILDER_VAULT)
                if m.in_reply_to == asked["ref"])
    # the doctor's create lands and is answered 502; its look for it waits at the forge
    create = faults.hold(CREATE_ISSUE, count=1, repo=BUILDER_VAULT)
    faults.add(route=CREATE_ISSUE, status=502, mode="after", count=1)
    doctor = asyncio.create_task(Doctor(embedded.services).run(["acme"]))
    await asyncio.wait_for(create.arrived.wait(), 60)
    look = faults.hold("GET /repos/{owner}/{repo}/issues", count=1, repo=BUILDER_VAULT)
    create.release()
    await asyncio.wait_for(look.arrived.wait(), 60)
    await embedded.settle()  # the new issue's own issues.opened, the index still at the lost one
    look.release()
    await asyncio.wait_for(doctor, 60)
    await embedded.settle()
    row = await mails.get_mail(store, copy.mail_id)
    assert row is not None and row.number != copy.number
    issue = await person("admin").issue(BUILDER_VAULT, row.number)
    assert (issue["state"], label_names(issue)) == ("open", ["mail:new"]), (
        "the copy opened again was closed as a duplicate of the issue it replaces")
