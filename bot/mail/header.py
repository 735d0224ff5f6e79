"""The signed mail header at the top of a mail's issue body (DESIGN §3.4). Pure, no I/O.

An issue body written by the office looks like this::

    <!-- vaultmail:header v1 {"body_sha256":"…","from_principal":"human:marco@acme.com",…} -->

    | From | To | Sent |
    | --- | --- | --- |
    | `human:marco@acme.com` | `agent:scout` | 2025-01-31 09:00 UTC |

    ---

    the body, exactly as sent

The hidden comment carries every header field as one line of JSON (``<`` and ``>`` escaped, so
no subject can close the comment). The table is what people read; it is re-rendered from the
hidden header when verifying, and a table that disagrees with it is tampering. The body is
everything after the first line that is exactly ``---`` following the header.

Only the very first thing in the issue body can be the header: a header-looking comment
anywhere else is part of the body, i.e. data.

What is signed (``canonical_bytes``): the ASCII line ``vaultmail-header-v1`` and a newline,
followed by the JSON object of the twelve signed fields -- version, mail_id, from_principal,
to_principal, sent, vault, subject, body_sha256, hops, in_reply_to (null when absent),
thread_id, key_id -- with sorted keys, no whitespace, UTF-8, non-ASCII unescaped (RFC 8785
form for these fields). The signature (Ed25519, base64url) covers those bytes.

Normal forms, so forges' rewriting does not break signatures: the body is hashed with LF line
endings, no leading blank lines and no trailing whitespace (``normalize_body``); the subject is
the issue title without surrounding whitespace; the vault is compared and signed lowercase.
"""

from __future__ import annotations

import hashlib
import json
import re
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any, Final, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from bot.mail.signing import Signer, Verifier

HEADER_VERSION: Final = 1
SIGNING_CONTEXT = b"vaultmail-header-v1\n"
HEADER_PREFIX = "<!-- vaultmail:header v"
_MAX_HEADER_CHARS = 16_384

SIGNED_FIELDS: tuple[str, ...] = (
    "version",
    "mail_id",
    "from_principal",
    "to_principal",
    "sent",
    "vault",
    "subject",
    "body_sha256",
    "hops",
    "in_reply_to",
    "thread_id",
    "key_id",
)

_ID = r"[A-Za-z0-9][A-Za-z0-9._:-]{0,127}"
_REPO = r"[A-Za-z0-9_.-]+/[A-Za-z0-9_.-]+"
_PRINCIPAL_RE = re.compile(
    r"^(human:[^\s@<>`|\\]+@[^\s@<>`|\\]+|agent:[a-z0-9][a-z0-9-]{0,38}|office)$"
)
_ID_RE = re.compile(rf"^{_ID}$")
_REPO_RE = re.compile(rf"^{_REPO}$")
_ISSUE_REF_RE = re.compile(rf"^{_REPO}#[1-9][0-9]*$")
_SENT_RE = re.compile(r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}Z$")
_SEPARATOR_RE = re.compile(r"^---[ \t]*$", re.MULTILINE)
_CONTROL_RE = re.compile(r"[\x00-\x1f\x7f]")


# -- normal forms ------------------------------------------------------------------------------


def normalize_newlines(text: str) -> str:
    return text.replace("\r\n", "\n").replace("\r", "\n")


def normalize_body(body: str) -> str:
    """The body as signed: LF line endings, no leading blank lines, no trailing whitespace."""
    return normalize_newlines(body).lstrip("\n").rstrip()


def normalize_subject(subject: str) -> str:
    return subject.strip()


def body_sha256(body: str) -> str:
    """Hex SHA-256 of the body's normal form, UTF-8."""
    return hashlib.sha256(normalize_body(body).encode("utf-8")).hexdigest()


def format_sent(ts: datetime) -> str:
    """ISO 8601 UTC with a Z, to the second: 2025-01-31T09:00:00Z."""
    if ts.tzinfo is None:
        ts = ts.replace(tzinfo=UTC)
    return ts.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def new_mail_id() -> str:
    return str(uuid.uuid4())


# -- the header --------------------------------------------------------------------------------


class MailHeader(BaseModel):
    """A mail's header. Field names are the JSON keys in the hidden comment."""

    model_config = ConfigDict(frozen=True, extra="forbid", strict=True)

    version: Literal[1] = HEADER_VERSION
    mail_id: str = Field(pattern=_ID_RE.pattern)
    from_principal: str
    to_principal: str
    sent: str
    vault: str
    subject: str = Field(min_length=1, max_length=1024)
    body_sha256: str = Field(pattern=r"^[0-9a-f]{64}$")
    hops: int = Field(default=0, ge=0)
    in_reply_to: str | None = None
    thread_id: str = Field(pattern=_ID_RE.pattern)
    key_id: str = Field(pattern=r"^[A-Za-z0-9._-]{1,64}$")
    signature: str = Field(default="", pattern=r"^[A-Za-z0-9_-]*$")

    @field_validator("from_principal", "to_principal")
    @classmethod
    def _principal(cls, v: str) -> str:
        if not _PRINCIPAL_RE.match(v):
            raise ValueError("must be human:<email>, agent:<slug> or office")
        return v

    @field_validator("sent")
    @classmethod
    def _sent(cls, v: str) -> str:
        if not _SENT_RE.match(v):
            raise ValueError("must be ISO 8601 UTC to the second, like 2025-01-31T09:00:00Z")
        datetime.strptime(v, "%Y-%m-%dT%H:%M:%SZ")  # a real date
        return v

    @field_validator("vault")
    @classmethod
    def _vault(cls, v: str) -> str:
        if not _REPO_RE.match(v):
            raise ValueError("must be owner/repo")
        return v.lower()

    @field_validator("subject")
    @classmethod
    def _subject(cls, v: str) -> str:
        v = normalize_subject(v)
        if not v:
            raise ValueError("must not be empty")
        if _CONTROL_RE.search(v):
            raise ValueError("must be one line without control characters")
        return v

    @field_validator("in_reply_to")
    @classmethod
    def _in_reply_to(cls, v: str | None) -> str | None:
        if v is not None and not (_ISSUE_REF_RE.match(v) or _ID_RE.match(v)):
            raise ValueError("must be owner/repo#N or a mail id")
        return v

    @property
    def sent_at(self) -> datetime:
        return datetime.strptime(self.sent, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC)

    def signed_fields(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in SIGNED_FIELDS}

    def to_json(self) -> str:
        """Compact JSON of every field (the hidden comment's payload, unescaped)."""
        return json.dumps(self.model_dump(), sort_keys=True, separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str) -> MailHeader:
        """Parse and validate; raises ValueError (pydantic's ValidationError) when invalid."""
        return cls.model_validate(json.loads(text))


def canonical_bytes(header: MailHeader) -> bytes:
    """The exact bytes signed: see the module docstring."""
    body = json.dumps(
        header.signed_fields(), sort_keys=True, separators=(",", ":"), ensure_ascii=False
    )
    return SIGNING_CONTEXT + body.encode("utf-8")


def sign_header(
    *,
    keyring: Signer,
    from_principal: str,
    to_principal: str,
    vault: str,
    subject: str,
    body: str,
    mail_id: str | None = None,
    sent: datetime | str | None = None,
    hops: int = 0,
    in_reply_to: str | None = None,
    thread_id: str | None = None,
) -> MailHeader:
    """Build and sign a header with the keyring's active key. ``mail_id`` defaults to a new
    UUID, ``sent`` to now, ``thread_id`` to the mail id (a fresh thread). Invalid fields raise
    pydantic's ValidationError (a ValueError)."""
    mail_id = mail_id or new_mail_id()
    if sent is None:
        sent = datetime.now(UTC)
    kid = keyring.active_kid
    unsigned = MailHeader(
        mail_id=mail_id,
        from_principal=from_principal,
        to_principal=to_principal,
        sent=format_sent(sent) if isinstance(sent, datetime) else sent,
        vault=vault,
        subject=subject,
        body_sha256=body_sha256(body),
        hops=hops,
        in_reply_to=in_reply_to,
        thread_id=thread_id or mail_id,
        key_id=kid,
    )
    used_kid, signature = keyring.sign(canonical_bytes(unsigned), kid=kid)
    assert used_kid == kid
    return unsigned.model_copy(update={"signature": signature})


def verify_signature(header: MailHeader, keys: Verifier) -> bool:
    return bool(header.signature) and keys.verify(
        header.key_id, canonical_bytes(header), header.signature
    )


# -- rendering ---------------------------------------------------------------------------------


def _comment(header: MailHeader) -> str:
    payload = header.to_json().replace("<", "\\u003c").replace(">", "\\u003e")
    return f"{HEADER_PREFIX}{header.version} {payload} -->"


def _reply_ref(ref: str) -> str:
    return ref if _ISSUE_REF_RE.match(ref) else f"`{ref}`"  # owner/repo#N autolinks


def render_readable(header: MailHeader) -> str:
    """The table people read: From, To, Sent, and In reply to when there is one."""
    cols = ["From", "To", "Sent"]
    sent = header.sent_at.strftime("%Y-%m-%d %H:%M UTC")
    vals = [f"`{header.from_principal}`", f"`{header.to_principal}`", sent]
    if header.in_reply_to is not None:
        cols.append("In reply to")
        vals.append(_reply_ref(header.in_reply_to))
    return "\n".join(
        [
            "| " + " | ".join(cols) + " |",
            "|" + " --- |" * len(cols),
            "| " + " | ".join(vals) + " |",
        ]
    )


def render_mail_body(header: MailHeader, body: str) -> str:
    """The full issue body: hidden header, readable table, separator, body (normal form).
    Raises ValueError if ``body`` is not the body the header was signed over."""
    body = normalize_body(body)
    if body_sha256(body) != header.body_sha256:
        raise ValueError("this body is not the one the header was signed over")
    return f"{_comment(header)}\n\n{render_readable(header)}\n\n---\n\n{body}\n"


# -- parsing -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class ParsedBody:
    """An issue body taken apart. ``has_header`` is True when the body begins with a vaultmail
    header comment, even an unreadable one (then ``header`` is None and ``error`` says why)."""

    has_header: bool
    header: MailHeader | None
    error: str | None
    readable: str | None  # the text between the comment and the separator
    has_separator: bool
    body: str  # the mail body in normal form (the whole issue body when there is no header)


def _looks_like_header(text: str) -> bool:
    return re.match(r"<!--\s*vaultmail:header\b", text) is not None


def split_mail_body(issue_body: str | None) -> ParsedBody:
    text = normalize_newlines(issue_body or "").lstrip("\ufeff")
    start = text.lstrip()
    if not _looks_like_header(start):
        return ParsedBody(False, None, None, None, False, normalize_body(text))
    end = start.find("-->")
    if end < 0:
        return ParsedBody(True, None, "header comment is not closed", None, False, "")
    comment, rest = start[: end + 3], start[end + 3 :]
    header: MailHeader | None = None
    error: str | None = None
    m = re.fullmatch(r"<!-- vaultmail:header v(\d+) (\{.*\}) -->", comment, re.DOTALL)
    if len(comment) > _MAX_HEADER_CHARS:
        error = "header comment is too long"
    elif m is None:
        error = "header comment is not in the vaultmail:header v1 {json} form"
    elif m.group(1) != str(HEADER_VERSION):
        error = f"header version {m.group(1)} is not supported"
    else:
        try:
            header = MailHeader.from_json(m.group(2))
        except ValidationError as exc:
            error = "; ".join(
                f"{'.'.join(str(p) for p in e['loc']) or 'header'}: {e['msg']}"
                for e in exc.errors()
            )
        except ValueError as exc:  # JSON syntax
            error = f"not valid JSON ({exc})"
    sep = _SEPARATOR_RE.search(rest)
    if sep is None:
        return ParsedBody(True, header, error, "", False, normalize_body(rest))
    readable = rest[: sep.start()]
    return ParsedBody(True, header, error, readable, True, normalize_body(rest[sep.end() :]))


def parse_mail_body(issue_body: str | None) -> tuple[MailHeader | None, str]:
    """(header, body text). The header is None when the body does not begin with one or it
    cannot be read; the body text is then what follows the header, or the whole issue body."""
    parsed = split_mail_body(issue_body)
    return parsed.header, parsed.body


# -- verifying ---------------------------------------------------------------------------------


class VerdictStatus(StrEnum):
    VALID = "valid"
    UNSIGNED = "unsigned"
    TAMPERED = "tampered"


@dataclass(frozen=True)
class Verdict:
    """The result of checking a mail. ``header`` is the header as found (None if there is none
    or it is unreadable); ``signed`` says its signature verified, so its values are the ones
    the office signed (keep them in the index even when the mail is tampered); ``problems``
    lists every finding, ``reason`` joins them."""

    status: VerdictStatus
    reason: str
    problems: tuple[str, ...] = ()
    header: MailHeader | None = None
    signed: bool = False
    body: str = ""

    @property
    def valid(self) -> bool:
        return self.status is VerdictStatus.VALID


def _tampered(problems: list[str], header: MailHeader | None, signed: bool, body: str) -> Verdict:
    return Verdict(
        VerdictStatus.TAMPERED, "; ".join(problems), tuple(problems), header, signed, body
    )


def _clip(text: str, limit: int = 80) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _canon_lines(text: str) -> str:
    return "\n".join(line.rstrip() for line in text.strip().split("\n"))


def verify_mail(
    issue_title: str,
    issue_body: str | None,
    vault_full_name: str,
    keys: Verifier,
    *,
    expected_mail_id: str | None = None,
) -> Verdict:
    """Check a mail as found in the forge: its title, body and the repository it is in.

    ``keys`` is the Keyring or the published PublicKeys. ``expected_mail_id`` is the mail id
    the index holds for this issue, if any: then a missing header counts as tampering, and a
    header from another mail (copied in) is caught even within the same vault.
    """
    parsed = split_mail_body(issue_body)
    if not parsed.has_header:
        if expected_mail_id is not None:
            return _tampered(["the signed header was removed"], None, False, parsed.body)
        return Verdict(
            VerdictStatus.UNSIGNED, "no vaultmail header at the top of the body", body=parsed.body
        )
    header = parsed.header
    if header is None:
        return _tampered([f"header unreadable: {parsed.error}"], None, False, parsed.body)
    if not keys.has_key(header.key_id):
        return _tampered([f"unknown key id {header.key_id}"], header, False, parsed.body)
    if not verify_signature(header, keys):
        return _tampered(["header fields changed"], header, False, parsed.body)

    problems: list[str] = []
    if header.vault != vault_full_name.strip().lower():
        problems.append(f"signed for {header.vault} but found in {vault_full_name}")
    if expected_mail_id is not None and header.mail_id != expected_mail_id:
        problems.append(
            f"header belongs to mail {header.mail_id}, not {expected_mail_id} (copied in)"
        )
    title = normalize_subject(issue_title or "")
    if title != header.subject:
        problems.append(
            f"subject changed: signed as {_clip(header.subject)!r}, now {_clip(title)!r}"
        )
    if body_sha256(parsed.body) != header.body_sha256:
        problems.append("body changed after sending")
    if not parsed.has_separator or _canon_lines(parsed.readable or "") != render_readable(header):
        problems.append("readable header changed: it no longer matches the signed one")
    if problems:
        return _tampered(problems, header, True, parsed.body)
    return Verdict(VerdictStatus.VALID, "signed by the office", (), header, True, parsed.body)


__all__ = [
    "HEADER_VERSION",
    "SIGNED_FIELDS",
    "MailHeader",
    "ParsedBody",
    "Verdict",
    "VerdictStatus",
    "body_sha256",
    "canonical_bytes",
    "format_sent",
    "new_mail_id",
    "normalize_body",
    "normalize_subject",
    "parse_mail_body",
    "render_mail_body",
    "render_readable",
    "sign_header",
    "split_mail_body",
    "verify_mail",
    "verify_signature",
]
