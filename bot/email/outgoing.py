"""A reply going out by email: the message, its Message-ID, its threading headers and its DKIM
signature. Pure, no I/O (the key is given)."""

from __future__ import annotations

import hashlib
import hmac
import re
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from email import message_from_bytes, policy
from email.message import EmailMessage
from email.utils import format_datetime

import dkim

from bot.email.addresses import BadAddress, display, normalise
from bot.email.keys import SELECTOR
from bot.mail.header import clean_subject

MAIL_KEY = "mail"  # the digest's key for mail an agent sent (a reply's is the reply's key)
MAX_REFERENCES = 20
HOPS_HEADER = "X-Vaultmail-Hops"  # the loop guard's count, carried between email and mail
SIGNED_HEADERS = [b"from", b"to", b"cc", b"subject", b"date", b"message-id", b"in-reply-to",
                  b"references", b"auto-submitted", b"x-vaultmail-hops", b"mime-version",
                  b"content-type"]
_OWN_ID = re.compile(r"^<vm\.([0-9a-f-]{36})\.([0-9a-f]{16})@([^<>\s]+)>$")
# a Message-ID as RFC 5322 writes one (`<dot-atom@dot-atom>`, ASCII); `plain_id` also refuses
# an `=?`, which the email package would decode (see `header_text`)
_ATEXT = r"[A-Za-z0-9!#$%&'*+/=?^_`{|}~.-]"
_PLAIN_ID = re.compile(rf"<{_ATEXT}{{1,200}}@{_ATEXT}{{1,200}}>")


class Unsendable(ValueError):
    """A message the app will not write (the message says why): a permanent failure, never a
    retry (bot.email.outbox bounces it at once)."""


def reply_message_id(mail_id: str, key: str, domain: str, secret: bytes) -> str:
    """The Message-ID of the reply `key` to mail `mail_id`: the same on every try (what makes
    sending it once checkable), and naming the mail, so an answer to it finds its thread. The
    digest is keyed with the office's `secret` (`keys.message_id_secret`): a mail id is no
    secret, and an id anyone could compute from it would thread anyone's message into it."""
    digest = hmac.new(secret, f"{mail_id}\n{key}".encode(), hashlib.sha256).hexdigest()[:16]
    return f"<vm.{mail_id}.{digest}@{domain}>"


def mail_message_id(mail_id: str, domain: str, secret: bytes) -> str:
    """The Message-ID of mail an agent sent to an address (`mail_send`): the same on every
    try, and naming the mail, so an answer to it finds its thread."""
    return reply_message_id(mail_id, MAIL_KEY, domain, secret)


def mail_of_message_id(message_id: str, domain: str) -> str | None:
    """The mail id in one of the app's own Message-IDs at `domain`, else None. Its digest is
    not checked here (`written_by_app` does, knowing the mail's replies)."""
    m = _OWN_ID.match(message_id.strip())
    return m.group(1) if m is not None and m.group(3).lower() == domain.lower() else None


def written_by_app(message_id: str, mail_id: str, keys: Iterable[str], domain: str,
                   secret: bytes) -> bool:
    """Whether `message_id` is the one the app wrote for mail `mail_id` (`mail_send`) or for
    one of its replies `keys`, compared in constant time."""
    given = message_id.strip().encode()
    return any(hmac.compare_digest(given, reply_message_id(mail_id, key, domain, secret).encode())
               for key in (MAIL_KEY, *keys))


def reply_subject(subject: str) -> str:
    subject = header_text(subject)
    return subject if re.match(r"(?i)^re:", subject) else f"Re: {subject}"


def header_text(value: str) -> str:
    """A text header value (a subject, a display name) that is written on one line and reads
    back as itself: control characters, line separators and runs of spaces become one space
    (`clean_subject`), and no `=?` is left to open an RFC 2047 encoded-word. Setting a header
    makes the email package decode encoded-words in the value, and before Python 3.11.10
    (CVE-2024-6923) it writes a decoded line break raw: a stranger's subject became header
    lines and a body."""
    return " ".join(clean_subject(value).split()).replace("=?", "= ?")


def plain_id(value: str) -> bool:
    """Whether `value` is a Message-ID the app writes in a header (`<left@right>`, ASCII, no
    `=?`); a stranger's other ids still thread inbound mail but are never written."""
    return _PLAIN_ID.fullmatch(value) is not None and "=?" not in value


def _writable(address: str) -> str:
    """`address`, when it is one the app takes (`normalise`: ASCII, no `=?`), else Unsendable."""
    try:
        if normalise(address) == address.lower():
            return address
    except BadAddress:
        pass
    raise Unsendable(f"{address[:254]!r} is not an address the app can write in a message")


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
    """The message; every header value made of checked parts (addresses the app takes, text
    through `header_text`, plain Message-IDs: an answered message's other ids are left out),
    so no subject, name or id can add a header line. Unsendable when a part fails its check."""
    if not plain_id(out.message_id):
        raise Unsendable(f"{out.message_id[:254]!r} is not a Message-ID the app writes")
    msg = EmailMessage()
    try:
        msg["From"] = display(_writable(out.sender), header_text(out.sender_name))
        msg["To"] = ", ".join(_writable(a) for a in out.to)
        if out.cc:
            msg["Cc"] = ", ".join(_writable(a) for a in out.cc)
        msg["Subject"] = header_text(out.subject)
        msg["Date"] = format_datetime(out.sent)
        msg["Message-ID"] = out.message_id
        if out.in_reply_to and plain_id(out.in_reply_to):
            msg["In-Reply-To"] = out.in_reply_to
        if references := [r for r in out.references if plain_id(r)][-MAX_REFERENCES:]:
            msg["References"] = " ".join(references)
    except ValueError as exc:  # the email package refused a value: nothing to retry
        raise Unsendable(f"the message cannot be written: {exc}") from exc
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


# headers folded only past RFC 5322's 998: at the email package's usual 78 it writes a longer
# In-Reply-To or References (the app's ids with a long domain) as RFC 2047 encoded-words, which
# no mail client reads as ids (RFC 5322 3.6.4); `plain_id` keeps each id well under 998
_WIRE = policy.SMTP.clone(max_line_length=998)


def to_wire(msg: EmailMessage) -> bytes:
    """The message's bytes as SMTP carries them (CRLF). Read back before they go: Unsendable
    unless they hold the headers `msg` has, in order, none of them decoding to a line break
    (the last check that no value became a header line or a body of its own)."""
    data = msg.as_bytes(policy=_WIRE)
    back = message_from_bytes(data, policy=policy.default)
    names = [k.lower() for k in msg]
    if [k.lower() for k in back] != names or any(
            re.search(r"[\r\n]", str(v)) for v in back.values()):
        raise Unsendable(f"the message written has other headers than its own {names}")
    return data
