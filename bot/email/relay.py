"""The outbound relay (`SMTP_URL`, a host setting): where replies go out, and how.

`smtp://[user:password@]host[:port]` (plain; STARTTLS when the relay offers it),
`smtp+starttls://...` (STARTTLS required), `smtps://...` (implicit TLS, port 465 by default).
A send is answered `sent`, `deferred` (a 4xx, or the relay unreachable: try again later) or
`rejected` (a 5xx: it will never go).
"""

from __future__ import annotations

import asyncio
import smtplib
import ssl
from dataclasses import dataclass
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
    state: Literal["sent", "deferred", "rejected"]
    detail: str


def _send(relay: Relay, envelope_from: str, recipients: list[str], data: bytes) -> Sent:
    context = ssl.create_default_context()
    try:
        client: smtplib.SMTP
        if relay.tls == "implicit":
            client = smtplib.SMTP_SSL(relay.host, relay.port, timeout=relay.timeout,
                                      context=context)
        else:
            client = smtplib.SMTP(relay.host, relay.port, timeout=relay.timeout)
        with client:
            client.ehlo()
            if relay.tls == "starttls" or (relay.tls == "opportunistic"
                                           and client.has_extn("starttls")):
                client.starttls(context=context)
                client.ehlo()
            if relay.username:
                client.login(relay.username, relay.password)
            refused = client.sendmail(envelope_from, recipients, data)
    except smtplib.SMTPRecipientsRefused as exc:
        return _answer(exc.recipients)
    except smtplib.SMTPResponseException as exc:
        text = exc.smtp_error.decode("utf-8", "replace") if isinstance(
            exc.smtp_error, bytes) else str(exc.smtp_error)
        state: Literal["deferred", "rejected"] = "rejected" if exc.smtp_code >= 500 \
            else "deferred"
        return Sent(state, f"{exc.smtp_code} {text}")
    except (OSError, smtplib.SMTPException) as exc:
        return Sent("deferred", f"relay {relay.host}:{relay.port} unreachable: {exc!r}")
    if refused:
        return _answer(refused)
    return Sent("sent", f"accepted by {relay.host}:{relay.port}")


def _answer(refused: dict[str, tuple[int, bytes]]) -> Sent:
    codes = [code for code, _ in refused.values()]
    detail = "; ".join(f"{rcpt}: {code} {msg.decode('utf-8', 'replace')}"
                       for rcpt, (code, msg) in refused.items())
    return Sent("rejected" if all(c >= 500 for c in codes) else "deferred", detail)


async def send(relay: Relay, envelope_from: str, recipients: list[str], data: bytes) -> Sent:
    """Hand the message to the relay (smtplib, on a worker thread)."""
    return await asyncio.to_thread(_send, relay, envelope_from, recipients, data)
