"""Whose an email domain is (bot.email.domains): an office's `email: {domain: ...}` is live
only once the domain's owner names the office in DNS, a TXT record `_vaultmail.<domain>`
valued `vaultmail-office-id=<the org's id on the forge>` (or `vaultmail-office=<org>`, for an
org that held the name, as the same account, when the index was upgraded to proofs by id);
two offices naming one domain, only the one DNS names gets its mail."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from bot.email.gateway import GATEWAY_KEY
from bot.email.intake import EmailIntake
from bot.email.outbox import RETRY
from bot.store import api_tokens, ledger, mails
from bot.store import outbound as cursors
from tests.support import ToolClient, older_index
from tests.test_email_support import (
    ACME_ID,
    DOMAIN,
    Mailroom,
    delivered,
    install_office,
    mailroom,
    message,
    open_mailroom,
    send,
    wire,
)

__all__ = ["mailroom"]  # the fixture, used by name
RECORD = f"_vaultmail.{DOMAIN}"
NAMED = "vaultmail-office=acme"  # acme's record in the form before ids
BEFORE_IDS = 35  # the schema the release before proofs by id left
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


@contextlib.asynccontextmanager
async def _upgraded(tmp_path: Path, empty_database_url: str,
                    account: int | None = ACME_ID) -> AsyncIterator[Mailroom]:
    """The mailroom on an index the release before proofs by id left (schema 35), acme's
    office installed in it as `account`'s (None: an index that had not read its id), and
    acme's record as published then, naming the org."""
    target = await older_index(tmp_path, empty_database_url, BEFORE_IDS, [(
        "INSERT INTO installations(org, installation_id, account_id) VALUES ('acme', 11, ?)",
        (account,))])
    async with open_mailroom(tmp_path, empty_database_url, record=NAMED) as room:
        assert room.index == target
        yield room


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


async def test_mail_waiting_on_a_domain_no_longer_proven_is_given_up_never_sent_late(
        mailroom: Mailroom) -> None:
    """Found by review: an office whose domain is no longer proven was left out of the
    outbox's rounds, so its messages waited with no give-up clock and went whenever the
    record came back, however late (months), where any other message that cannot go is
    given up after VAULTMAIL_SMTP_GIVE_UP_SECONDS. The same clock applies: deferred, then
    given up, bounced saying why, the issue and the agent told; never sent after."""
    outbox = mailroom.embedded.runner.app[GATEWAY_KEY].outbox
    assert outbox is not None
    await outbox.stop()  # (its rounds are run below by `outbox_settled`)
    acme = _account(mailroom, "acme")
    mailroom.dns.txts.pop(RECORD, None)  # acme's record taken away
    _intake(mailroom).proofs.forget()
    outbox.give_up_after = 0.0  # the first deferral is past it (as months would be)
    sent = await mailroom.tools("agent:scout")("mail_send", to="bob@example.org",
                                               subject="Quote", body="Send a quote.")
    await mailroom.embedded.settle()
    assert await mailroom.outbox_settled() == 0 and mailroom.relay.received.empty()
    store = mailroom.embedded.services.store
    [deferred] = await ledger.entries(store, event="email.deferred")
    assert "not proven" in deferred.data["detail"] and RECORD in deferred.data["detail"]
    await _given_up_once(mailroom, sent, "not proven")

    mailroom.dns.txts[RECORD] = [f"vaultmail-office-id={acme}"]  # published again, late
    _intake(mailroom).proofs.forget()
    assert await mailroom.outbox_settled() == 0 and mailroom.relay.received.empty()
    assert mailroom.relay.rcpt_at == {}
    assert await ledger.entries(store, event="email.sent") == []


async def _push_acme(room: Mailroom, email: dict[str, str] | None) -> None:
    """acme's office config pushed with `email` as its `email:` section (None: none)."""
    repo = room.embedded.forge.state.repo("acme", ".github")
    assert repo is not None
    config = yaml.safe_load(repo.files["vaultmail.yml"])
    config.pop("email", None)
    if email is not None:
        config["email"] = email
    room.embedded.forge.put_file("acme/.github", "vaultmail.yml", yaml.safe_dump(config),
                                 pusher="admin")
    await room.embedded.settle()


async def test_mail_waiting_when_the_email_section_goes_is_given_up_never_sent_late(
        mailroom: Mailroom) -> None:
    """Found by review, as 4e5e107 for a domain no longer proven: a message the relay
    deferred, then acme's config dropped its `email:` section. The outbox drained only
    offices whose config names a domain, so the message waited with no give-up clock, and
    went whenever the section came back, however late. The same clock applies: deferred
    saying why, then given up, bounced, the issue and the agent told; never sent after."""
    outbox = mailroom.embedded.runner.app[GATEWAY_KEY].outbox
    assert outbox is not None
    await outbox.stop()  # (its rounds are run below by `outbox_settled`)
    repo = mailroom.embedded.forge.state.repo("acme", ".github")
    assert repo is not None
    email = yaml.safe_load(repo.files["vaultmail.yml"])["email"]
    mailroom.relay.refuse = ["451 4.3.0 try again later"]
    sent = await mailroom.tools("agent:scout")("mail_send", to="bob@example.org",
                                               subject="Quote", body="Send a quote.")
    await mailroom.embedded.settle()
    assert await mailroom.outbox_settled() == 0 and mailroom.relay.received.empty()
    store = mailroom.embedded.services.store
    assert len(await ledger.entries(store, event="email.deferred")) == 1

    await _push_acme(mailroom, None)  # the office's email section gone
    outbox.give_up_after = 0.0  # the first deferral is past it (as months would be)
    for seq, failures, _ in await outbox.retrying("acme"):  # its backoff over: due now
        await cursors.save_cursor(store, "acme", f"{RETRY}{seq}", seq, failures, 0.0, None)
    assert await mailroom.outbox_settled() == 0 and mailroom.relay.received.empty()
    await _given_up_once(mailroom, sent, "names no email domain")

    await _push_acme(mailroom, email)  # the section back, late
    assert await mailroom.outbox_settled() == 0 and mailroom.relay.received.empty()
    assert await ledger.entries(store, event="email.sent") == []


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


@pytest.mark.parametrize("asked_before", [True, False], ids=["proven-first", "never-asked"])
async def test_a_name_another_account_takes_is_not_proven_by_the_records_of_the_old_org(
        tmp_path: Path, empty_database_url: str, asked_before: bool) -> None:
    """Acted out: acme proved its domain with `vaultmail-office=acme`, then renamed itself
    acme2; another account made an org called acme, installed the App and named the domain
    in its config. The record, still published for the old acme, proved it the new acme's:
    the domain's mail went into its vault, and its agents would send (DKIM-signed) as the
    domain. The proof is bound to the org's account id now: the record names the org's id,
    and one naming the org (the form before) proves only for the account that held the name
    when the index was upgraded. So after a rename that record proves for no one: acme2
    names its id, which a rename keeps.

    never-asked (review r3): no mail came between the upgrade and the rename, and the
    record proved the domain for whichever account was asked first under the name: the
    newcomer's, which then owned it."""
    async with _upgraded(tmp_path, empty_database_url) as mailroom:
        emb = mailroom.embedded
        store = emb.services.store
        raw = wire(message("bob@example.org", f"scout@{DOMAIN}", "Hi", "hello"))
        if asked_before:
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
        assert [m.vault for m in await mails.all_mails(store)] == \
            ["acme2/scout-vault"] * asked_before
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


# the new acme of the vouched case: its agent may write to the outside, as the old one's could
NEWCOMER_SENDING = NEWCOMER + """    capabilities:
      mail.send: ["email:@example.org"]
"""


@pytest.mark.parametrize("mail_first", [True, False], ids=["mail-first", "config-first"])
async def test_a_domain_vouched_for_an_org_is_not_the_next_owner_of_its_login(
        tmp_path: Path, database_url: str, mail_first: bool,
        caplog: pytest.LogCaptureFixture) -> None:
    """The operator vouches for acme's domain (`VAULTMAIL_SMTP_DOMAINS=DOMAIN=acme`, no
    record in DNS). acme renames itself acme2 (or is deleted: the login is free either way);
    another account makes an org called acme, installs the App and names the domain in its
    config. The vouch named the org by its login, so it went with the login: the domain's
    mail went into the new owner's vault and its agents sent as the domain. The vouch by
    login alone is bound, as VAULTMAIL_OUTBOUND_ALLOW's entries are, to the first account the
    index recorded under the login: for the newcomer the domain is unproven as any is (550 at
    RCPT, its outbox defers), and the operator is told what to write."""
    caplog.set_level(logging.WARNING)
    async with open_mailroom(tmp_path, database_url, domains={DOMAIN: "acme"}) as mailroom:
        emb = mailroom.embedded
        store = emb.services.store
        mailroom.dns.txts.pop(RECORD)  # the operator's word alone proves it
        raw = wire(message("bob@example.org", f"scout@{DOMAIN}", "Hi", "hello"))
        if mail_first:
            first = await send(mailroom.port, raw, rcpts=[f"scout@{DOMAIN}"])
            assert (await delivered(mailroom, first))[0].startswith("acme/scout-vault#"), first
        old = _account(mailroom, "acme")
        emb.forge.rename_org("acme", "acme2")
        await emb.settle()
        await install_office(mailroom, NEWCOMER_SENDING)
        new = _account(mailroom, "acme")
        assert new != old

        refused = await send(mailroom.port, raw, rcpts=[f"scout@{DOMAIN}"])
        assert refused.code == 550 and refused.text.startswith("5.7.1"), refused
        assert "acme" not in refused.text.replace(DOMAIN, "") and str(new) not in refused.text
        assert [m.vault for m in await mails.all_mails(store)] == \
            ["acme2/scout-vault"] * mail_first
        assert await _intake(mailroom).offices() == [], "no office sends as the domain"
        # the newcomer's agent's mail to the outside waits, as from any unproven domain
        scout = await api_tokens.create_token(store, "agent:scout", "acme")
        await ToolClient(mailroom.session, emb, "agent:scout", scout)(
            "mail_send", to="bob@example.org", subject="Out", body="hello bob")
        await emb.settle()
        assert await mailroom.outbox_settled() == 0 and mailroom.relay.received.empty()
        said = [e for e in await ledger.entries(store, event="office.config_refused")
                if e.org == "acme"]
        assert said and f"vaultmail-office-id={new}" in said[-1].data["errors"][0], said

        [warned] = {r.getMessage(): r for r in caplog.records
                    if "VAULTMAIL_SMTP_DOMAINS" in r.getMessage()}.values()
        text = warned.getMessage()
        assert f"acme ({DOMAIN}) are bound to forge account {old}, the first" in text, text
        assert f"{DOMAIN}=acme#{new}" in text and f"{DOMAIN}=NEWNAME#{old}" in text, text
        assert (warned.__dict__["org"], warned.__dict__["domains"],
                warned.__dict__["bound_account"], warned.__dict__["account"]) == \
            ("acme", [DOMAIN], old, new)


@pytest.mark.parametrize("vouched", ["acme#{id}", "ACME#{id}", "acme#999999"])
async def test_a_vouched_domain_may_name_the_account_its_org_is(
        tmp_path: Path, database_url: str, vouched: str) -> None:
    """`DOMAIN=acme#1002`: the domain is the office's whose forge account is 1002, under the
    login acme; another account's number proves it for no one (550, as any unproven)."""
    entry = vouched.format(id=ACME_ID)
    async with open_mailroom(tmp_path, database_url, domains={DOMAIN: entry}) as mailroom:
        mailroom.dns.txts.pop(RECORD)
        raw = wire(message("bob@example.org", f"scout@{DOMAIN}", "Hi", "hello"))
        answer = await send(mailroom.port, raw, rcpts=[f"scout@{DOMAIN}"])
        if entry.endswith(f"#{ACME_ID}"):
            assert (await delivered(mailroom, answer))[0].startswith("acme/scout-vault#")
        else:
            assert answer.code == 550 and answer.text.startswith("5.7.1"), answer
            assert await _intake(mailroom).offices() == []


# an org that installs the App after the upgrade, proving its own domain by its name
NEWCO_DOMAIN = "mail.newco.example"
NEWCO = f"""org: newco
email:
  domain: {NEWCO_DOMAIN}
agents:
  - slug: scout
    login: newco-scout
"""


async def test_a_record_naming_the_org_proves_nothing_for_an_office_first_known_after_ids(
        tmp_path: Path, empty_database_url: str) -> None:
    """acme, installed before the upgrade, keeps its domain by the record naming it; newco,
    installed after, is not proven its own by such a record, first though it is to ask: its
    ledger asks for the record naming its id."""
    async with _upgraded(tmp_path, empty_database_url) as mailroom:
        store = mailroom.embedded.services.store
        raw = wire(message("bob@example.org", f"scout@{DOMAIN}", "Hi", "hello"))
        taken = await send(mailroom.port, raw, rcpts=[f"scout@{DOMAIN}"])
        assert (await delivered(mailroom, taken))[0].startswith("acme/scout-vault#"), taken

        mailroom.dns.txts[f"_vaultmail.{NEWCO_DOMAIN}"] = ["vaultmail-office=newco"]
        await install_office(mailroom, NEWCO)
        newco = _account(mailroom, "newco")
        to_newco = wire(message("bob@example.org", f"scout@{NEWCO_DOMAIN}", "Hi", "hello"))
        refused = await send(mailroom.port, to_newco, rcpts=[f"scout@{NEWCO_DOMAIN}"])
        assert refused.code == 550 and refused.text.startswith("5.7.1"), refused
        [said] = [e for e in await ledger.entries(store, event="office.config_refused")
                  if e.org == "newco"]
        assert f'_vaultmail.{NEWCO_DOMAIN} TXT "vaultmail-office-id={newco}"' in said.data[
            "errors"][0], said.data
        assert [m.vault for m in await mails.all_mails(store)] == ["acme/scout-vault"]


async def test_a_domain_vouched_for_an_org_with_nothing_else_set_is_bound_at_its_config(
        tmp_path: Path, database_url: str) -> None:
    """newco has only its domain vouched for by login (no command, no outbound entry): its
    config's first read binds the login to its account, before any mail comes, so another
    account taking the login after newco is renamed has the domain unproven."""
    async with open_mailroom(tmp_path, database_url,
                             domains={NEWCO_DOMAIN: "newco"}) as mailroom:
        emb = mailroom.embedded
        await install_office(mailroom, NEWCO)
        old = _account(mailroom, "newco")
        emb.forge.rename_org("newco", "newco2")
        await emb.settle()
        await install_office(mailroom, NEWCO)  # another account's newco, the same config
        assert _account(mailroom, "newco") != old
        raw = wire(message("bob@example.org", f"scout@{NEWCO_DOMAIN}", "Hi", "hello"))
        refused = await send(mailroom.port, raw, rcpts=[f"scout@{NEWCO_DOMAIN}"])
        assert refused.code == 550 and refused.text.startswith("5.7.1"), refused
        assert await mails.all_mails(emb.services.store) == []


async def test_a_record_naming_the_org_proves_nothing_where_the_index_had_not_its_account(
        tmp_path: Path, empty_database_url: str) -> None:
    """acme's office was known before the upgrade, but not its account: the id the listing
    reads for the name after it could be a newcomer's (the name freed before the upgrade), so
    the record naming the org proves nothing; the ledger asks for the one naming its id."""
    async with _upgraded(tmp_path, empty_database_url, account=None) as mailroom:
        store = mailroom.embedded.services.store
        raw = wire(message("bob@example.org", f"scout@{DOMAIN}", "Hi", "hello"))
        refused = await send(mailroom.port, raw, rcpts=[f"scout@{DOMAIN}"])
        assert refused.code == 550 and refused.text.startswith("5.7.1"), refused
        [said] = await ledger.entries(store, event="office.config_refused")
        assert f'{RECORD} TXT "vaultmail-office-id={ACME_ID}"' in said.data["errors"][0], \
            said.data
        assert await mails.all_mails(store) == []


async def test_a_refusal_said_before_the_account_was_known_is_said_again_naming_its_id(
        mailroom: Mailroom) -> None:
    """The ledger's word on a domain not proven names the record to publish, with the org's
    id. Said once while the index did not know acme's account yet (the id left as a
    placeholder), it is said again once the account is known: the first entry must not stand
    in for the exact one (it did: one entry per org and domain, whichever came first)."""
    store = mailroom.embedded.services.store
    mailroom.dns.txts.pop(RECORD, None)
    raw = wire(message("bob@example.org", f"scout@{DOMAIN}", "Hi", "hello"))
    async with store.transaction() as db:  # (as an index that has not read the id yet)
        await db.execute("UPDATE installations SET account_id=NULL WHERE org='acme'")
    _intake(mailroom).proofs.forget()
    refused = await send(mailroom.port, raw, rcpts=[f"scout@{DOMAIN}"])
    assert refused.code == 550 and refused.text.startswith("5.7.1"), refused
    async with store.transaction() as db:  # the listing reads it
        await db.execute("UPDATE installations SET account_id=? WHERE org='acme'", (ACME_ID,))
    _intake(mailroom).proofs.forget()
    refused = await send(mailroom.port, raw, rcpts=[f"scout@{DOMAIN}"])
    assert refused.code == 550 and refused.text.startswith("5.7.1"), refused
    said = [e.data["errors"][0] for e in await ledger.entries(
        store, event="office.config_refused")]
    assert len(said) == 2 and "<the id of acme" in said[0], said
    assert f'{RECORD} TXT "vaultmail-office-id={ACME_ID}"' in said[1], said


async def _given_up_once(mailroom: Mailroom, sent: dict[str, Any], why: str) -> None:
    """scout's mail to bob was given up once, saying `why`: one bounce (the relay's source),
    the agent's Undelivered mail, one deferral note and one bounce note on its issue."""
    store = mailroom.embedded.services.store
    [bounced] = await ledger.entries(store, event="email.bounced")
    assert bounced.data["recipients"] == ["bob@example.org"], bounced.data
    assert bounced.data["source"] == "relay" and "gave up" in bounced.data["why"]
    assert why in bounced.data["why"], bounced.data
    [told] = [m for m in await mails.all_mails(store) if m.subject == "Undelivered: Quote"]
    assert told.to_principal == "agent:scout" and why in told.body
    notes = [c["body"] for c in await mailroom.person("marco").comments(
        "acme/scout-vault", sent["mail"]["number"])]
    assert sum(n.startswith("⏳ Deferred") for n in notes) == 1, notes
    assert sum(n.startswith("📭") and why in n for n in notes) == 1, notes
