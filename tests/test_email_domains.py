"""Whose an email domain is (bot.email.domains): an office's `email: {domain: ...}` is live
only once the domain's owner names the office in DNS, a TXT record `_vaultmail.<domain>`
valued `vaultmail-office-id=<the org's id on the forge>` (or, for the org that proved it so
first, `vaultmail-office=<org>`); two offices naming one domain, only the one DNS names gets
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


def _account(room: Mailroom, org: str) -> int:
    """The forge's id of `org`'s account."""
    account = room.embedded.forge.state.account(org)
    assert account is not None
    return account.id


async def test_mail_to_a_domain_not_proven_is_refused_naming_the_record(
        mailroom: Mailroom) -> None:
    mailroom.dns.txts.pop(RECORD, None)
    _intake(mailroom).proofs.forget()  # what was looked up before
    acme = _account(mailroom, "acme")
    raw = wire(message("bob@example.org", f"scout@{DOMAIN}", "Hi", "hello"))
    for _ in range(2):
        refused = await send(mailroom.port, raw, rcpts=[f"scout@{DOMAIN}"])
        assert refused.code == 550 and refused.text.startswith("5.7.1"), refused
        # the record, not who claims the domain: a stranger learns neither its org nor its id
        assert RECORD in refused.text and "vaultmail-office-id=<id>" in refused.text, refused
        assert "acme" not in refused.text.replace(DOMAIN, "") and str(acme) not in refused.text
    store = mailroom.embedded.services.store
    [said] = await ledger.entries(store, event="office.config_refused")
    assert said.org == "acme" and f'{RECORD} TXT "vaultmail-office-id={acme}"' in said.data[
        "errors"][0], said.data
    assert await mails.all_mails(store) == []
    # nothing goes out from the domain either: an agent's mail to an address waits
    await mailroom.tools("agent:scout")("mail_send", to="bob@example.org", subject="Out",
                                        body="hello bob")
    await mailroom.embedded.settle()
    assert await mailroom.outbox_settled() == 0 and mailroom.relay.received.empty()

    mailroom.dns.txts[RECORD] = [f"vaultmail-office-id={acme}"]  # acme publishes it
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
    assert said.org == "aardvark" and f"vaultmail-office-id={_account(mailroom, 'aardvark')}" \
        in said.data["errors"][0], said.data


# another account's org under the name acme left: it installs the App and names the domain
NEWCOMER = f"""org: acme
email:
  domain: {DOMAIN}
agents:
  - slug: scout
    login: newacme-scout
"""


async def test_a_name_another_account_takes_is_not_proven_by_the_records_of_the_old_org(
        mailroom: Mailroom) -> None:
    """Acted out: acme proved its domain with `vaultmail-office=acme`, then renamed itself
    acme2; another account made an org called acme, installed the App and named the domain
    in its config. The record, still published for the old acme, proved it the new acme's:
    the domain's mail went into its vault, and its agents would send (DKIM-signed) as the
    domain. The proof is bound to the org's account id now: the record names the org's id,
    and one naming the org (the form before) proves only for the account that proved the
    domain with it first. So after a rename that record proves for no one: acme2 names its
    id, which a rename keeps."""
    emb = mailroom.embedded
    store = emb.services.store
    raw = wire(message("bob@example.org", f"scout@{DOMAIN}", "Hi", "hello"))
    first = await send(mailroom.port, raw, rcpts=[f"scout@{DOMAIN}"])
    assert (await delivered(mailroom, first))[0].startswith("acme/scout-vault#"), first
    old = _account(mailroom, "acme")
    emb.forge.rename_org("acme", "acme2")
    await emb.settle()
    await install_office(mailroom, NEWCOMER)
    new = _account(mailroom, "acme")
    assert new != old  # (nothing forgotten: what was proven for the old acme is not the new's)

    refused = await send(mailroom.port, raw, rcpts=[f"scout@{DOMAIN}"])
    assert refused.code == 550 and refused.text.startswith("5.7.1"), refused
    assert "acme" not in refused.text.replace(DOMAIN, "") and str(new) not in refused.text
    assert [m.vault for m in await mails.all_mails(store)] == ["acme2/scout-vault"]
    assert await _intake(mailroom).offices() == [], "no office sends as the domain"
    said = [e for e in await ledger.entries(store, event="office.config_refused")
            if e.org == "acme"]
    assert said and f'{RECORD} TXT "vaultmail-office-id={new}"' in said[-1].data[
        "errors"][0], [e.data for e in said]

    # acme2 publishes the record naming its id: the domain is its own again, under any name
    mailroom.dns.txts[RECORD] = [f"vaultmail-office-id={old}"]
    _intake(mailroom).proofs.forget()
    taken = await send(mailroom.port, raw, rcpts=[f"scout@{DOMAIN}"])
    assert (await delivered(mailroom, taken))[0].startswith("acme2/scout-vault#"), taken
    assert [o.org for o in await _intake(mailroom).offices()] == ["acme2"]
