"""`mail_send` to an address: an agent's mail to someone outside, by email.

The mail is kept in the sending agent's own vault, an issue the app opens with the header the
office signs (from `agent:<slug>` to `email:<address>`), delivered quiet (no `mail:` label: it
is no one's turn in the office; its state by email is on the issue, the outbox's comments).
The `mail.sent` entry it is ledgered with is what the outbox (bot.email.outbox) follows to send
it, DKIM-signed, under a Message-ID fixed by the mail id (`outgoing.mail_message_id`), once.
An answer by email names that Message-ID and becomes mail to the agent in the same thread
(bot.email.intake).

Who may: an agent whose `capabilities.mail.send` lists `email:*` (anyone), `email:@<domain>`
(that domain and its subdomains) or `email:<address>`; `*` alone reaches the office's agents,
never outside. Nobody else sends by email (a person writes from their own mail client).
"""

from __future__ import annotations

import uuid

from bot.email.addresses import BadAddress, normalise
from bot.errors import InvalidArguments
from bot.mail.header import headed_by, render_mail_body
from bot.mail.mailer import (
    MAX_BODY,
    Mailer,
    _signed,
    checked_subject,
    fits,
    keyed_mail,
    shown_as,
)
from bot.mail.markdown import as_data
from bot.office.config import Agent
from bot.store import idempotency, mails
from bot.store.mails import QUIET, MailRecord

_NS = uuid.UUID("0f6b7c52-3d1e-4a8b-9c2f-5e7a1d3b9c40")


def is_address(to: str) -> bool:
    """Whether `to` names an outside address (`bob@example.org` or `email:bob@example.org`),
    not an agent (`scout`, `agent:scout`) or another principal (`human:marco@acme.com`)."""
    return to.startswith("email:") or ("@" in to and ":" not in to)


def may_email(agent: Agent, address: str) -> bool:
    """Whether the agent's `capabilities.mail.send` lets it mail `address` (normalised)."""
    domain = address.rpartition("@")[2]
    for entry in agent.capabilities.get("mail.send", []):
        if not entry.startswith("email:"):
            continue
        wanted = entry.removeprefix("email:").lower()
        if wanted == "*" or wanted == address:
            return True
        if wanted.startswith("@") and (domain == wanted[1:] or domain.endswith("." + wanted[1:])):
            return True
    return False


def email_principal(to: str) -> str:
    """`email:<address>` for `to`, or InvalidArguments saying why it is no address."""
    try:
        return f"email:{normalise(to.removeprefix('email:'))}"
    except BadAddress as exc:
        raise InvalidArguments(f"to: {exc}", code="unknown_recipient") from exc


async def send_email(mailer: Mailer, actor: str, to: str, subject: str, body: str, *,
                     reply_to: MailRecord | None = None,
                     idempotency_key: str | None = None,
                     woken_by: str | None = None) -> MailRecord:
    """Mail from `actor` (an agent) to the address `to`: the mail in its vault, ledgered
    (`mail.sent`, to `email:<address>`), for the outbox to send. The mail itself again when
    `idempotency_key` sent it before."""
    office = mailer.office
    principal = email_principal(to)
    address = principal.removeprefix("email:")
    if reply_to is not None:
        mailer.own(reply_to)
    sender = office.agent(actor.removeprefix("agent:")) if actor.startswith("agent:") else None
    if office.email is None:
        raise InvalidArguments(f"{office.org} has no email domain (email.domain in "
                               "vaultmail.yml): its agents send no email", code="no_email")
    if sender is None:
        raise await mailer.deny(actor, f"mail to {principal}", (
            f"{actor} may not send email: mail to an address goes from an agent (its "
            "capabilities.mail.send listing email:...); a person writes from their own mail"))
    if not may_email(sender, address):
        allowed = [e for e in sender.capabilities.get("mail.send", []) if e.startswith("email:")]
        raise await mailer.deny(actor, f"mail to {principal}", (
            f"{actor} may not email {address}: its capabilities.mail.send allows "
            f"{allowed or 'no address'} (email:*, email:@domain or email:address)"))
    subject = checked_subject(subject)
    body = body.replace("\r\n", "\n")
    if len(body) > MAX_BODY:
        raise InvalidArguments(f"body is {len(body):,} characters; at most {MAX_BODY:,}",
                               code="body_too_long")
    body = as_data(body)
    mail_id = str(uuid.uuid4())
    if idempotency_key:
        mail_id, existing = await keyed_mail(mailer.services, office.org, actor,
                                             idempotency_key, _NS)
        if existing is not None:
            return existing
    store = mailer.services.store
    vault = office.vault_of(sender).lower()
    # an agent answering mail, or mailing from a run, climbs as it does mailing an agent
    run = await mailer.sent_from(actor, woken_by)
    hops = await mailer.sent_hops(actor, principal, reply_to, run=run, mail_id=mail_id)
    header = _signed(
        keyring=await mailer.services.keyring.ready_for(office.org), from_principal=actor,
        to_principal=principal, vault=vault, subject=subject, body=body, mail_id=mail_id,
        hops=hops, in_reply_to=reply_to.ref if reply_to else None,
        thread_id=reply_to.thread_id if reply_to else None,
        from_name=shown_as(office, actor), to_name=None)
    rendered = fits(render_mail_body(header, body), "the mail, its header table added")
    issue = None
    begun = not await mails.intend_send(store, mail_id, vault)
    if begun:
        # begun before: did it land? (its issue opens with its header)
        issue = await mailer.forge.find_issue(vault, mail_id, headed_by(mail_id))
    if issue is None:
        # the fence, as for mail inside the office (Mailer.deliver): a try whose key another
        # replica took over (this one stalled past DEAD_AFTER) opens nothing, and what the
        # outbox sends is the new owner's one mail
        await idempotency.check_claim()
        issue = await mailer.forge.create_issue(vault, header.subject, rendered, labels=[],
                                                marker=mail_id, accept=headed_by(mail_id))
    record = MailRecord(
        mail_id=mail_id, vault=vault, number=int(issue["number"]), subject=header.subject,
        body=body, from_principal=actor, to_principal=principal, sent=header.sent,
        hops=header.hops, in_reply_to=header.in_reply_to, thread_id=header.thread_id,
        key_id=header.key_id, body_sha256=header.body_sha256, state=QUIET)
    # indexed and ledgered (what the outbox follows) only under the claim: a try taken over
    # while its create was in flight queues nothing; recorded once, whichever of this try and
    # the crash-recovery path (`Mailer.record_found`: a try stopped after its create) is first
    kept = await mailer._record_new(record, actor, None, fenced=True, sent_from=run)
    if kept is None:
        raise idempotency.ClaimLost(f"send of {mail_id}: its key was taken over")
    if kept.number != record.number:
        # another try indexed its own issue while this one's create was in flight: this
        # issue is a late duplicate, closed as one (never sent: the outbox sends by mail id)
        await mailer._close_duplicate(vault, record.number, kept)
    elif begun:
        await mailer._close_duplicates_of(kept)  # an earlier try's create that landed late
    return await mails.get_mail(store, mail_id) or kept
