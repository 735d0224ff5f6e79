"""Whose an email domain is (bot.email.domains): an office's `email: {domain: ...}` is live
only once the domain's owner names the office in DNS, a TXT record `_vaultmail.<domain>`
valued `vaultmail-office=<org>`; two offices naming one domain, only the one DNS names gets
its mail."""

from __future__ import annotations

from bot.email.gateway import GATEWAY_KEY
from bot.email.intake import EmailIntake
from bot.store import ledger, mails
from tests.test_email_support import (
    DOMAIN,
    Mailroom,
    delivered,
    install_office,
    mailroom,
    message,
    send,
    wire,
)

__all__ = ["mailroom"]  # the fixture, used by name
RECORD = f"_vaultmail.{DOMAIN}"
# an org that installs the App and names acme's domain in its own config (it sorts first)
CLAIMANT = f"""org: aardvark
email:
  domain: {DOMAIN}
agents:
  - slug: scout
    login: aardvark-scout
"""


def _intake(room: Mailroom) -> EmailIntake:
    intake = room.embedded.runner.app[GATEWAY_KEY].intake
    assert intake is not None
    return intake


async def test_mail_to_a_domain_not_proven_is_refused_naming_the_record(
        mailroom: Mailroom) -> None:
    mailroom.dns.txts.pop(RECORD, None)
    _intake(mailroom).proofs.forget()  # what was looked up before
    raw = wire(message("bob@example.org", f"scout@{DOMAIN}", "Hi", "hello"))
    for _ in range(2):
        refused = await send(mailroom.port, raw, rcpts=[f"scout@{DOMAIN}"])
        assert refused.code == 550 and refused.text.startswith("5.7.1"), refused
        assert RECORD in refused.text and "vaultmail-office" not in refused.text
    store = mailroom.embedded.services.store
    [said] = await ledger.entries(store, event="office.config_refused")
    assert said.org == "acme" and f'{RECORD} TXT "vaultmail-office=acme"' in said.data[
        "errors"][0], said.data
    assert await mails.all_mails(store) == []
    # nothing goes out from the domain either: an agent's mail to an address waits
    await mailroom.tools("agent:scout")("mail_send", to="bob@example.org", subject="Out",
                                        body="hello bob")
    await mailroom.embedded.settle()
    assert await mailroom.outbox_settled() == 0 and mailroom.relay.received.empty()

    mailroom.dns.txts[RECORD] = ["vaultmail-office=acme"]  # acme publishes it
    _intake(mailroom).proofs.forget()
    out = await mailroom.relay.next()  # the waiting mail goes, once proven
    assert out.rcpt_tos == ["bob@example.org"] and out.mail_from == f"scout@{DOMAIN}"
    taken = await send(mailroom.port, raw, rcpts=[f"scout@{DOMAIN}"])
    assert (await delivered(mailroom, taken))[0].startswith("acme/scout-vault#"), taken


async def test_another_office_naming_the_domain_gets_none_of_its_mail(
        mailroom: Mailroom) -> None:
    emb = mailroom.embedded
    await install_office(mailroom, CLAIMANT)
    raw = wire(message("bob@example.org", f"scout@{DOMAIN}", "Hi", "hello"))
    answer = await send(mailroom.port, raw, rcpts=[f"scout@{DOMAIN}"])
    assert "acme/scout-vault#1" in await delivered(mailroom, answer), answer
    assert [m.vault for m in await mails.all_mails(emb.services.store)] == ["acme/scout-vault"]
    [said] = await ledger.entries(emb.services.store, event="office.config_refused")
    assert said.org == "aardvark" and "vaultmail-office=aardvark" in said.data["errors"][0]
