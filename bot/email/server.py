"""The SMTP listener (aiosmtpd, on the app's event loop): each answer says what happened.

| when | answer |
|---|---|
| RCPT to an unknown address, or one of an agent that has left | `550 5.1.1` naming it, alike |
| RCPT to a domain an office names but has not proven in DNS | `550 5.7.1` naming the record |
| RCPT to an agent refusing on other terms than the first recipient's | `452 4.5.3`: alone |
| RCPT from an address past its refused RCPTs a minute | `450 4.7.1`, before any lookup |
| a message (SIZE or DATA) over the limit | `552 5.3.4` naming the limit |
| an attachment over its limit, or more attachments than it may carry | `552 5.3.4` naming it |
| no From address the app takes, or two of a header allowed once (MIME's too) | `550 5.6.0` |
| a bare CR or LF, a line no header field, a `From ` line past the first (headers) | `550 5.6.0` |
| its From proven by DKIM alone: Subject, Message-ID, body unsigned; no Message-ID | `550 5.7.1` |
| ... and its To, Cc, In-Reply-To or References not signed | delivered, those not read |
| its From not authenticated, its domain's DMARC record not to be looked up now | `451 4.7.0` |
| the app not started yet, or the forge or the index failing | `451 4.3.0`: send it again later |
| past a rate: one From's, or one authenticated domain's, to an agent | `451 4.7.1` |
| past an address's rate: its messages authenticated (before a lookup), or not | `451 4.7.1` |
| RCPT to an agent whose vault is gone or archived | `550 5.7.1`, no repository named |
| the agent's vault gone or archived since RCPT, it the only recipient | `550 5.7.1` alike |
| one of several recipients gone (left, its vault closed, refusing) since RCPT | `451 4.3.0` |
| delivered | `250 2.0.0` naming each mail's issue |

A message is answered 250 only once it is mail on the forge for every recipient RCPT took,
so an accepted message is never lost: DATA has one answer for all of them (RFC 5321), so a
copy refused beside others delivered would be counted delivered. What can be known at RCPT is
refused there, and what changes between RCPT and DATA is 451 for the whole message (the
copies delivered kept): one the client sends again after a 451 or a timeout is delivered
once (bot.email.intake), and its RCPTs refuse the recipient alone, with why.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import ssl
import time
import weakref
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from aiosmtpd.smtp import SMTP, Envelope, Session

from bot.app.peers import PerAddress, address_key
from bot.email.addresses import BadAddress, normalise
from bot.email.attachments import MAX_ATTACHMENTS, safe_name
from bot.email.auth import DnsError, Resolver, Verdicts, authenticate, organisational
from bot.email.intake import EmailIntake
from bot.email.message import (
    SIGNED_OR_REFUSED,
    BadMessage,
    Inbound,
    parse_dsn,
    parse_inbound,
)
from bot.email.policy import SharedSenderRate, refusing, sender_key, unlearned
from bot.mail.mailer import Undeliverable

log = logging.getLogger("vaultmail.email")
MAX_RECIPIENTS = 20
# A stranger's message is read and authenticated on threads of the listener's own, never on
# the event loop's default pool: that pool is every office's (config parsing, key loading,
# domain proofs, the relay's sends), and a message's lookups name domains its sender chooses,
# whose DNS may answer as slowly as it likes. AUTH_SECONDS bounds one message's lookups:
# past it, what is left is a temporary error (temperror), not another wait.
STRANGER_THREADS = 8
AUTH_SECONDS = 20.0
# Messages one connecting address may have authenticated a minute, as a multiple of the sender
# rate, counted before the lookups, each of which names a domain the sender chooses: counted
# after them, one address had the app ask DNS for all it sent (an amplifier against the name
# servers, and work on the listener's threads)
AUTH_TIMES = 5


class _Deadline:
    """`resolver`, each lookup refused (DnsError) once the message's time is spent."""

    def __init__(self, resolver: Resolver, seconds: float) -> None:
        self.resolver, self.until = resolver, time.monotonic() + seconds

    def _spent(self, what: str) -> None:
        if time.monotonic() > self.until:
            raise DnsError(f"{what}: the message's lookups took over {AUTH_SECONDS:g} s")

    def txt(self, name: str) -> list[str]:
        self._spent(f"TXT {name}")
        return self.resolver.txt(name)

    def addresses(self, name: str) -> list[str]:
        self._spent(f"A {name}")
        return self.resolver.addresses(name)

    def mx(self, name: str) -> list[str]:
        self._spent(f"MX {name}")
        return self.resolver.mx(name)


def _limit_text(limit: int) -> str:
    return f"{limit:,} bytes ({limit / 1_048_576:.1f} MiB)"


# Each session may hold a message of up to SMTP_MAX_BYTES in memory while it is read: one
# address holds at most MAX_PEER_SESSIONS at once, everyone together MAX_SESSIONS (as a
# common MTA's defaults); past them a session is answered 421 and closed.
MAX_SESSIONS = 100
MAX_PEER_SESSIONS = 10


class Sessions:
    """The sessions the listener holds, per peer address."""

    def __init__(self) -> None:
        self.by_peer: dict[str, int] = {}
        self.total = 0

    def admit(self, peer: str) -> str | None:
        """None, counting the session in; else why it is refused."""
        if self.total >= MAX_SESSIONS:
            return f"too many sessions (at most {MAX_SESSIONS} at once): try again later"
        if self.by_peer.get(peer, 0) >= MAX_PEER_SESSIONS:
            return (f"too many sessions from your address (at most {MAX_PEER_SESSIONS} at "
                    "once): try again later")
        self.by_peer[peer] = self.by_peer.get(peer, 0) + 1
        self.total += 1
        return None

    def release(self, peer: str) -> None:
        self.total -= 1
        if (left := self.by_peer[peer] - 1) > 0:
            self.by_peer[peer] = left
        else:
            del self.by_peer[peer]


class LimitedSMTP(SMTP):
    """aiosmtpd's server, its size refusals naming the limit, its sessions counted."""

    def __init__(self, *args: Any, sessions: Sessions, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._sessions = sessions
        self._counted: str | None = None  # the peer this session is counted for
        self._refused = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        if self.transport is None and self._counted is None:  # (not STARTTLS's second call)
            peer = transport.get_extra_info("peername")
            address = str(peer[0]) if isinstance(peer, tuple) else ""
            refusal = self._sessions.admit(address)
            if refusal is not None:
                self._refused = True
                assert isinstance(transport, asyncio.WriteTransport)
                transport.write(f"421 4.7.0 {refusal}\r\n".encode())
                transport.close()
                return
            self._counted = address
        super().connection_made(transport)

    def connection_lost(self, error: Exception | None) -> None:
        if self._refused:
            return
        try:
            super().connection_lost(error)
        finally:
            if self._counted is not None:
                self._sessions.release(self._counted)
                self._counted = None

    async def push(self, status: Any) -> None:
        if isinstance(status, str) and status.startswith("552 Error:") and self.data_size_limit:
            status = (f"552 5.3.4 Message too big: this server takes at most "
                      f"{_limit_text(self.data_size_limit)}")
        await super().push(status)


class SmtpHandler:
    """aiosmtpd's handler hooks. `intake` is None until the app has started."""

    def __init__(self, intake: Callable[[], EmailIntake | None], resolver: Resolver, *,
                 rate: SharedSenderRate, attachment_max_bytes: int) -> None:
        self._intake = intake
        self.resolver = resolver
        self.rate = rate
        # mail whose From is not authenticated, per connecting address: its From is anyone's
        # to write, so the rate per sender alone let one address have the app write an issue
        # for every message by writing a new From each time
        self.peers = PerAddress(rate.per_minute)
        # every message's authentication, per connecting address, authenticated or not: its
        # lookups are paid for before they are made (AUTH_TIMES)
        self.lookups = PerAddress(rate.per_minute * AUTH_TIMES)
        # RCPTs refused (no such mailbox, a domain not proven), per connecting address: each
        # was looked up in the offices' configs and the index, and said whether a name is an
        # agent's; unbounded, one session asked 2,000 names in 7 s
        self.unknown = PerAddress(rate.per_minute * AUTH_TIMES)
        self.attachment_max_bytes = attachment_max_bytes
        # each transaction's recipients' policy terms (`refusing`), as its first set them
        self._terms: weakref.WeakKeyDictionary[Envelope, tuple[str, str] | None] = \
            weakref.WeakKeyDictionary()
        self._pool = ThreadPoolExecutor(STRANGER_THREADS, thread_name_prefix="vaultmail-smtp")

    async def _beside(self, fn: Callable[..., Any], *args: Any) -> Any:
        return await asyncio.get_running_loop().run_in_executor(self._pool, fn, *args)

    def _authenticate(self, raw: bytes, ip: str, helo: str, mail_from: str,
                      from_domain: str) -> Verdicts:
        return authenticate(raw, ip=ip, helo=helo, mail_from=mail_from,
                            from_domain=from_domain,
                            resolver=_Deadline(self.resolver, AUTH_SECONDS))

    def close(self) -> None:
        """Let the listener's threads go (a lookup under way ends within its lifetime)."""
        self._pool.shutdown(wait=False, cancel_futures=True)

    def refuse_parts(self, message: Inbound) -> str | None:
        """The 552 for a message whose attachments the app does not take, or None."""
        if len(message.parts) > MAX_ATTACHMENTS:
            return (f"552 5.3.4 Too many attachments: this server takes at most "
                    f"{MAX_ATTACHMENTS} a message")
        limit = self.attachment_max_bytes
        for part in message.parts:
            if len(part.data) > limit:
                return (f"552 5.3.4 Attachment too big: {safe_name(part.filename)} is "
                        f"{len(part.data):,} bytes; this server takes attachments of at most "
                        f"{_limit_text(limit)}")
        return None

    async def handle_RCPT(self, server: SMTP, session: Session, envelope: Envelope,
                          address: str, rcpt_options: list[str]) -> str:
        intake = self._intake()
        if intake is None:
            return "451 4.3.0 vaultmail is starting: try again later"
        try:
            normalise(address)
        except BadAddress as exc:
            return f"553 5.1.3 {exc}"
        if len(envelope.rcpt_tos) >= MAX_RECIPIENTS:
            return f"452 4.5.3 at most {MAX_RECIPIENTS} recipients a message"
        peer = address_key(str(session.peer[0]) if isinstance(session.peer, tuple) else "")
        if self.unknown.spent(peer):  # (before the lookup: a real name's answer alike)
            return (f"450 4.7.1 too many unknown recipients from your address: at most "
                    f"{self.unknown.limit} a minute; try again later")
        try:
            box = await intake.mailbox(address)
            # a domain no office has proven its own in DNS (bot.email.domains)
            unproven = None if box is not None else await intake.unproven(address)
            if box is None and unproven is None:
                # an agent that has left: ledgered once, answered as an unknown address (an
                # unauthenticated sender learns nothing of who was ever here)
                await intake.left(address)
        except Exception as exc:
            log.warning("RCPT lookup failed", extra={"error": repr(exc)})
            return "451 4.3.0 the office config cannot be read now: try again later"
        if box is None:
            self.unknown.admit(peer)
        if unproven is not None:
            return f"550 5.7.1 <{address[:200]}>: {unproven}"
        if box is None:
            return f"550 5.1.1 <{address[:200]}>: no such mailbox here"
        # A vault gone or archived was found only at DATA, whose answer is every
        # recipient's: beside another recipient's delivery the refusal was lost in a 250's
        # text and the copy counted delivered. It is known here: refused alone.
        try:
            closed = await intake.closed(box)
        except Exception as exc:
            log.warning("RCPT vault lookup failed", extra={"error": repr(exc)})
            return "451 4.3.0 the mailbox cannot be looked up now: try again later"
        if closed is not None:  # (a stranger learns no repository's name)
            return f"550 5.7.1 <{address[:200]}>: this mailbox takes no mail now"
        # The answer to DATA is every recipient's (RFC 5321): a message one recipient's
        # policy refuses and another's takes was answered 250 and the refusal lost in its
        # text. A recipient whose policy may refuse on other terms than the first's waits
        # for a message of its own (452: the sender's server sends it again alone).
        terms = refusing(box.office, box.agent)
        if envelope.rcpt_tos and self._terms.get(envelope, terms) != terms:
            return (f"452 4.5.3 <{address[:200]}> takes email on terms of its own: send it "
                    "in a message of its own")
        self._terms.setdefault(envelope, terms)
        envelope.rcpt_tos.append(address)
        return "250 2.1.5 OK"

    async def handle_DATA(self, server: SMTP, session: Session, envelope: Envelope) -> str:
        intake = self._intake()
        if intake is None:
            return "451 4.3.0 vaultmail is starting: try again later"
        raw = envelope.original_content or b""
        try:  # (up to SMTP_MAX_BYTES of a stranger's: read beside the loop, which serves
            # every office, as its authentication is)
            message = await self._beside(parse_inbound, raw)
        except BadMessage as exc:
            return f"550 5.6.0 {exc}"
        refusal = self.refuse_parts(message)
        if refusal is not None:
            return refusal
        peer = session.peer[0] if isinstance(session.peer, tuple) else ""
        if not self.lookups.admit(address_key(str(peer))):
            return (f"451 4.7.1 too many messages from your address: at most "
                    f"{self.lookups.limit} a minute are authenticated; try again later")
        verdicts = await self._beside(
            self._authenticate, raw, str(peer), session.host_name or "",
            envelope.mail_from or "", message.sender.rpartition("@")[2])
        if not verdicts.aligned and not self.peers.admit(address_key(str(peer))):
            return (f"451 4.7.1 too many messages from your address whose From is not "
                    f"authenticated: at most {self.rate.per_minute} a minute; try again later")
        if unlearned(verdicts):  # (a forged From's fail must not pass as a lookup failed)
            return (f"451 4.7.0 the DMARC record of {verdicts.from_domain} cannot be looked "
                    "up now, and nothing else proves its From (no aligned SPF or DKIM pass): "
                    "try again later")
        unsigned = unsigned_refusal(message, verdicts)
        if unsigned is not None:
            return unsigned
        # its To, Cc and thread ids that signature leaves out: delivered, not acted on
        message = message.signed_only(verdicts.unsigned(message.headers))
        refs: list[str] = []
        # each recipient RCPT took that cannot take it now, with its answer were it alone:
        # the config changed, its vault was closed, or its policy refuses (terms changed)
        refused: list[tuple[str, str]] = []
        bounce = await self._beside(parse_dsn, raw) if message.report else None
        try:
            for rcpt in dict.fromkeys(a.lower() for a in envelope.rcpt_tos):
                box = await intake.mailbox(rcpt)
                if box is None:  # the config changed since RCPT
                    refused.append((rcpt, f"5.1.1 <{rcpt[:200]}>: no such mailbox here any "
                                          "more"))
                    continue
                if bounce is not None and bounce.failed:
                    said = await intake.bounced(box, bounce)
                    if said is not None:
                        refs.append(said)
                        continue
                decision = intake.decide(box, message, verdicts)
                if decision.action == "refuse":
                    refused.append((rcpt, f"5.7.1 <{rcpt[:200]}>: {decision.reason}"))
                    continue
                # an authenticated sender (an aligned SPF or DKIM pass) has a count of its
                # own: a From anyone can write never spends the real sender's
                who = sender_key(message, verdicts)
                # each copy is charged once: sent again after a 451 (another copy over its
                # rate, or a recipient lost since RCPT), the copies counted before (delivered
                # once, bot.email.intake) cost nothing, and are not refused again for them
                copy = self.rate.copy(who, message)
                if not await self.rate.admit(intake.services.store, box.office.org,
                                             box.agent.slug, who, message=copy):
                    return (f"451 4.7.1 too many messages from {message.sender} to "
                            f"{box.address}: at most {self.rate.per_minute} a minute; try "
                            "again later")
                # and its domain one (whose owner writes as many local parts as it likes)
                domain = organisational(verdicts.from_domain) if verdicts.aligned else ""
                if domain and not await self.rate.admit_domain(
                        intake.services.store, box.office.org, box.agent.slug, domain,
                        message=copy):
                    return (f"451 4.7.1 too many messages from senders at {domain} to "
                            f"{box.address}: at most {self.rate.domain_per_minute} a minute "
                            "from one domain; try again later")
                try:
                    record = await intake.receive(box, message, verdicts)
                except Undeliverable:  # the agent's vault is gone or archived: the office
                    # is told by its internal bounce; a stranger learns no repository's name
                    intake.found_closed(box)
                    refused.append((rcpt, f"5.7.1 <{rcpt[:200]}>: this mailbox takes no "
                                          "mail now"))
                    continue
                # the mail's id, not its issue: a stranger learns no private repository's
                # name, nor how much mail its agent gets (the office finds it by the id)
                refs.append(record.mail_id)
        except Exception as exc:
            log.warning("email not delivered", extra={"error": repr(exc),
                                                      "message_id": message.message_id})
            return "451 4.3.0 not delivered now: try again later"
        if refused and not refs:  # no recipient takes it: refused for good, each saying why
            return f"550 {refused[0][1][:5]} " + "; ".join(why[6:] for _, why in refused)
        if refused:
            # The answer to DATA is every recipient's (RFC 5321): a 250 counts the refused
            # copies delivered, a 550 the delivered ones failed. Not taken now: the copies
            # delivered are kept (the message sent again is delivered to them once), and
            # the retry's RCPTs refuse the others alone, each with why.
            gone = ", ".join(f"<{rcpt[:200]}>" for rcpt, _ in refused)
            return (f"451 4.3.0 {gone} can no longer take it: send it again, and "
                    f"{'they are' if len(refused) > 1 else 'it is'} refused alone")
        return f"250 2.0.0 delivered as {', '.join(refs)}"


def unsigned_refusal(message: Inbound, verdicts: Verdicts) -> str | None:
    """The 550 for a message whose From only DKIM proves, with its Subject or Message-ID or
    part of its body that the signature does not cover, or with no Message-ID; else None.
    Anyone holding a message the domain signed can add those and send it on, and it still
    passes: a subject of their choosing, text after an l= (RFC 6376 8.2, 8.15), a header
    that makes it new mail again. Refused, not read without them: every large signer signs
    them, and the sender learns what to sign. (Its To, Cc and thread ids unsigned are not
    read instead: `Inbound.signed_only`.)"""
    unsigned = [name for name in verdicts.unsigned(message.headers)
                if name in SIGNED_OR_REFUSED]
    domains = ", ".join(verdicts.dkim_domains)
    if unsigned:
        names = " and ".join(unsigned)
        return (f"550 5.7.1 its {names} header{'s are' if len(unsigned) > 1 else ' is'} not "
                f"covered by its DKIM signature (d={domains}), the only proof of its sender: "
                f"sign the {names} header{'s' if len(unsigned) > 1 else ''}, or send it from "
                f"a server the SPF record of {verdicts.from_domain} lists")
    if verdicts.signed is not None and "Message-ID" not in message.headers:
        # (known once by its Message-ID: without one, by a digest of its bytes, which
        # anyone holding it changes with a header of their own: new mail at each replay)
        return (f"550 5.7.1 it has no Message-ID, and its DKIM signature (d={domains}) is "
                "the only proof of its sender: without one, whoever holds the message could "
                "deliver it again and again as new mail: give it a Message-ID (signed), or "
                f"send it from a server the SPF record of {verdicts.from_domain} lists")
    if not verdicts.body_signed:
        return (f"550 5.7.1 its DKIM signature (d={domains}), the only proof of its sender, "
                "covers only part of its body (l=): sign the whole body, or send it from a "
                f"server the SPF record of {verdicts.from_domain} lists")
    return None


class ListenError(RuntimeError):
    """The SMTP port cannot be listened on; the message names it and what to do."""


def bind(host: str, port: int) -> socket.socket:
    """A listening socket on host:port (0: any free port), bound before anything else starts,
    so a port in use stops the start at once and leaves nothing running."""
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET,
                         socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise ListenError(f"cannot listen on {host}:{port} for SMTP: {exc.strerror}: stop what "
                          "uses that port or choose another (--smtp-port / VAULTMAIL_SMTP_PORT)"
                          ) from None
    sock.listen(128)
    sock.setblocking(False)
    return sock


class SmtpServer:
    """The listener on a bound socket (`bind`); `port` is the port it listens on."""

    def __init__(self, handler: SmtpHandler, sock: socket.socket, *, max_bytes: int,
                 hostname: str = "vaultmail", tls_context: ssl.SSLContext | None = None) -> None:
        self.handler, self.sock = handler, sock
        self.tls_context = tls_context  # STARTTLS offered (not required) when set
        self.max_bytes, self.hostname = max_bytes, hostname
        self._server: asyncio.base_events.Server | None = None
        self.sessions = Sessions()

    @property
    def port(self) -> int:
        return int(self.sock.getsockname()[1])

    def _protocol(self) -> SMTP:
        return LimitedSMTP(self.handler, data_size_limit=self.max_bytes, enable_SMTPUTF8=True,
                           hostname=self.hostname, ident="vaultmail ESMTP",
                           tls_context=self.tls_context, require_starttls=False,
                           loop=asyncio.get_running_loop(), sessions=self.sessions)

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        factory: Callable[[], SMTP] = self._protocol
        self._server = await loop.create_server(factory, sock=self.sock)

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
            self._server = None
        else:
            self.sock.close()
        self.handler.close()
