"""Replies out by email: an agent's `mail_reply` (or its comment on the issue) on mail from
`email:<address>` goes to that address through the relay, DKIM-signed, threaded, once.

It follows the office's ledger (`mail.replied` entries, each naming its reply) from a durable
cursor (`bot.store.outbound`, the webhooks' cursors, under the name `vaultmail:email-outbox`),
on the leader only. Each reply is sent under `Store.once`, keyed by its Message-ID (the same
on every try): a reply the relay accepted is never sent again by the app; a 4xx, or a relay
that cannot be reached, sets that message aside to be tried again with backoff (0.5 s
doubling up to 5 minutes) while the messages after it go on (a later one of its thread waits
behind it); a 5xx marks the reply bounced and tells the agent by mail.

Mail an agent sent to an address (`mail_send`, bot.email.sending) goes the same way, from the
`mail.sent` entry that ledgered it. Each message's fate is ledgered once: `email.sent`, its
first `email.deferred`, `email.bounced`. A message the relay keeps deferring (or that cannot
reach it, or that fails for any other reason) past `give_up_after` seconds from its first
deferral is given up: bounced, its agent told; one the app will not write
(`outgoing.Unsendable`) is bounced at once.
"""

from __future__ import annotations

import json
import logging
import re
import secrets
import time
from datetime import UTC, datetime
from functools import partial
from typing import TYPE_CHECKING, Any

from bot.app.background import Rounds, Work, backoff
from bot.email import keys, outgoing, relay
from bot.email.addresses import address_of, agent_address
from bot.email.intake import EmailIntake, Said
from bot.email.message import EmailMeta, read_meta
from bot.email.sending import may_email
from bot.forge import markers
from bot.forge.once import comment_once
from bot.mail.commands import words_besides_commands
from bot.mail.mailer import fits
from bot.mail.markdown import as_data, as_written
from bot.office.config import Agent, Office
from bot.store import idempotency, ledger, mails, replies
from bot.store import outbound as cursors
from bot.store.mails import MailRecord

if TYPE_CHECKING:
    from bot.app.services import Services
    from bot.forge.base import Forge

log = logging.getLogger("vaultmail.email")
CURSOR = "vaultmail:email-outbox"
RETRY = "vaultmail:email-retry:"  # + a message's ledger seq: one set aside (see `drain`)
POLL = 0.5
BATCH = 100
MAX_BACKOFF = 300.0
MAX_REPLY_CC = 19  # with its To, the recipients one message may have here (server.MAX_RECIPIENTS)
# the domain of a message first met when its office's config names none (RFC 2606's
# reserved TLD): never sent from it (`_entry` defers it), only its key and clock
NO_DOMAIN = "invalid"
GIVE_UP_AFTER = 5 * 24 * 3600.0  # as long as a common MTA keeps a message it cannot deliver


def key_is_mail(mail: MailRecord) -> bool:
    """Whether `mail` is one an agent sent to an address (not one from outside)."""
    return address_of(mail.to_principal) is not None


def _listed(recipients: tuple[str, ...] | list[str]) -> str:
    return ", ".join(f"`{r}`" for r in recipients)


def _said(answers: dict[str, str], recipients: list[str]) -> str:
    """What the relay said to these recipients: once, when it said it to the whole message
    alike; else for each."""
    if list(answers) == recipients and len(set(answers.values())) == 1:
        return next(iter(answers.values()))
    return "; ".join(f"{r}: {why}" for r, why in answers.items())


def _reply_addressees(latest: EmailMeta, domain: str, agent: Agent | None
                      ) -> tuple[tuple[str, ...], tuple[str, ...], tuple[str, ...]]:
    """A reply's To and Cc, and whom it leaves out: the sender of the message it answers, and
    the other addresses that message named, the office's own (`domain`) left out. The others
    only where the message passed authentication (`authenticated`) or the agent may mail them
    (`may_email`): else anyone could have the office send DKIM-signed mail to whoever they
    name."""
    ours = {a for a in (*latest.to, *latest.cc) if a.rpartition("@")[2] == domain}
    # (the addresses a stranger's message named: as many as the listener takes recipients
    # of one message, never a list of the stranger's to mail as the office)
    named = tuple(a for a in dict.fromkeys((*latest.to, *latest.cc))
                  if a not in ours and a != latest.sender)[:MAX_REPLY_CC]
    if authenticated(latest.verdicts):
        return (latest.sender,), named, ()
    cc = tuple(a for a in named if agent is not None and may_email(agent, a))
    return (latest.sender,), cc, tuple(a for a in named if a not in cc)


def authenticated(verdicts: dict[str, Any]) -> bool:
    """Whether a message's recorded verdicts say its From is its sender's: DMARC passed, or
    SPF or DKIM passed for the From domain (`Verdicts.aligned`)."""
    return verdicts.get("dmarc") == "pass" or bool(verdicts.get("aligned"))


def _ref(ref: str) -> tuple[str, int]:
    vault, _, number = ref.rpartition("#")
    return vault, int(number) if number.isdigit() else 0


async def _to_send(store: Any, org: str, cursor: int) -> list[ledger.Entry]:
    """The office's entries after `cursor` that may be email to send, oldest first, at most
    BATCH: replies (`mail.replied`) and mail sent (`mail.sent`), merged in order (each list
    holds every entry of its kind up to its last, so the first BATCH of both are complete)."""
    found: list[ledger.Entry] = []
    for event in ("mail.replied", "mail.sent"):
        found += await ledger.entries(store, since=cursor, limit=BATCH, org=org, event=event)
    return sorted(found, key=lambda e: e.seq)[:BATCH]


class Unproven(Exception):
    """The office's email domain is not proven its own now (bot.email.domains), so nothing
    goes out from it: a deferral like the relay's, tried again and given up past
    give_up_after, never sent whenever the domain is proven again, however late."""


class Deferred(Exception):
    """The relay said later (4xx) or could not be reached: to `recipients` (none named: the
    whole message). Its text is shown on the mail's issue: never an error's own text."""

    def __init__(self, detail: str, recipients: tuple[str, ...] = (), *,
                 whole: bool = True, by_relay: bool = False) -> None:
        super().__init__(detail)
        # by_relay: `detail` is the relay's own answer (quoted as its words), not the app's
        self.recipients, self.whole, self.by_relay = recipients, whole, by_relay


def _internal(office: Office, mail: MailRecord, message_id: str, exc: Exception) -> str:
    """What the mail's readers are told of a failure that is not the relay's answer (a key,
    the index, the forge): its text may name hosts, SQL or files, so it goes to the log
    alone, with the office, mail and message, under an id the note names."""
    error_id = secrets.token_hex(6)
    log.warning("email not sent: internal error %s", error_id, exc_info=exc, extra={
        "error_id": error_id, "org": office.org, "mail": mail.ref, "message_id": message_id,
        "error": f"{type(exc).__name__}: {exc}"})
    return f"an internal error (logged as {error_id})"


def reply_text(comment_body: str, key: str) -> str:
    """What the agent wrote, from its reply's comment: the byline and marker of a reply the
    app posted taken off, mentions as written."""
    text = markers.without_reply(comment_body, key)
    text = re.sub(r"^\*\*[^*\n]{1,120}\*\* replied:\n\n", "", text.lstrip())
    return as_written(text).strip()


def _own_reply_text(comment_body: str, key: str) -> str:
    """What the agent wrote in its own comment on the issue, its commands (a `/close` below
    its words) left out: they were for the app, not the reader."""
    return reply_text(words_besides_commands(comment_body), key)


class Outbox(Rounds):
    """Each office's messages go out in a task of its own (`Rounds`): one whose forge waits
    out its rate limit, or whose relay is slow to answer, holds up no other office's."""

    task_name = "vaultmail-email-outbox"
    poll = POLL

    def __init__(self, services: Services, intake: EmailIntake, relay_url: str, *,
                 give_up_after: float = GIVE_UP_AFTER) -> None:
        self.services, self.intake = services, intake
        self.relay = relay.Relay.parse(relay_url) if relay_url else None
        self.give_up_after = give_up_after
        super().__init__()

    async def _leading(self) -> bool:
        return await self.services.store.is_leader()

    async def _round(self) -> list[tuple[str, Work]]:
        return [(office.org.lower(), partial(self._drain, office))
                for office in await self.offices()]

    async def offices(self) -> list[Office]:
        """Every office whose config names an email domain, proven or not, and every one
        the outbox drained before whose config names none now (its `email:` section gone
        while messages waited): one not proven now, or with no domain, sends nothing
        (`drain`), but its messages' give-up clock runs."""
        found = [office for _, office in (await self.services.read_offices())[0]]
        drained = set(await cursors.orgs_with(self.services.store, CURSOR))
        return [office for office in found
                if office.email is not None or office.org.lower() in drained]

    async def _drain(self, office: Office) -> None:
        try:
            await self.drain(office)
        except Exception as exc:  # (what it did not send is tried again next round)
            log.warning("email outbox round failed: %r", exc, extra={"org": office.org})

    async def drain(self, office: Office) -> int:
        """Send the office's messages not sent yet; returns how many went.

        Messages deferred before are tried again first, each once its own backoff is over;
        then the ledger's new entries, in order. A message deferred now is set aside to be
        retried on its own (`_set_aside`), and the ones after it go on: only a later message
        of the same thread waits behind it, so its reader gets the thread in the order it
        was written (threading itself needs no order: each message names the messages by
        email it answers, never the app's earlier ones)."""
        org, store = office.org.lower(), self.services.store
        async with store.named_lock(f"email-outbox:{org}"):
            # a domain not proven now (its record taken away, DNS never answering, the
            # config naming none): each message that would go is deferred (`Unproven`), so
            # given up in time
            unproven = await self.intake.unproven_why(office)
            sent, now = 0, time.time()
            waiting: set[str] = set()  # threads with a message set aside before this one
            for seq, failures, next_at in await self.retrying(org):
                entry = await self._entry_at(org, seq)
                if entry is None:  # pruned away: nothing left to send
                    await self._done(org, seq)
                    continue
                thread = await self._thread(entry)
                if thread in waiting or next_at > now:
                    waiting.add(thread)
                    continue
                try:
                    sent += await self._entry(office, entry, unproven)
                except Exception as exc:
                    await self._set_aside(org, seq, failures + 1, exc)
                    waiting.add(thread)
                    continue
                await self._done(org, seq)
            row = await cursors.get_cursor(store, org, CURSOR)
            if row is not None and row["next_at"] > now:
                return sent
            cursor = int(row["seq"]) if row else 0
            for entry in await _to_send(store, org, cursor):
                thread = await self._thread(entry) if waiting else ""
                if thread in waiting:
                    await self._set_aside(org, entry.seq, 0, None)  # its turn after those
                else:
                    try:
                        sent += await self._entry(office, entry, unproven)
                    except Exception as exc:
                        await self._set_aside(org, entry.seq, 1, exc)
                        waiting.add(await self._thread(entry))
                cursor = entry.seq
            if cursor != (int(row["seq"]) if row else -1):
                await cursors.save_cursor(store, org, CURSOR, cursor, 0, 0.0, None)
            return sent

    # -- messages set aside (deferred, or behind one of their thread) ----------------------
    # Each is a row of the outbound cursors (bot.store.outbound) named RETRY + its ledger seq,
    # with its own failures and next try: durable across restarts and leaders, as the main
    # cursor is.

    async def retrying(self, org: str) -> list[tuple[int, int, float]]:
        """The office's messages set aside, oldest first: (ledger seq, failures, next try)."""
        rows = await cursors.cursors_under(self.services.store, org, RETRY)
        return [(int(r["seq"]), int(r["failures"]), float(r["next_at"])) for r in rows]

    async def _set_aside(self, org: str, seq: int, failures: int,
                         exc: Exception | None) -> None:
        delay = backoff(failures, MAX_BACKOFF) if failures else 0.0
        await cursors.save_cursor(self.services.store, org, f"{RETRY}{seq}", seq, failures,
                                  time.time() + delay, repr(exc) if exc else None)
        if exc is not None:
            log.warning("email not sent; retry in %.1fs", delay,
                        extra={"seq": seq, "error": repr(exc)})

    async def _done(self, org: str, seq: int) -> None:
        await cursors.drop_cursor(self.services.store, org, f"{RETRY}{seq}")

    async def _entry_at(self, org: str, seq: int) -> ledger.Entry | None:
        found = await ledger.entries(self.services.store, since=seq - 1, limit=1, org=org)
        return found[0] if found and found[0].seq == seq else None

    async def _thread(self, entry: ledger.Entry) -> str:
        """The thread of the mail an entry is about (its seq when it names none)."""
        mail = await mails.get_mail(self.services.store, str(entry.data.get("mail", "")))
        return mail.thread_id if mail is not None and mail.thread_id else f"seq:{entry.seq}"

    async def _entry(self, office: Office, entry: ledger.Entry,
                     unproven: str | None = None) -> int:
        if entry.event == "mail.sent" and not str(entry.data.get("to", "")).startswith("email:"):
            return 0  # mail inside the office (most of them): nothing to look up
        mail = await mails.get_mail(self.services.store, str(entry.data.get("mail", "")))
        if mail is None:
            return 0
        secret = keys.message_id_secret(self.services.settings.data_dir, office.org)
        if entry.event == "mail.sent":
            if entry.data.get("to") != mail.to_principal or address_of(mail.to_principal) is None:
                return 0  # not mail to an address
            key, local = None, outgoing.mail_message_id(mail.mail_id, "", secret)
        else:
            key = entry.data.get("reply")
            if not isinstance(key, str) or address_of(mail.from_principal) is None:
                return 0  # not a reply to mail by email
            local = outgoing.reply_message_id(mail.mail_id, key, "", secret)
        # its Message-ID (its key here, its ledger entries') at the domain it was first tried
        # from, else the office's now: the config dropping its `email:` section or naming
        # another domain restarts no clock and sends no second copy; it is deferred (below)
        now = office.email.domain if office.email is not None else None
        domain = await self._tried_from(office, mail, local[:-1]) or now or NO_DOMAIN
        message_id = f"{local[:-1]}{domain}>"
        if unproven is None and domain != now:
            unproven = "it was written while the office's config named no email domain" \
                if domain == NO_DOMAIN else f"it was to go from {domain}, and the office's " \
                f"config names {now} now"

        async def work() -> idempotency.Result:
            if unproven is not None:  # (checked under its key: one sent already stays sent)
                raise Unproven(unproven)
            if key is None:
                return await self._send_mail(office, mail, message_id)
            return await self._send(office, mail, key, message_id)

        scope, fingerprint = f"email-out:{office.org.lower()}", idempotency.fingerprint(
            message_id)
        try:
            result = await self.services.store.once(scope, message_id, fingerprint, work)
        except Exception as exc:
            # the relay deferring it, or anything else that kept it from going (a key that
            # cannot be read, a forge that keeps failing, a domain not proven): tried again,
            # and given up past give_up_after like a deferral, so the thread's later messages
            # queue behind it for that long, never forever, and none goes late
            deferred = exc if isinstance(exc, Deferred) else None
            unproven_now = isinstance(exc, Unproven)  # (the app's own words, as a relay's)
            detail = str(exc) if deferred or unproven_now \
                else _internal(office, mail, message_id, exc)
            kept = "the relay kept deferring it" if deferred else \
                "it could not go" if unproven_now else "it kept failing"
            waiting = deferred.recipients if deferred else ()
            first = await self._deferred(office, mail, message_id, detail, waiting,
                                         whole=deferred.whole if deferred else True,
                                         by_relay=bool(deferred and deferred.by_relay))
            if time.time() - first < self.give_up_after:
                raise

            async def give_up() -> idempotency.Result:
                # the recipients still deferred, or (a failure before the relay answered)
                # every one no try settled: the ones the relay took are sent; the ones it
                # refused for good were bounced when it did
                why = f"{kept} for {self.give_up_after:,.0f} seconds and the app gave up"
                said = Said("The relay last said", detail) if deferred and deferred.by_relay \
                    else None
                why += "" if said else f": {detail}"
                whom = list(waiting) or await self._unsettled(office, mail, key, message_id,
                                                              domain)
                if whom:
                    await self.intake.report_bounce(office, mail, message_id, whom, why,
                                                    source="relay", said=said)
                return {"state": "bounced", "detail": why, "to": whom}

            result = await self.services.store.once(scope, message_id, fingerprint, give_up)
        return 1 if result.get("state") == "sent" else 0

    async def _tried_from(self, office: Office, mail: MailRecord, local: str) -> str | None:
        """The domain a message whose Message-ID begins `local` (`<vm.<mail>.<digest>@`: the
        same at any domain) was first tried from, by its ledger entries; None if never."""
        renamed = self.services.keyring.renamed(office.org)
        for event in ("email.deferred", "email.sent", "email.bounced"):
            for message_id in await ledger.values_recorded(
                    self.services.store, event, mail.ref, "message_id", org=office.org,
                    renamed=renamed):
                if message_id.startswith(local) and message_id.endswith(">"):
                    return message_id[len(local):-1]
        return None

    async def _deferred(self, office: Office, mail: MailRecord, message_id: str,
                        detail: str, recipients: tuple[str, ...] = (), *,
                        whole: bool = True, by_relay: bool = False) -> float:
        """Ledger the message's first deferral (`email.deferred`, once, with the recipients
        deferred) and say so on the mail's issue, naming them unless it is the whole
        message; when it was. The recipients a later try defers are among the first's: each
        try goes only to the ones not accepted or refused for good yet. `by_relay`: `detail`
        is the relay's answer (another mail system's words, relayed), quoted as theirs."""
        store, renamed = self.services.store, self.services.keyring.renamed(office.org)
        first = await ledger.record_once(store, "email.deferred", "office", mail.ref, {
            "mail": mail.mail_id, "message_id": message_id, "detail": detail[:500],
            "recipients": list(recipients)}, org=office.org, by=("message_id",),
            renamed=renamed)
        if first is not None:
            forge = self.services.forge_for_org(office.org)
            marker = markers.marker("email-deferred", message_id.strip("<>"))
            whom = f" for {_listed(recipients)}" if recipients and not whole else ""
            why = "" if by_relay else f" ({detail[:500]})"
            said = f"\n\n{Said('The relay said', detail[:500]).quoted()}" if by_relay else ""
            await forge.create_comment(mail.vault, mail.number, fits(as_data(
                f"⏳ Deferred{whom}: `{message_id}` is not sent{' to them' if whom else ''} "
                f"yet{why}; tried again with backoff, and given up as bounced after "
                f"{self.give_up_after:,.0f} seconds.{said}") + f"\n\n{marker}",
                "the deferral note"), marker=marker)
        first_at = await ledger.first_recorded(store, "email.deferred", mail.ref,
                                               "message_id", message_id, org=office.org,
                                               renamed=renamed)
        return first_at if first_at is not None else time.time()

    async def _settled(self, mail: MailRecord,
                       message_id: str) -> tuple[list[tuple[str, ...]], set[str]]:
        """The recipients of `message_id` an earlier try settled, from the ledger: the parts
        the relay accepted (each `email.sent`'s `to`), and the recipients the outbox itself
        bounced (`email.bounced` with `source: relay`: the relay's 5xx, or the give-up).
        A delivery report from outside (`source: report`, bot.email.intake `bounced`)
        settles nothing: it is unauthenticated, and only ever about an accepted one."""
        parts: list[tuple[str, ...]] = []
        bounced: set[str] = set()
        rows = await ledger.recorded_with(self.services.store, ("email.sent", "email.bounced"),
                                          mail.ref, "message_id", message_id, org=mail.org,
                                          renamed=self.services.keyring.renamed(mail.org))
        for row in rows:
            data = json.loads(row["data"])
            if row["event"] == "email.sent":
                parts.append(tuple(str(r) for r in data.get("to") or ()))
            elif data.get("source") == "relay":
                bounced.update(str(r) for r in data.get("recipients") or ())
        return parts, bounced

    async def _unsettled(self, office: Office, mail: MailRecord, key: str | None,
                         message_id: str, domain: str | None = None) -> list[str]:
        """Each recipient of `message_id` no try settled (`_settled`): its To and Cc, as
        far as the app can tell them now (`_addressees`), less the ones sent or bounced."""
        parts, bounced = await self._settled(mail, message_id)
        settled = bounced.union(*parts)
        domain = domain or (office.email.domain if office.email is not None else NO_DOMAIN)
        return [r for r in await self._addressees(office, mail, key, domain)
                if r not in settled]

    async def _addressees(self, office: Office, mail: MailRecord, key: str | None,
                          domain: str) -> list[str]:
        """Whom the message goes to: the address mail was sent to; a reply's To and Cc
        (`_reply_addressees`) from the thread's latest message by email, or its first one
        when the forge cannot be read (its failing may be why the reply did not go)."""
        if key is None:
            return [a for a in (address_of(mail.to_principal),) if a is not None]
        latest = read_meta(mail.body)
        try:
            latest = (await self._reply_and_latest(
                self.services.forge_for_org(office.org), mail, key))[1]
        except Exception:
            log.warning("the reply's recipients read from its mail alone",
                        extra={"mail": mail.ref, "reply": key}, exc_info=True)
        if latest is None:
            return [a for a in (address_of(mail.from_principal),) if a is not None]
        agent = office.agent(mail.to_principal.removeprefix("agent:"))
        to, cc, _ = _reply_addressees(latest, domain, agent)  # (the message's own domain)
        return list(dict.fromkeys((*to, *cc)))

    async def _deliver(self, office: Office, mail: MailRecord, out: outgoing.Outgoing,
                       note: str) -> dict[str, Any]:
        """Hand `out` to the relay, DKIM-signed, for each recipient not settled by an earlier
        try (the same message, Message-ID and headers; the envelope names the rest). The
        relay's answer is each recipient's: the accepted ones are sent (a comment on the
        issue, `email.sent` naming them), the refused ones for good bounced (the agent told,
        naming them), and the deferred ones raise Deferred, to be tried again on their own.

        The accepted ones are ledgered right after the relay's answer, before anything else.
        A try taken over stops at the fence, before the relay has anything of it: a crash, or
        a stall past the takeover, between the relay's DATA and that ledgering are the ways a
        recipient gets the message twice (the retry goes to it again), and the Message-ID,
        the same on every try, lets its mail system drop the copy."""
        if self.relay is None:
            raise Deferred("no relay: set SMTP_URL to send mail by email")
        message_id = out.message_id
        parts, bounced = await self._settled(mail, message_id)
        accepted = {r for part in parts for r in part}
        for part in parts:  # an earlier try's, its comment perhaps not written (it failed)
            await self._sent(office, mail, out, note, part, ledgered=True)
        todo = [r for r in out.recipients if r not in accepted and r not in bounced]
        if todo and (data := await self._written(office, mail, out, todo)) is not None:
            # the fence (as before an issue's creation): a try that stalled past DEAD_AFTER
            # and was taken over hands the relay nothing; its new owner sends it
            answer = await relay.send(self.relay, out.sender, todo, data,
                                      fence=idempotency.check_claim)
            if answer.failure is not None:  # (the note says only what kind of failure)
                log.warning("email relay unreachable", extra={
                    "org": office.org, "mail": mail.ref, "message_id": message_id,
                    "error": answer.failure})
            if answer.accepted:
                await self._sent(office, mail, out, note, answer.accepted)
                accepted.update(answer.accepted)
            if answer.rejected:
                await self.intake.report_bounce(
                    office, mail, message_id, list(answer.rejected), "the relay refused it",
                    source="relay",
                    said=Said("The relay said", _said(answer.rejected, out.recipients)))
            if answer.deferred:
                raise Deferred(_said(answer.deferred, out.recipients), tuple(answer.deferred),
                               whole=list(answer.deferred) == out.recipients,
                               by_relay=answer.failure is None)
        sent = [r for r in out.recipients if r in accepted]
        if not sent:
            return {"state": "bounced", "message_id": message_id}
        return {"state": "sent", "message_id": message_id, "to": sent,
                "bounced": [r for r in out.recipients if r not in accepted]}

    async def _written(self, office: Office, mail: MailRecord, out: outgoing.Outgoing,
                       todo: list[str]) -> bytes | None:
        """`out` as it goes to the relay, DKIM-signed; None when the app will not write it
        (outgoing.Unsendable: an address or id that would not stay one header value), which
        no retry changes: then bounced to `todo` at once, the agent told why."""
        assert office.email is not None
        try:
            wire = outgoing.to_wire(outgoing.compose(out))
        except outgoing.Unsendable as exc:
            await self.intake.report_bounce(office, mail, out.message_id, todo,
                                            f"the app would not write it: {exc}",
                                            source="relay")
            return None
        return outgoing.sign(wire, domain=office.email.domain, private_pem=keys.office_key(
            self.services.settings.data_dir, office.org))

    async def _sent(self, office: Office, mail: MailRecord, out: outgoing.Outgoing,
                    note: str, to: tuple[str, ...], *, ledgered: bool = False) -> None:
        """The relay accepted `out` for `to`: ledgered (`email.sent`, once per message and
        recipients: a message a relay took in parts has one for each part; not again when
        `ledgered`, a part read from the ledger) and said on the issue, once."""
        message_id = out.message_id
        if not ledgered:
            actor = mail.from_principal if key_is_mail(mail) else mail.to_principal
            await ledger.record_once(self.services.store, "email.sent", actor, mail.ref, {
                "mail": mail.mail_id, "message_id": message_id, "to": list(to),
                "recipients": ", ".join(to), "hops": out.hops}, org=office.org,
                by=("message_id", "recipients"),
                renamed=self.services.keyring.renamed(office.org))
        forge = self.services.forge_for_org(office.org)
        part = () if list(to) == out.recipients else (markers.token("\n".join(to), 16),)
        marker = markers.marker("email-sent", message_id.strip("<>"), *part)
        await comment_once(forge, mail.vault, mail.number, (
            f"📤 {note} by email to {_listed(to)} as `{message_id}`.\n\n{marker}"), marker)
        if not ledgered:
            log.info("email sent", extra={"mail": mail.ref, "message_id": message_id,
                                          "to": list(to)})

    async def _send_mail(self, office: Office, mail: MailRecord,
                         message_id: str) -> dict[str, Any]:
        """Mail an agent sent to an address (bot.email.sending)."""
        assert office.email is not None
        agent = office.agent(mail.from_principal.removeprefix("agent:"))
        to = address_of(mail.to_principal)
        if to is None:
            return {"state": "skipped", "why": "no address"}
        # what let the agent mail `to` (mail_send checked it) is checked again as it goes:
        # the office may have taken it away while the message waited
        if agent is None:
            return await self._withheld(office, mail, None, message_id,
                                        f"{mail.from_principal} has left the office")
        if not may_email(agent, to):
            return await self._withheld(
                office, mail, None, message_id,
                f"{agent.slug}'s capabilities.mail.send no longer allows {to}")
        sender = agent_address(office, agent)
        if sender is None:
            return {"state": "skipped", "why": "no agent address"}
        # in answer to mail by email: threaded after the latest message of that thread
        answered = await mails.mail_at(self.services.store, *_ref(mail.in_reply_to)) \
            if mail.in_reply_to else None
        latest = read_meta(answered.body) if answered is not None else None
        out = outgoing.Outgoing(
            sender=sender, sender_name=f"{agent.slug} ({office.org})", to=(to,), cc=(),
            subject=mail.subject, message_id=message_id,
            in_reply_to=latest.message_id if latest else None,
            references=(*latest.references, latest.message_id) if latest else (),
            text=as_written(mail.body), sent=datetime.now(UTC),
            automatic=False, hops=mail.hops)
        return await self._deliver(office, mail, out, "Sent")

    async def _send(self, office: Office, mail: MailRecord, key: str,
                    message_id: str) -> dict[str, Any]:
        if office.agent(mail.to_principal.removeprefix("agent:")) is None:
            return await self._withheld(office, mail, key, message_id,
                                        f"{mail.to_principal} has left the office")
        if self.relay is None:
            raise Deferred("no relay: set SMTP_URL to send replies by email")
        assert office.email is not None
        forge = self.services.forge_for_org(office.org)
        text, latest = await self._reply_and_latest(forge, mail, key)
        if text is None:
            raise Deferred(f"the reply {key} is not on {mail.ref} yet")
        agent = office.agent(mail.to_principal.removeprefix("agent:"))
        sender = agent_address(office, agent) if agent is not None else None
        if agent is None or sender is None or latest is None:
            return {"state": "skipped", "why": "no agent address or no message to answer"}
        to, cc, left_out = _reply_addressees(latest, office.email.domain, agent)
        if left_out:
            await self._tell_left_out(forge, mail, message_id, agent, left_out, latest)
        out = outgoing.Outgoing(
            sender=sender, sender_name=f"{agent.slug} ({office.org})",
            to=to, cc=cc, subject=outgoing.reply_subject(mail.subject),
            message_id=message_id, in_reply_to=latest.message_id,
            references=(*latest.references, latest.message_id), text=text,
            # one hop past what it answers: the thread's mail, or a later answer in it that
            # carried more (two agents answering in one thread climb as by mail)
            sent=datetime.now(UTC), hops=max(mail.hops, latest.hops or 0) + 1)
        return await self._deliver(office, mail, out, "Sent")

    async def _withheld(self, office: Office, mail: MailRecord, key: str | None,
                        message_id: str, why: str) -> dict[str, Any]:
        """Not sent, ever: what let the message go no longer holds as it is to go (its agent
        has left the office, or may no longer email the address). A permission is checked
        when what it allows takes effect: the message waited (the outbox, a deferral), and
        held, it would go whenever the permission came back, in another context. Bounced
        to every recipient no try settled (`report_bounce`: the issue says why, the agent
        is told by mail if it is still here, `email.bounced`)."""
        why = f"not sent: {why}"
        whom = await self._unsettled(office, mail, key, message_id)
        if whom:
            await self.intake.report_bounce(office, mail, message_id, whom, why,
                                            source="relay")
        log.info("email withheld", extra={"org": office.org, "mail": mail.ref,
                                          "message_id": message_id, "why": why})
        return {"state": "bounced", "detail": why, "to": whom}

    @staticmethod
    async def _tell_left_out(forge: Forge, mail: MailRecord, message_id: str, agent: Agent,
                             left_out: tuple[str, ...], latest: EmailMeta) -> None:
        """A note on the mail's issue, once a reply: the addresses its message named that the
        reply does not go to, and why (`_reply_addressees`)."""
        marker = markers.marker("email-left-out", message_id.strip("<>"))
        dmarc = as_data(str(latest.verdicts.get("dmarc") or "none"))
        await comment_once(forge, mail.vault, mail.number, fits(
            f"✂️ Not copied to {_listed(left_out)}: the message answered named them, but "
            f"it did not pass authentication (DMARC {dmarc}, no SPF or DKIM pass for its "
            f"From domain) and {agent.slug}'s capabilities.mail.send does not list them. "
            f"The reply `{message_id}` goes to {_listed((latest.sender,))} and the "
            f"addresses it may mail.\n\n{marker}", "the note"), marker)

    async def _reply_and_latest(self, forge: Forge, mail: MailRecord,
                                key: str) -> tuple[str | None, EmailMeta | None]:
        """The reply's text (None while it is not on the issue), and the latest message by
        email before it in the thread (what it answers): the mail's own, or a later one
        posted as a comment, not held as it came (its From may be forged, or one the
        agent's policy does not take: no one released it, so it names no recipient)."""
        latest = read_meta(mail.body)
        comments = await forge.list_comments(mail.vault, mail.number)
        reply: dict[str, Any] | None = None
        wanted_id = key.removeprefix("comment:") if key.startswith("comment:") else None
        for comment in comments:
            body = str(comment.get("body") or "")
            # the reply's comment and a later message by email are comments the app posted,
            # as it writes them (its markers where it puts them): anyone may write markers,
            # and the app posts others' words too; they would name the reply's text and
            # recipients
            by_app = self.services.by_app(comment)
            if (str(comment.get("id")) == wanted_id if wanted_id is not None
                    else by_app and markers.is_reply(body, key)):
                reply = comment
                break
            if by_app and body.startswith("**email:") and "<!-- vaultmail:email-in " in body:
                meta = read_meta(body)
                latest = meta if meta is not None and not meta.held else latest
        if reply is None and wanted_id is not None:
            reply = await forge.get_comment(mail.vault, int(wanted_id))
        return await self._words(mail, key, reply), latest

    async def _words(self, mail: MailRecord, key: str,
                     reply: dict[str, Any] | None) -> str | None:
        """What the agent wrote in reply `key`, as the app kept it when the reply was made
        (`bot.store.replies`): its comment may have been edited since by anyone who may
        write to the vault, and the email is the agent's. Past the doctor's window, when no
        words are kept, the comment's own, only if it was never edited."""
        if reply is None:
            return None
        read = _own_reply_text if key.startswith("comment:") else reply_text
        kept = await replies.kept(self.services.store, mail.mail_id, key)
        if kept is not None:
            return read(kept, key)
        if reply.get("updated_at") != reply.get("created_at"):
            raise Deferred(f"the reply {key} was edited on {mail.ref} since it was written, "
                           "and its words as written are no longer kept: not sent as edited")
        return read(str(reply.get("body") or ""), key)
