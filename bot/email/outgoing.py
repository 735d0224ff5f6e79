"""A reply going out by email: the message, its Message-ID, its threading headers and its DKIM
signature. Pure, no I/O (the key is given)."""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from datetime import datetime
from email import policy
from email.message import EmailMessage
from email.utils import format_datetime

import dkim

from bot.email.addresses import display

SELECTOR = "vaultmail"
MAX_REFERENCES = 20
HOPS_HEADER = "X-Vaultmail-Hops"  # the loop guard's count, carried between email and mail
SIGNED_HEADERS = [b"from", b"to", b"cc", b"subject", b"date", b"message-id", b"in-reply-to",
                  b"references", b"auto-submitted", b"x-vaultmail-hops", b"mime-version",
                  b"content-type"]
_OWN_ID = re.compile(r"^<vm\.([0-9a-f-]{36})\.([0-9a-f]{16})@([^<>\s]+)>$")


def reply_message_id(mail_id: str, key: str, domain: str) -> str:
    """The Message-ID of the reply `key` to mail `mail_id`: the same on every try (what makes
    sending it once checkable), and naming the mail, so an answer to it finds its thread."""
    digest = hashlib.sha256(f"{mail_id}\n{key}".encode()).hexdigest()[:16]
    return f"<vm.{mail_id}.{digest}@{domain}>"


def mail_message_id(mail_id: str, domain: str) -> str:
    """The Message-ID of mail an agent sent to an address (`mail_send`): the same on every
    try, and naming the mail, so an answer to it finds its thread."""
    return reply_message_id(mail_id, "mail", domain)


def mail_of_message_id(message_id: str, domain: str) -> str | None:
    """The mail id in one of the app's own Message-IDs at `domain`, else None."""
    m = _OWN_ID.match(message_id.strip())
    return m.group(1) if m is not None and m.group(3).lower() == domain.lower() else None


def reply_subject(subject: str) -> str:
    subject = re.sub(r"[\x00-\x1f\x7f]+", " ", subject).strip()
    return subject if re.match(r"(?i)^re:", subject) else f"Re: {subject}"


@dataclass(frozen=True)
class Outgoing:
    sender: str  # the agent's address
    sender_name: str
    to: tuple[str, ...]
    cc: tuple[str, ...]
    subject: str
    message_id: str
    in_reply_to: str | None
    references: tuple[str, ...]
    text: str
    sent: datetime
    automatic: bool = True  # an agent's answer: Auto-Submitted: auto-replied (RFC 3834)
    hops: int | None = None  # the loop guard's count (bot.mail.mailer), as X-Vaultmail-Hops

    @property
    def recipients(self) -> list[str]:
        return list(dict.fromkeys([*self.to, *self.cc]))


def compose(out: Outgoing) -> EmailMessage:
    """The message; every header value built by the email package from checked parts, so no
    subject or name can add a header line."""
    msg = EmailMessage()
    msg["From"] = display(out.sender, out.sender_name)
    msg["To"] = ", ".join(out.to)
    if out.cc:
        msg["Cc"] = ", ".join(out.cc)
    msg["Subject"] = out.subject
    msg["Date"] = format_datetime(out.sent)
    msg["Message-ID"] = out.message_id
    if out.in_reply_to:
        msg["In-Reply-To"] = out.in_reply_to
    if out.references:
        msg["References"] = " ".join(out.references[-MAX_REFERENCES:])
    if out.automatic:
        msg["Auto-Submitted"] = "auto-replied"
    if out.hops is not None:
        msg[HOPS_HEADER] = str(out.hops)
    msg.set_content(out.text)
    return msg


def sign(message: bytes, *, domain: str, private_pem: bytes, selector: str = SELECTOR) -> bytes:
    """`message` (CRLF line endings) with a DKIM-Signature on top (rsa-sha256, relaxed/relaxed)."""
    signature = dkim.sign(message, selector.encode(), domain.encode(), private_pem,
                          canonicalize=(b"relaxed", b"relaxed"),
                          include_headers=[h for h in SIGNED_HEADERS
                                           if re.search(rb"(?im)^" + h + rb":", message)])
    return bytes(signature) + message


_WIRE = policy.SMTP.clone(max_line_length=998)  # headers folded only past RFC 5322's limit


def to_wire(msg: EmailMessage) -> bytes:
    """The message's bytes as SMTP carries them (CRLF)."""
    return msg.as_bytes(policy=_WIRE)
