"""The outbound relay (`SMTP_URL`, a host setting): where replies go out, and how.

`smtp://[user:password@]host[:port]` (plain; STARTTLS when the relay offers it),
`smtp+starttls://...` (STARTTLS required), `smtps://...` (implicit TLS, port 465 by default).
A send is answered per recipient: accepted, deferred (a 4xx, or the relay unreachable: try
again later) or rejected (a 5xx: it will never go). A relay may accept some recipients of one
message and refuse others at RCPT (smtplib's `sendmail` then sends to the ones it accepted and
returns the others); an answer to the whole message (MAIL FROM, DATA, the connection) is every
recipient's.
"""

from __future__ import annotations

import asyncio
import smtplib
import socket
import ssl
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field, replace
from typing import Literal
from urllib.parse import unquote, urlsplit


class RelayError(ValueError):
    """An SMTP_URL that cannot be used; the message says why."""


@dataclass(frozen=True)
class Relay:
    host: str
    port: int
    tls: Literal["none", "starttls", "opportunistic", "implicit"]
    username: str = ""
    password: str = ""
    timeout: float = 30.0

    @classmethod
    def parse(cls, url: str) -> Relay:
        parts = urlsplit(url)
        schemes = {"smtp": ("opportunistic", 25), "smtp+starttls": ("starttls", 587),
                   "smtps": ("implicit", 465)}
        if parts.scheme not in schemes or not parts.hostname:
            raise RelayError(f"SMTP_URL={url!r}: should be smtp://[user:password@]host[:port], "
                             "smtp+starttls://... or smtps://...")
        tls, default_port = schemes[parts.scheme]
        try:
            port = parts.port or default_port
        except ValueError as exc:
            raise RelayError(f"SMTP_URL={url!r}: the port is not a number") from exc
        return cls(host=parts.hostname, port=port, tls=tls,  # type: ignore[arg-type]
                   username=unquote(parts.username or ""),
                   password=unquote(parts.password or ""))


@dataclass(frozen=True)
class Sent:
    """The relay's answer, per recipient: `accepted` in the order sent; `deferred` and
    `rejected` map a recipient to what the relay said (`451 4.2.2 ...`)."""

    accepted: tuple[str, ...] = ()
    deferred: dict[str, str] = field(default_factory=dict)
    rejected: dict[str, str] = field(default_factory=dict)
    # why the relay could not be reached, in full (its address, the error): for the log only;
    # `deferred` says it as vault readers may read it (`_unreachable`)
    failure: str | None = None

    @property
    def state(self) -> Literal["sent", "partial", "deferred", "rejected"]:
        """The whole message's: `partial` when the relay took some recipients and not others."""
        if not self.deferred and not self.rejected:
            return "sent"
        if self.accepted:
            return "partial"
        return "deferred" if self.deferred else "rejected"


def _all(recipients: list[str], state: Literal["deferred", "rejected"], why: str) -> Sent:
    each = dict.fromkeys(recipients, why)
    return Sent(deferred=each) if state == "deferred" else Sent(rejected=each)


def _connect(relay: Relay) -> smtplib.SMTP:
    """A session with the relay, greeted (EHLO, TLS, login): ready for a message's envelope."""
    context = ssl.create_default_context()
    client: smtplib.SMTP
    if relay.tls == "implicit":
        client = smtplib.SMTP_SSL(relay.host, relay.port, timeout=relay.timeout,
                                  context=context)
    else:
        client = smtplib.SMTP(relay.host, relay.port, timeout=relay.timeout)
    try:
        client.ehlo()
        if relay.tls == "starttls" or (relay.tls == "opportunistic"
                                       and client.has_extn("starttls")):
            client.starttls(context=context)
            client.ehlo()
        if relay.username:
            client.login(relay.username, relay.password)
    except BaseException:
        client.close()
        raise
    return client


def _quit(client: smtplib.SMTP) -> None:
    """QUIT, then closed. Its answer (or a relay gone already) changes nothing: the message's
    fate was DATA's answer, and taking a QUIT's 4xx for it would send the message again."""
    try:
        client.quit()
    except (OSError, smtplib.SMTPException):
        client.close()


async def send(relay: Relay, envelope_from: str, recipients: list[str], data: bytes, *,
               fence: Callable[[], Awaitable[None]] | None = None) -> Sent:
    """Hand the message to the relay (smtplib, on worker threads). `fence` is awaited once
    the relay has greeted the app, right before the envelope (MAIL FROM): a try that may no
    longer send (`idempotency.check_claim`) raises there, and the relay gets nothing. It
    comes after the greeting, which may be slow (a relay's greet pause, TLS): longer than a
    claim holds without a heartbeat."""
    try:
        client = await asyncio.to_thread(_connect, relay)
        try:
            if fence is not None:
                await fence()
            refused = await asyncio.to_thread(client.sendmail, envelope_from, recipients,
                                              data)
        finally:
            await asyncio.to_thread(_quit, client)
    except smtplib.SMTPRecipientsRefused as exc:  # every recipient refused at RCPT
        return _answer(recipients, exc.recipients)
    except smtplib.SMTPResponseException as exc:  # MAIL FROM or DATA: the whole message
        text = exc.smtp_error.decode("utf-8", "replace") if isinstance(
            exc.smtp_error, bytes) else str(exc.smtp_error)
        return _all(recipients, "rejected" if exc.smtp_code >= 500 else "deferred",
                    f"{exc.smtp_code} {text}")
    except (OSError, smtplib.SMTPException) as exc:
        return replace(_all(recipients, "deferred",
                            f"the relay could not be reached: {_unreachable(exc)}"),
                       failure=f"relay {relay.host}:{relay.port} unreachable: {exc!r}")
    return _answer(recipients, refused)


def _unreachable(exc: OSError) -> str:
    """What kind of failure reaching the relay was, as the mail's readers are told it: not
    the relay's address or the error's own text (the log has them)."""
    if isinstance(exc, socket.gaierror):
        return "its name did not resolve"
    if isinstance(exc, TimeoutError):
        return "it did not answer in time"
    if isinstance(exc, ConnectionRefusedError):
        return "it refused the connection"
    if isinstance(exc, ssl.SSLError):
        return "TLS with it failed"
    if isinstance(exc, smtplib.SMTPServerDisconnected):
        return "it closed the connection"
    return "the connection failed"


def _answer(recipients: list[str], refused: dict[str, tuple[int, bytes]]) -> Sent:
    """Each recipient's fate: refused at RCPT with a 5xx (rejected) or otherwise (deferred),
    else accepted."""
    said = {rcpt: (code, f"{code} {msg.decode('utf-8', 'replace')}")
            for rcpt, (code, msg) in refused.items()}
    return Sent(accepted=tuple(r for r in recipients if r not in said),
                deferred={r: why for r, (code, why) in said.items() if code < 500},
                rejected={r: why for r, (code, why) in said.items() if code >= 500})
