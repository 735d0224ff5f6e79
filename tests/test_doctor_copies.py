"""the doctor finds a vanished reply copy by its mail id anywhere in the body of an
issue the app opened, and the app opens issues whose bodies others wrote (every mail)."""

from __future__ import annotations

from typing import Any

from bot.app.doctor import Doctor
from bot.app.embedded import Embedded
from bot.mail.mailer import keyed_mail_ids
from bot.store import mails

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
