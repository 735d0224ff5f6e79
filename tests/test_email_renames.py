"""An office's email secrets follow it as its signing keys do (bot.mail.signing.Keyrings):
its DKIM key and its Message-IDs' key (bot.email.keys) move when its org is renamed, and are
set aside when another account takes its name, whose office makes its own."""

from __future__ import annotations

from email import message_from_bytes, policy
from email.message import EmailMessage
from pathlib import Path

import dkim

from bot.email import keys
from bot.mail.signing import Keyrings
from bot.store import mails
from tests.test_email_support import DOMAIN, Mailroom, delivered, mailroom, message, send, wire

__all__ = ["mailroom"]


def _parsed(data: bytes | None) -> EmailMessage:
    msg = message_from_bytes(data or b"", policy=policy.default)
    assert isinstance(msg, EmailMessage)
    return msg


def _verifies(data: bytes, record: tuple[str, str]) -> bool:
    """Whether `data`'s DKIM signature verifies with the TXT `record` (name, value)."""
    def dnsfunc(asked: bytes, timeout: int = 5) -> bytes:
        return record[1].encode() if asked.decode().rstrip(".") == record[0] else b""

    return bool(dkim.verify(data, dnsfunc=dnsfunc))


async def test_mail_sent_before_the_org_renamed_still_threads_and_signs_as_published(
        mailroom: Mailroom) -> None:
    """Acted out (review r4): acme renamed itself acme2, and bob's answer to scout's mail,
    sent before, came in as new mail: the Message-ID's key was DATA/dkim/acme.ids, which the
    rename left behind, and acme2 made a fresh one (as it did a DKIM key the published record
    does not name). Both move with the office now: the answer threads, and mail sent after
    the rename verifies with the record published before it (`vaultmail._domainkey.<domain>`
    names no org, and the `_vaultmail` record names the org's id, which the rename keeps)."""
    tools = mailroom.tools("agent:scout")
    sent = await tools("mail_send", to="bob@example.org", subject="Quote", body="Send a quote.")
    raw = (await mailroom.relay.next()).original_content
    record = keys.dns_record(keys.office_key(mailroom.embedded.data_dir, "acme"), DOMAIN)
    assert _verifies(raw or b"", record)
    real = _parsed(raw)["Message-ID"]

    mailroom.embedded.forge.rename_org("acme", "acme2")
    await mailroom.embedded.settle()
    answer = wire(message("bob@example.org", f"scout@{DOMAIN}", "Re: Quote", "12 EUR.",
                          Message_ID="<b1@example.org>", In_Reply_To=real, References=real))
    [ref] = await delivered(mailroom, await send(mailroom.port, answer,
                                                 rcpts=[f"scout@{DOMAIN}"]))
    vault, number = ref.split("#")
    threaded = await mails.mail_at(mailroom.embedded.services.store, vault, int(number))
    assert threaded is not None and threaded.thread_id == sent["mail"]["thread_id"], ref

    await tools("mail_send", to="bob@example.org", subject="Invoice", body="Pay 12 EUR.")
    after = (await mailroom.relay.next()).original_content
    assert _verifies(after or b"", record), "signed with a key the published record is not"


async def test_a_freed_name_taken_by_another_org_gets_email_secrets_of_its_own(
        mailroom: Mailroom) -> None:
    """The name acme left on its rename kept the old office's files: an org that took it
    would have signed with acme's DKIM key and keyed its Message-IDs as acme did."""
    data = mailroom.embedded.data_dir
    await mailroom.tools("agent:scout")("mail_send", to="bob@example.org", subject="Quote",
                                        body="Send a quote.")
    await mailroom.relay.next()
    before = keys.office_key(data, "acme"), keys.message_id_secret(data, "acme")
    mailroom.embedded.forge.rename_org("acme", "acme2")
    await mailroom.embedded.settle()
    assert (keys.office_key(data, "acme2"), keys.message_id_secret(data, "acme2")) == before
    fresh = keys.office_key(data, "acme"), keys.message_id_secret(data, "acme")
    assert fresh[0] != before[0] and fresh[1] != before[1]


def test_an_office_whose_name_another_account_took_leaves_its_email_secrets_aside(
        tmp_path: Path) -> None:
    """`Keyrings.retire` (the name's new owner installs the App): the old office's DKIM key
    and Message-ID key go to dkim/retired/, whole; the new office makes its own. So too when
    the old office mailed and never signed anything (no signing-keys file)."""
    ring = Keyrings.in_data_dir(tmp_path)
    old = keys.office_key(tmp_path, "globex"), keys.message_id_secret(tmp_path, "globex")
    ring.retire("globex", "globex~7")
    assert (tmp_path / "dkim" / "retired" / "globex~7.pem").read_bytes() == old[0]
    assert (tmp_path / "dkim" / "retired" / "globex~7.ids").read_bytes().strip() == old[1]
    fresh = keys.office_key(tmp_path, "globex"), keys.message_id_secret(tmp_path, "globex")
    assert fresh[0] != old[0] and fresh[1] != old[1]
    ring.retire("globex", "globex~7")  # again (a retry, or the name taken once more)
    assert (tmp_path / "dkim" / "retired" / "globex~7.1.ids").read_bytes().strip() == fresh[1]
