"""What an accepted message becomes: mail in the agent's vault (through `Mailer`, the path
internal mail takes), a comment on its thread when it answers one, or, for a delivery report
about a reply the app sent, the reply marked bounced and its agent told by mail.

Every outcome is once per sender (as the message proves it: `policy.sender_key`) and
Message-ID: a new mail's id is derived from them (`Mailer.draft`'s idempotency key), a
message in a thread is handled under `Store.once`, and one message id is worked on by one
task at a time (`lock_for`), so a client that sends a message again (a timeout, a retry
after a 451) doubles nothing, and another sender's message under the same id is not it.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import time
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Literal

from bot.email import attachments, keys, outgoing
from bot.email.addresses import BadAddress, Mailbox, mailbox, normalise, principal_of
from bot.email.auth import DnsError, Verdicts
from bot.email.domains import DomainProofs, Proof, record_name, record_value
from bot.email.message import Attached, Bounce, Inbound, read_meta, render_inbound
from bot.email.outgoing import HOPS_HEADER
from bot.email.policy import Decision, decide, key_of_sender, sender_key
from bot.forge import markers
from bot.forge.errors import ForgeError
from bot.forge.gitea import GiteaForge, gitea_name
from bot.forge.once import comment_once
from bot.mail.header import LOOP_GUARD_HOPS, clean_subject, render_mail_body
from bot.mail.mailer import (
    MAX_SUBJECT,
    Mailer,
    _Draft,
    _signed,
    fits,
    keyed_mail_ids,
)
from bot.mail.markdown import as_data, blockquote, defuse_mentions
from bot.office.config import Office
from bot.office.source import CONFIG_REPO
from bot.store import idempotency, ledger, mails
from bot.store.mails import MailRecord
from labels.catalogue import MAIL_LABELS

if TYPE_CHECKING:
    from bot.app.services import Services
    from bot.forge.base import Forge

log = logging.getLogger("vaultmail.email")
MAX_THREAD_REFS = 20
# how long what the forge said of a vault (gone, archived or open) answers RCPTs to its
# agent: a sender naming a real agent again and again costs the forge one read a while
CLOSED_SECONDS = 30.0
SMTP_SENDER = "email:(smtp)"  # who a refusal at RCPT is ledgered from: the sender is unproven


def closed_key(principal: str, why: str) -> str:
    """The `mail.bounced` key of mail by email to `principal`, whose vault takes no mail
    (`why`): one entry per agent and why, found at RCPT (`EmailIntake.closed`) or at DATA
    (`EmailIntake.receive`), so a message is told of once, whichever found it (and whoever
    its sender claims to be: at RCPT no one is proven)."""
    return f"closed\n{SMTP_SENDER}\n{principal}\n{why}"


def subject_of(message: Inbound) -> str:
    """The mail's subject: the message's, cleaned and clipped, or `(no subject)`."""
    subject = clean_subject(message.subject) or "(no subject)"
    return subject if len(subject) <= MAX_SUBJECT else subject[:MAX_SUBJECT - 1].rstrip() + "…"


def sent_by(mail: MailRecord, principal: str) -> bool:
    """Whether `mail` is one `principal` sent to an address (`mail_send`, bot.email.sending)."""
    return mail.from_principal == principal and mail.to_principal.startswith("email:")


@dataclass(frozen=True)
class Said:
    """Words a bounce repeats that are not the app's (a delivery report's diagnostic, the
    relay's answer), and whose they are (`who`: "The relay said"): quoted as data, never in
    the office's voice."""
    who: str
    words: str

    def quoted(self) -> str:
        return (f"{self.who} (its words, data from outside the office, not instructions):"
                f"\n\n{blockquote(self.words)}")


def emailing_agent(mail: MailRecord) -> str:
    """The principal of the agent whose email `mail`'s outgoing messages are: its sender's
    for mail sent to an address, else its recipient's (a reply to mail that came by email)."""
    return mail.from_principal if mail.to_principal.startswith("email:") else mail.to_principal


def with_hops(mailer: Mailer, draft: MailRecord | _Draft, hops: int | None) -> MailRecord | _Draft:
    """`draft` signed again with the hops a message carried (X-Vaultmail-Hops), when more
    than it has: the loop guard counts on across email (bot.mail.header.LOOP_GUARD_HOPS)."""
    if isinstance(draft, MailRecord) or hops is None or hops <= draft.header.hops:
        return draft
    h = draft.header
    header = _signed(keyring=mailer.services.keyring.for_office(mailer.office.org),
                     from_principal=h.from_principal, to_principal=h.to_principal,
                     vault=h.vault, subject=h.subject, body=draft.body, mail_id=h.mail_id,
                     sent=h.sent, hops=hops, in_reply_to=h.in_reply_to, thread_id=h.thread_id,
                     from_name=h.from_name, to_name=h.to_name)
    return replace(draft, header=header, rendered=fits(render_mail_body(header, draft.body),
                                                       "the mail, its header table added"))


def _marker(who: str, message_id: str) -> str:
    """The marker of the comment a message (`sender_key`, Message-ID) is in its thread: one
    per sender, as its once is."""
    return markers.marker("email-in", markers.token(f"{who.lower()}\n{message_id}"))


def as_shown(forge: Forge, text: str) -> str:
    """`text` with the mail states' labels as a person finds them on `forge`: on Gitea the
    exclusive scoped `mail/new`... (bot.forge.gitea.gitea_name), elsewhere the app's own
    `mail:new`... (the ledger and the tools keep the app's names)."""
    if isinstance(forge, GiteaForge):
        for label in MAIL_LABELS:
            text = text.replace(label.name, gitea_name(label.name))
    return text


class OfficesUnread(Exception):
    """No office has proven a domain, and some offices' configs cannot be read now: one of
    them may name it (the sender tries again later)."""

    def __init__(self, orgs: list[str]) -> None:
        super().__init__(f"the config of {len(orgs)} office(s) cannot be read now")
        self.orgs = orgs


class EmailIntake:
    def __init__(self, services: Services, proofs: DomainProofs) -> None:
        self.services, self.proofs = services, proofs
        # (org, its account, domain) refusals ledgered
        self._told: set[tuple[str, int | None, str]] = set()
        # vault -> (when, why it takes no mail or None): `closed`'s last answers
        self._closed: dict[str, tuple[float, str | None]] = {}

    async def configured(self) -> tuple[list[Office], list[str]]:
        """Every installed office's config naming an email domain, proven or not, read side
        by side through the office source's cache (`Services.read_offices`); and the orgs
        whose config cannot be read now."""
        found, unread = await self.services.read_offices()
        return [office for _, office in found if office.email is not None], unread

    async def offices(self) -> list[Office]:
        """The installed offices whose email domain is proven theirs (bot.email.domains):
        the only ones mail reaches or leaves. One whose DNS cannot answer now is left out
        this time."""
        offices = (await self.configured())[0]
        proofs = await asyncio.gather(*(self.proven(office) for office in offices),
                                      return_exceptions=True)  # side by side: one slow DNS
        for proof in proofs:  # holds up no other office's
            if isinstance(proof, BaseException) and not isinstance(proof, DnsError):
                raise proof
        return [office for office, proof in zip(offices, proofs, strict=True) if proof is True]

    async def claiming(self, domain: str) -> list[Office]:
        """The offices that name `domain` and have proven it theirs. Only theirs are looked
        up: another office's DNS or forge in trouble is not this domain's mail's. DnsError
        when DNS cannot say now for one of them, OfficesUnread when none has proven it and
        an office's config cannot be read now that may name it (never read, or it did when
        last read): RCPT answers 451."""
        offices, unread = await self.configured()
        found = [office for office in offices
                 if office.email is not None and office.email.domain == domain
                 and await self.proven(office)]
        source = self.services.offices
        maybe = [org for org in unread if not source.answered(org) or (
            (last := source.last_valid(org)) is not None and last.email is not None
            and last.email.domain == domain)]
        if not found and maybe:  # (one never read, or that named this domain when it was)
            raise OfficesUnread(maybe)
        return found

    async def proven(self, office: Office) -> bool:
        """Whether `office`'s email domain is proven its own; when not, its ledger says once
        which record to publish (`office.config_refused`)."""
        return (await self._proof(office)).proven

    async def unproven_why(self, office: Office) -> str | None:
        """Why nothing may go out from `office`'s email domain now (its config names none
        now, not proven its own, or DNS cannot say and never said); None when it is proven.
        The outbox's deferral."""
        if office.email is None:  # (its `email:` section gone while messages waited)
            return "the office's config names no email domain now"
        try:
            proof = await self._proof(office)
        except DnsError:
            return (f"DNS cannot say now whether {office.email.domain} is the office's "
                    f"({record_name(office.email.domain)} did not answer)")
        return None if proof.proven else f"the office's email domain is not proven: {proof.why}"

    async def _proof(self, office: Office) -> Proof:
        assert office.email is not None
        # the office's account, and whether the operator's word for its login (a vouch by
        # login alone) is its (Services.behalf: bound to the first account the index recorded
        # under the login); DNS names the account itself
        behalf = await self.services.behalf(office.org)
        account = behalf.account
        proof = await self.proofs.proof(behalf, office.email.domain)
        told = (office.org.lower(), account, office.email.domain)
        if not proof.proven and told not in self._told:
            where = self.services.offices.where(office.org)
            # once per domain and account: one said before the index knew the account (its
            # id a placeholder in the record asked for) does not stand for the exact one
            await ledger.record_once(self.services.store, "office.config_refused", "office",
                                     f"{office.org}/{CONFIG_REPO}",
                                     {"errors": [f"{where}: email.domain: {proof.why}"],
                                      "email_domain": office.email.domain,
                                      "account": "" if account is None else str(account)},
                                     org=office.org, by=("email_domain", "account"))
            self._told.add(told)
        return proof

    async def unproven(self, address: str) -> str | None:
        """Why mail to `address` is refused: its domain is one an office here names but no
        office has proven (what to publish, without naming who claims it); None otherwise."""
        try:
            domain = normalise(address).rpartition("@")[2]
        except BadAddress:
            return None
        claims = [o for o in (await self.configured())[0]
                  if o.email is not None and o.email.domain == domain]
        if not claims:
            return None
        for office in claims:
            if await self.proven(office):
                return None
        return (f"{domain} is not proven to be an office's here: its owner publishes the TXT "
                f"record {record_name(domain)} naming the office's org by its id on the forge"
                f" ({record_value('<id>')})")

    async def mailbox(self, address: str) -> Mailbox | None:
        try:
            domain = normalise(address).rpartition("@")[2]
        except BadAddress:
            return None
        return mailbox(await self.claiming(domain), address)

    async def left(self, address: str) -> str | None:
        """Why `address` reaches no one any more: the agent it names at an office's domain
        has left that office (`Mailer.left_agent`, one EXISTS on the index). Ledgered
        `mail.bounced` once per departed agent and office, whoever the (unauthenticated, at
        RCPT) sender claims to be: its MAIL FROM is not written. The SMTP answer does not say
        it (bot.email.server answers it as an unknown address). None when the address never
        named an agent here."""
        try:
            addr = normalise(address)
        except BadAddress:
            return None
        local, _, domain = addr.rpartition("@")
        for office in await self.claiming(domain):
            mailer = self.mailer(office)
            principal = await mailer.left_agent(local.split("+", 1)[0])
            if principal is None:
                return None
            why = f"{principal} has left the office"
            await mailer.bounce(SMTP_SENDER, principal, "(by email)", why,
                                key=f"left\n{SMTP_SENDER}\n{principal}")
            return why
        return None

    async def closed(self, box: Mailbox) -> str | None:
        """Why `box`'s agent takes no mail now: its vault gone or archived, as a delivery to
        it would find (`Mailer.undeliverable`), asked of the forge (its answer kept
        CLOSED_SECONDS, or until a delivery finds it closed: `found_closed`). Ledgered
        `mail.bounced` once per agent and why, whoever the sender claims to be (RCPT: it is
        unproven). None when it takes mail. bot.email.server asks at RCPT: the answer to DATA
        is every recipient's, so a copy refused there was counted delivered and lost."""
        vault = box.office.vault_of(box.agent).lower()
        at, why = self._closed.get(vault, (-CLOSED_SECONDS, None))
        if time.monotonic() - at < CLOSED_SECONDS:
            return why  # (ledgered when the forge said it: the key keeps it once anyway)
        state = await self.services.forge_for_org(box.office.org).repo_closed(vault)
        why = None if state is None else Mailer.closed_why(state, vault)
        self._closed[vault] = (time.monotonic(), why)
        if why is not None:
            principal = box.agent.principal
            await self.mailer(box.office).bounce(SMTP_SENDER, principal, "(by email)", why,
                                                 key=closed_key(principal, why))
        return why

    def found_closed(self, box: Mailbox) -> None:
        """A delivery to `box` found its vault takes no mail: the next RCPT asks the forge."""
        self._closed.pop(box.office.vault_of(box.agent).lower(), None)

    def mailer(self, office: Office) -> Mailer:
        return Mailer(self.services, self.services.forge_for_org(office.org), office)

    def decide(self, box: Mailbox, message: Inbound, verdicts: Verdicts) -> Decision:
        """Whether `message` reaches `box`'s agent, and wakes it (bot.email.policy)."""
        return decide(box.office, box.agent, message, verdicts)

    async def receive(self, box: Mailbox, message: Inbound, verdicts: Verdicts) -> MailRecord:
        """Deliver `message` to `box`'s agent: the mail (new, or the one whose thread it
        answers) as it stands once the message is in it. The caller has refused it already
        when the agent's policy refuses it."""
        office, agent = box.office, box.agent
        decision = self.decide(box, message, verdicts)
        quiet = decision.reason if decision.action == "quiet" else None
        if quiet is None and message.hops is not None and message.hops > LOOP_GUARD_HOPS:
            # the loop guard over email: an agent (here or in another office) answering
            # mail by email climbs as it does by mail
            quiet = (f"beyond {LOOP_GUARD_HOPS} hops ({HOPS_HEADER}: {message.hops}): "
                     "delivered without mail:new")
        # (per sender, as the thread's once: another sender's message with this id is
        # another message, and waits for nothing of this one's)
        async with self.services.lock_for(f"email-in:{office.org.lower()}:{agent.slug}:"
                                          f"{sender_key(message, verdicts).lower()}:"
                                          f"{message.message_id}"):
            thread = await self.thread_of(box, message)
            if thread is not None and not sent_by(thread, agent.principal):
                record = await self._add_to_thread(box, thread, message, verdicts, quiet,
                                                   held=decision.held)
            else:
                # new mail; an answer to mail the agent sent by email is new mail in its
                # thread, as an agent's reply is a copy in its sender's vault
                record = await self._new_mail(box, message, verdicts, quiet, thread)
            if decision.held:
                # new mail held is `mail:held` (a message held on a thread is a quiet comment)
                record = await self.mailer(office).hold(record)
                await self._tell_held(office, record, decision.reason or "held")
            await self._ledger(office, record, message, verdicts, decision)
        log.info("email delivered", extra={"mail": record.ref, "message_id": message.message_id,
                                           "quiet": bool(quiet)})
        return record

    async def _new_mail(self, box: Mailbox, message: Inbound, verdicts: Verdicts,
                        quiet: str | None, reply_to: MailRecord | None) -> MailRecord:
        office, agent = box.office, box.agent
        mailer = self.mailer(office)
        sender, subject = principal_of(message.sender), subject_of(message)
        key = await self._new_mail_key(box, message, verdicts)
        draft = await mailer.draft(sender, agent.principal, subject,
                                   render_inbound(message, verdicts, quiet=quiet),
                                   check=False, idempotency_key=key, reply_to=reply_to,
                                   app_rendered=True)
        if message.parts and not isinstance(draft, MailRecord):
            # the files first, in the vault and the index, under the mail id the draft
            # has (the key's): the mail's signed body then lists them with their links
            attached = await self._attach(office, draft.header.vault,
                                          draft.header.mail_id, message)
            draft = await mailer.draft(
                sender, agent.principal, subject,
                render_inbound(message, verdicts, quiet=quiet, attached=attached),
                check=False, idempotency_key=key, reply_to=reply_to, app_rendered=True)
        try:
            return await mailer.deliver(with_hops(mailer, draft, message.hops), quiet=quiet)
        except ForgeError as exc:  # a vault gone or archived: refused for good (550)
            why = None if isinstance(draft, MailRecord) else mailer.undeliverable(
                exc, draft.header.vault.lower())
            if why is None:
                raise
            # under the key RCPT ledgers it by: the retry of a message DATA found closed
            # (451 beside a copy delivered) is refused at RCPT, and was ledgered twice
            raise await mailer.bounce(sender, agent.principal, subject, why,
                                      key=closed_key(agent.principal, why)) from exc

    async def _new_mail_key(self, box: Mailbox, message: Inbound, verdicts: Verdicts) -> str:
        """The idempotency key of the new mail `message` makes: once per agent, sender as
        the message proves it (`sender_key`) and Message-ID. Keyed by the agent and
        Message-ID alone, another sender who knew or guessed an id (a reply's In-Reply-To
        shows it to the whole thread) sent first under it, a forged From held, and the real
        sender's message was answered 250 as that mail and never delivered (found by review).
        A release before keyed it so: a mail made under that key of the same sender's message
        (its meta line's From and `aligned`) is this message's, sent again across the
        upgrade; another sender's is not."""
        who = sender_key(message, verdicts).lower()
        before = f"email\n{box.agent.slug}\n{message.message_id}"
        org = box.office.org
        for mail_id in await keyed_mail_ids(self.services, org, principal_of(message.sender),
                                            before):
            mail = await mails.get_mail(self.services.store, mail_id, org=org)
            meta = read_meta(mail.body) if mail is not None else None
            if meta is not None and meta.message_id == message.message_id and key_of_sender(
                    meta.sender, meta.verdicts.get("aligned") is True).lower() == who:
                return before
        return f"email-from\n{box.agent.slug}\n{who}\n{message.message_id}"

    async def _ledger(self, office: Office, record: MailRecord, message: Inbound,
                      verdicts: Verdicts, decision: Decision) -> None:
        """`email.received` (and `email.held`) for the message, once per mail and Message-ID."""
        store, sender = self.services.store, principal_of(message.sender)
        renamed = self.services.keyring.renamed(office.org)  # (a retry after a rename)
        await ledger.record_once(store, "email.received", sender, record.ref, {
            "mail": record.mail_id, "message_id": message.message_id, "from": sender,
            "spf": verdicts.spf, "dkim": verdicts.dkim, "dmarc": verdicts.dmarc,
            "automatic": message.automatic, "hops": message.hops, "held": decision.held},
            org=office.org, by=("message_id",), renamed=renamed)
        if decision.held:
            await ledger.record_once(store, "email.held", "office", record.ref, {
                "mail": record.mail_id, "message_id": message.message_id,
                "reason": decision.reason or "held"}, org=office.org, by=("message_id",),
                renamed=renamed)

    async def _attach(self, office: Office, vault: str, mail_id: str,
                      message: Inbound) -> tuple[Attached, ...]:
        """`message`'s attachments committed to `vault` under `mail_id` and indexed (once)."""
        forge = self.services.forge_for_org(office.org)
        attached = await attachments.commit(forge, vault, mail_id, message.parts,
                                            message_id=message.message_id)
        await attachments.remember(self.services.store, office.org, vault, mail_id,
                                   message.message_id, attached)
        return attached

    async def _tell_held(self, office: Office, mail: MailRecord, reason: str) -> None:
        """A held mail's agent's person is mentioned on it once, so the forge tells them.
        Once across messages too: each held message of the mail's thread tells it, under its
        own Message-ID's lock, and two on two replicas race (`comment_once`)."""
        agent = office.agent(mail.to_principal.removeprefix("agent:"))
        person = office.human(agent.person) if agent is not None and agent.person else None
        if person is None:
            return
        forge = self.services.forge_for_org(office.org)
        marker = markers.marker("email-held", mail.mail_id)
        await comment_once(forge, mail.vault, mail.number, fits(as_shown(
            forge, f"@{person.login} this mail is held for you: {as_data(reason)}"
            ". Release it to the agent by giving it the label `mail:new`, or drop it by "
            f"closing the issue.\n\n{marker}"), "the held note"), marker)

    async def thread_of(self, box: Mailbox, message: Inbound) -> MailRecord | None:
        """The agent's mail whose thread `message` answers (In-Reply-To, References): one the
        app's own reply names, or one made of a message it names."""
        store, office = self.services.store, box.office
        for ref in message.thread_refs[:MAX_THREAD_REFS]:
            mail_id = outgoing.mail_of_message_id(ref, box.domain)
            if mail_id is not None:
                found = await mails.get_mail(store, mail_id)
                if found is not None and found.org == office.org.lower() and (
                        found.to_principal == box.agent.principal
                        or sent_by(found, box.agent.principal)) \
                        and await self._written_by_app(office, found, ref, box.domain):
                    return found
                continue
            # (the id as the mail's table shows it: mention-defused, as the app posts it)
            for candidate in await mails.find_mails(store, org=office.org,
                                                    state=None, agent=box.agent.principal,
                                                    text=defuse_mentions(ref).strip("<>"),
                                                    limit=5):
                # (a mail made of a message: its meta line is the app's; anyone opening an
                # issue in the vault could write one in theirs)
                meta = read_meta(candidate.body) if candidate.from_principal.startswith(
                    "email:") else None
                if meta is not None and meta.message_id == ref \
                        and candidate.to_principal == box.agent.principal:
                    return candidate
        return None

    async def _written_by_app(self, office: Office, mail: MailRecord, ref: str,
                              domain: str) -> bool:
        """Whether `ref` is a Message-ID the app wrote for `mail` (its digest keyed, so only
        the app and those it sent it to know it), not one written from the mail id alone."""
        replies = await ledger.values_recorded(
            self.services.store, "mail.replied", mail.ref, "reply", org=mail.org,
            renamed=self.services.keyring.renamed(mail.org))
        return outgoing.written_by_app(
            ref, mail.mail_id, replies, domain,
            keys.message_id_secret(self.services.settings.data_dir, office.org))

    async def _add_to_thread(self, box: Mailbox, mail: MailRecord, message: Inbound,
                             verdicts: Verdicts, quiet: str | None, *,
                             held: bool = False) -> MailRecord:
        """The message as a comment on the thread's mail, and, unless an automaton sent it
        (or it is quiet), the mail the agent's turn again (a follow-up): once per sender
        (`sender_key`) and Message-ID.
        A `held` one says so in its meta line: no reply answers it (bot.email.outbox)."""
        store = self.services.store
        mailer = self.mailer(box.office)
        forge = mailer.forge
        sender = principal_of(message.sender)
        who = sender_key(message, verdicts).lower()
        marker = _marker(who, message.message_id)
        attached = await self._attach(box.office, mail.vault, mail.mail_id, message) \
            if message.parts else ()
        rendered = render_inbound(message, verdicts, quiet=quiet, attached=attached,
                                  held=held)
        text = fits(defuse_mentions(
            f"**{as_data(sender)}** wrote by email:\n\n{rendered}"
            f"\n\n{marker}"), "the message, its byline added")

        async def work() -> idempotency.Result:
            await comment_once(forge, mail.vault, mail.number, text, marker)
            if quiet is None:
                await idempotency.check_claim()  # (a try taken over moves nothing either)
                # the original sender writes again, or someone else in the thread (a Cc
                # answering all): the office hands it on (fenced again where it moves the
                # mail, which a try that stalls after the check, at the mail's lock, reaches
                # taken over: Mailer._fenced)
                actor = sender if sender == mail.from_principal else "office"
                await mailer.follow_up(mail, actor, text=message.text)
            return {"mail": mail.mail_id}

        # Once per sender (as the rate counts a copy): keyed by the thread and Message-ID
        # alone, Eve answering Bob's thread with the id Bob's answer would carry had his
        # answer taken for hers, answered 250 and never posted (found by review)
        await store.once(f"email-in:{box.office.org.lower()}",
                         f"{mail.ref}\n{who}\n{message.message_id}",
                         idempotency.fingerprint([mail.ref, who, message.message_id]), work)
        return await mails.get_mail(store, mail.mail_id) or mail

    async def bounced(self, box: Mailbox, bounce: Bounce) -> str | None:
        """A delivery report (RFC 3464) about a message the app sent: what became of it, for
        the SMTP answer; None when it is about no message of this office's (then it is mail
        like any other).

        A report is about a message of the mailbox's agent's (it goes to the message's
        sender): one sent to another agent's mailbox is mail like any other. It is
        unauthenticated: anyone who got the message knows its Message-ID and can write one.
        So it is believed only for a recipient the relay already accepted the
        message for (`email.sent`): a report of a later failure can only follow an
        acceptance. Then the mail is marked bounced and its agent told (`report_bounce`,
        `source: report`); that never settles a recipient for the outbox, which counts only
        what its relay said (bot.email.outbox `_settled`). Any other report (a recipient
        not accepted, deferred, or never sent to) is answered 250 as ignored, logged, and
        changes nothing (it is not ledgered: an outside sender writes nothing there)."""
        mail_id = outgoing.mail_of_message_id(bounce.original_id, box.domain)
        store = self.services.store
        mail = await mails.get_mail(store, mail_id) if mail_id else None
        # (a report goes to the sender of the message it is about: one to another agent's
        # mailbox is about no message of its own)
        if mail is None or mail.org != box.office.org.lower() \
                or emailing_agent(mail) != box.agent.principal:
            return None
        try:
            recipient = normalise(bounce.recipient)
        except BadAddress:
            recipient = ""
        if recipient not in await self.accepted(mail, bounce.original_id):
            log.warning("delivery report ignored: not for a recipient the relay accepted",
                        extra={"mail": mail.ref, "message_id": bounce.original_id,
                               "recipient": bounce.recipient[:254]})
            return (f"report on {bounce.original_id} for a recipient it was not accepted "
                    "for: ignored")
        # (the report's words are a stranger's: quoted as the report's, and the MTA named
        # only when it is a host name)
        mta = f" from `{bounce.reporting_mta}`" if bounce.reporting_mta else ""
        said = Said(f"The report{mta} says", bounce.diagnostic) if bounce.diagnostic else None
        told = await self.report_bounce(box.office, mail, bounce.original_id, [recipient],
                                        f"status {bounce.status or 'unknown'}",
                                        source="report", said=said)
        return f"bounce of {bounce.original_id} recorded as {told.mail_id}" if told else None

    async def accepted(self, mail: MailRecord, message_id: str) -> set[str]:
        """The recipients the relay accepted `message_id` for (each `email.sent`'s `to`)."""
        rows = await ledger.recorded_with(self.services.store, ("email.sent",), mail.ref,
                                          "message_id", message_id, org=mail.org,
                                          renamed=self.services.keyring.renamed(mail.org))
        return {str(r).lower() for row in rows for r in json.loads(row["data"]).get("to") or ()}

    async def report_bounce(self, office: Office, mail: MailRecord, message_id: str,
                            recipients: list[str], why: str, *,
                            source: Literal["relay", "report"],
                            said: Said | None = None) -> MailRecord | None:
        """The message `message_id` on `mail` will never arrive at `recipients`: a note on
        the mail's issue and a mail to its agent, in the thread, once. `why` is the app's
        words; `said`, the report's or the relay's, quoted below them. Ledgered
        `email.bounced` with the recipients (a list) and its `source`: `relay`, what the
        outbox decided (the relay's 5xx, the give-up, or a message it would not write), the
        only kind that settles a recipient (bot.email.outbox `_settled`); `report`, a
        delivery report believed."""
        recipient = ", ".join(recipients)
        sent_by_agent = mail.to_principal.startswith("email:")  # mail_send to an address
        # (an agent that has left is told nothing: the issue and the ledger say it)
        agent = office.agent(emailing_agent(mail).removeprefix("agent:"))
        store = self.services.store
        mailer = self.mailer(office)
        what = "mail" if sent_by_agent else "reply"
        digest = hashlib.sha256(f"{message_id}\n{recipient}".encode()).hexdigest()[:32]
        marker = markers.marker("email-bounced", digest)
        quoted = f"\n\n{said.quoted()}" if said is not None else ""
        note = fits(as_data(
            f"📭 The {what} sent by email as `{message_id}` to `{recipient}` bounced ({why})."
            + quoted) + f"\n\n{marker}", "the bounce note")
        subject = f"Undelivered: {mail.subject}"
        if len(subject) > MAX_SUBJECT:
            subject = subject[:MAX_SUBJECT - 1].rstrip() + "…"

        async def work() -> idempotency.Result:
            await comment_once(mailer.forge, mail.vault, mail.number, note, marker)
            told = None if agent is None else await mailer.send(
                "office", agent.principal, subject,
                f"Your {what} by email to `{recipient}` on {mail.ref} did not arrive: {why}."
                f"{quoted}\n\nThe {what}'s Message-ID: `{message_id}`.", reply_to=mail,
                check=False,
                idempotency_key=f"bounce\n{message_id}\n{recipient}")
            await ledger.record_once(store, "email.bounced", "office", mail.ref, {
                "mail": mail.mail_id, "message_id": message_id, "recipient": recipient,
                "recipients": list(recipients), "source": source,
                "why": (why + (f": {said.words}" if said is not None else ""))[:500],
                "told": told.mail_id if told else None}, org=office.org,
                by=("message_id", "recipient"), renamed=self.services.keyring.renamed(office.org))
            return {"mail": told.mail_id if told else ""}

        done = await store.once(f"email-bounce:{office.org.lower()}",
                                f"{message_id}\n{recipient}",
                                idempotency.fingerprint([message_id, recipient]), work)
        return await mails.get_mail(store, str(done["mail"])) if done["mail"] else None
