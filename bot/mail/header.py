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
hidden header when verifying, and a table that disagrees with it is tampering (a mail the app
writes for a person also has, below the table, one unsigned line mentioning them:
``render_notify``). The body is everything after the first line that is exactly ``---``
following the header.

Only the very first thing in the issue body can be the header: a header-looking comment
anywhere else is part of the body, i.e. data.

What is signed (``canonical_bytes``): the ASCII line ``vaultmail-header-v1`` and a newline,
followed by the JSON object of the twelve signed fields -- version, mail_id, from_principal,
to_principal, sent, vault, subject, body_sha256, hops, in_reply_to (null when absent),
thread_id, key_id -- and, when present, the names the table shows (from_name, to_name: a
person's forge login rather than their email address) and the office that signed (office) --
with sorted keys, no whitespace, UTF-8, non-ASCII unescaped (RFC 8785 form for these fields).
The signature (Ed25519, base64url) covers those bytes.

Normal forms, so forges' rewriting does not break signatures: the body is hashed with LF line
endings, no leading blank lines and no trailing whitespace (``normalize_body``); the subject is
the issue title without surrounding whitespace; the vault is compared and signed lowercase.
A new header's subject is signed as ``clean_subject`` leaves it (no control, invisible or
bidi-override characters), and the issue is titled with exactly that.

A header proves a mail, not a copy of it: on an issue from the forge (``verify_issue``) it must
also be bound to that issue. The mails the app sends are issues the app opens as its own forge
account, which nobody else can; the mails it adopts (opened by a person) have the mail id
``adopted_mail_id(issue_id)``, from the forge's id for the issue (before, from its vault and
number: ``legacy_adopted_mail_id``, still accepted). A genuine header on any other issue is a copy
(``Verdict.copy``). Nothing in the signed form changed for this, so older headers verify as
before.

A header is the word of the office whose vault it sits in, and of no other (issue 21): each
office signs with its own key (``bot.mail.signing``), a new header names it (``office``), and
the check requires the key to speak for the office that owns the vault (the vault's owner).
A header another office's key signed, whatever vault it claims, is a forgery or a copy there;
a legacy key (from before offices had keys) verifies for the offices it served. Headers
without ``office`` (signed before) verify as they did. An office renamed with its org (or a
vault renamed) keeps the names it had with its keys (``Keyring.renamed``): a header signed for
``old/x-vault`` verifies in ``new/x-vault``, where that vault went, and is a copy anywhere else,
``old/x-vault`` of whoever holds the name ``old`` now included.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import re
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any, Final, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from bot.mail.signing import Signer, Verifier, kid_office, vault_office
from bot.names import NAME, OFFICE
from bot.unseen import clean_subject

# Mail between agents beyond this many hops starts no run: the automatic reply notification
# (the copy of a reply into an agent sender's vault), mail an agent sends in answer to mail
# (`inReplyTo`), each one hop more than the mail it answers, and mail an agent sends from a run
# a mail woke (its run token's `woken_by`, or, with another token, its latest mail run still
# open), one more than that mail. A mail a person writes, or an agent's with no mail run open
# and nothing it answers, starts at 0. Agents' comments in a row on an item count the same
# (bot.items.loop_guard).
LOOP_GUARD_HOPS = 3

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
# Signed when present, left out of the signed form when absent (so headers written before
# they existed verify as they did): what the table shows for each side instead of the principal
# (a person's forge login rather than their email address).
# `office` likewise: the office whose key signed (the vault's owner), on headers signed since
# each office has its own key.
OPTIONAL_SIGNED_FIELDS: tuple[str, ...] = ("from_name", "to_name", "office")
# (bot.names: wider than GitHub's alone, as Gitea's logins hold '.' and '_'; every name a
# header held before is still one, so what was signed then verifies)
_NAME_RE = re.compile(rf"^(login:{NAME}|agent:[a-z0-9-]+|office)$")

_ID = r"[A-Za-z0-9][A-Za-z0-9._:-]{0,127}"
_REPO = r"[A-Za-z0-9_.-]+/[A-Za-z0-9_.-]+"
# `email:<address>`: someone outside the office who wrote by email (bot/email), never a
# person or agent of the office whatever their From said
_PRINCIPAL_RE = re.compile(
    r"^((?:human|email):[^\s@<>`|\\]+@[^\s@<>`|\\]+|agent:[a-z0-9][a-z0-9-]{0,38}|office)$"
)
_ID_RE = re.compile(rf"^{_ID}$")
_REPO_RE = re.compile(rf"^{_REPO}$")
_ISSUE_REF_RE = re.compile(rf"^{_REPO}#[1-9][0-9]*$")
_SENT_RE = re.compile(r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}Z$")


def _sent_datetime(sent: str) -> datetime:
    """`sent` (``2025-01-31T09:00:00Z``) as a UTC datetime; ValueError for text of another
    form or a date that does not exist. Its fields sliced by position once the form matched:
    strptime builds and runs a regex per call, a tenth of signing a header. What fails here
    goes to strptime, which gives the same answer with its own error message."""
    # ($ also matches before a newline; \d any script's digits, which strptime's %m refuses)
    if len(sent) == 20 and sent.isascii() and _SENT_RE.match(sent) is not None:
        with contextlib.suppress(ValueError):  # (a date that does not exist: strptime says)
            return datetime(int(sent[0:4]), int(sent[5:7]), int(sent[8:10]),
                            int(sent[11:13]), int(sent[14:16]), int(sent[17:19]), tzinfo=UTC)
    return datetime.strptime(sent, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC)


_SEPARATOR_RE = re.compile(r"^---[ \t]*$", re.MULTILINE)
_CONTROL_RE = re.compile(r"[\x00-\x1f\x7f]")
MAIL_ID_NAMESPACE = uuid.UUID("5b0c3c1e-8f7a-4d6e-9a51-0c1d2e3f4a5b")  # derived mail ids


# -- normal forms ------------------------------------------------------------------------------


def normalize_newlines(text: str) -> str:
    return text.replace("\r\n", "\n").replace("\r", "\n")


def normalize_body(body: str) -> str:
    """The body as signed: LF line endings, no leading blank lines, no trailing whitespace."""
    return normalize_newlines(body).lstrip("\n").rstrip()


def normalize_subject(subject: str) -> str:
    """The subject as compared with the issue title: without surrounding whitespace."""
    return subject.strip()


def adopted_mail_id(issue_id: int) -> str:
    """The mail id of an issue a person opened by hand, once the app adopts it: derived from
    the forge's own id for the issue (GitHub's and Gitea's ``id``), so its header is bound to
    that one issue. Not from its vault and number: those repeat when a name is reused (a
    vault renamed and a new repository made under its old name), and two mails had one id."""
    return str(uuid.uuid5(MAIL_ID_NAMESPACE, f"adopt-issue\n{int(issue_id)}"))


def legacy_adopted_mail_id(vault: str, number: int) -> str:
    """The id mail adopted before ``adopted_mail_id`` had: from ``vault#number`` as signed.
    Such mail keeps its id and verifies; the app names no new mail this way."""
    return str(uuid.uuid5(MAIL_ID_NAMESPACE, f"adopt\n{vault.lower()}#{number}"))


def forge_id(issue: Mapping[str, Any]) -> int | None:
    """The forge's own id for an issue as it returns it (GitHub's and Gitea's ``id``)."""
    value = issue.get("id")
    return value if isinstance(value, int) else None


def adopted_here(mail_id: str, vault: str, number: int, issue_id: int | None = None) -> bool:
    """Whether ``mail_id`` is the one the app gives the issue ``vault#number`` (the forge's
    ``issue_id``, when known) adopting it: now, or before (``legacy_adopted_mail_id``). The
    app's key signs no other id for a hand-opened issue, so either binds the header to it."""
    return (issue_id is not None and mail_id == adopted_mail_id(issue_id)) or (
        mail_id == legacy_adopted_mail_id(vault, number))


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
    from_name: str | None = Field(default=None, pattern=_NAME_RE.pattern)
    to_name: str | None = Field(default=None, pattern=_NAME_RE.pattern)
    office: str | None = Field(default=None, pattern=rf"^{OFFICE}$")
    signature: str = Field(default="", pattern=r"^[A-Za-z0-9_-]*$")

    @field_validator("from_principal", "to_principal")
    @classmethod
    def _principal(cls, v: str) -> str:
        if not _PRINCIPAL_RE.match(v):
            raise ValueError("must be human:<email>, email:<address>, agent:<slug> or office")
        return v

    @field_validator("sent")
    @classmethod
    def _sent(cls, v: str) -> str:
        if not _SENT_RE.match(v):
            raise ValueError("must be ISO 8601 UTC to the second, like 2025-01-31T09:00:00Z")
        _sent_datetime(v)  # a real date
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
        return _sent_datetime(self.sent)

    def signed_fields(self) -> dict[str, Any]:
        fields = {name: getattr(self, name) for name in SIGNED_FIELDS}
        fields |= {name: getattr(self, name) for name in OPTIONAL_SIGNED_FIELDS
                   if getattr(self, name) is not None}
        return fields

    def to_json(self) -> str:
        """Compact JSON of every field (the hidden comment's payload, unescaped); the optional
        ones only when set, as they were signed."""
        data = self.model_dump()
        for name in OPTIONAL_SIGNED_FIELDS:
            if data[name] is None:
                del data[name]
        return json.dumps(data, sort_keys=True, separators=(",", ":"))

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
    from_name: str | None = None,
    to_name: str | None = None,
) -> MailHeader:
    """Build and sign a header with the keyring's active key. ``mail_id`` defaults to a new
    UUID, ``sent`` to now, ``thread_id`` to the mail id (a fresh thread); the subject is
    signed as ``clean_subject`` leaves it (title the issue with ``header.subject``). Invalid
    fields raise pydantic's ValidationError (a ValueError), and so does an office's keyring
    asked to sign for a vault of another office (it would never verify there)."""
    office = keyring.office
    if office is not None and vault_office(vault) != office:
        raise ValueError(f"office {office}'s key cannot sign for {vault}: that vault is "
                         f"office {vault_office(vault)}'s")
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
        subject=clean_subject(subject),
        body_sha256=body_sha256(body),
        hops=hops,
        in_reply_to=in_reply_to,
        thread_id=thread_id or mail_id,
        key_id=kid,
        from_name=from_name,
        to_name=to_name,
        office=office,
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


def _shown(name: str | None, principal: str) -> str:
    return name.removeprefix("login:") if name else principal


def render_readable(header: MailHeader) -> str:
    """The table people read: From, To, Sent, and In reply to when there is one. People are
    shown by forge login, in code spans so that nobody is mentioned (older headers, without
    names, show the principals)."""
    cols = ["From", "To", "Sent"]
    sent = header.sent_at.strftime("%Y-%m-%d %H:%M UTC")
    vals = [f"`{_shown(header.from_name, header.from_principal)}`",
            f"`{_shown(header.to_name, header.to_principal)}`", sent]
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


# A mail the app writes for a person is the app's issue, so the forge would not tell them of
# replies: the line below the table mentions them once (a mention subscribes them to the issue).
# It is not signed; the verifier accepts it in exactly this form, with nothing else there.
_NOTIFY_RE = re.compile(rf"^Replies here reach @{NAME} too\.$")


def render_notify(login: str) -> str | None:
    """The line that mentions a person who sent a mail the app wrote, or None for a login that
    cannot be mentioned safely."""
    line = f"Replies here reach @{login} too."
    return line if _NOTIFY_RE.match(line) else None


def render_mail_body(header: MailHeader, body: str, *, notify: str | None = None) -> str:
    """The full issue body: hidden header, readable table (and, with ``notify``, the line that
    mentions that login), separator, body (normal form). Raises ValueError if ``body`` is not
    the body the header was signed over."""
    body = normalize_body(body)
    if body_sha256(body) != header.body_sha256:
        raise ValueError("this body is not the one the header was signed over")
    readable = render_readable(header)
    line = render_notify(notify) if notify else None
    if line:
        readable += f"\n\n{line}"
    return f"{_comment(header)}\n\n{readable}\n\n---\n\n{body}\n"


def _readable_matches(readable: str, header: MailHeader) -> bool:
    """The readable part is the signed table, alone or followed by the mention line."""
    found, table = _canon_lines(readable), render_readable(header)
    if found == table:
        return True
    rest = found.removeprefix(table + "\n\n")
    return rest != found and _NOTIFY_RE.match(rest) is not None


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


def headed_by(mail_id: str) -> Callable[[Mapping[str, Any]], bool]:
    """Whether an issue's body opens with a mail header naming `mail_id`: the app's issue of
    that mail (the id anywhere else in a body the app posted is someone's words, who may name
    any mail's id). The signature is the caller's to check where it matters."""
    def heads(issue: Mapping[str, Any]) -> bool:
        header, _ = parse_mail_body(issue.get("body"))
        return header is not None and header.mail_id == mail_id
    return heads


_ANY_HEADER_RE = re.compile(r"<!--(\s*)vaultmail:header\b")


def written_body(issue_body: str | None) -> str:
    """What someone wrote in an issue they opened by hand, as the app adopts it as their mail.
    A pasted mail's header comment and readable table are taken off: they belong to that
    other mail, and signed again inside this one they would show a second sender. Any header
    comment left further down is disarmed (renamed ``vaultmail:quoted-header``), so no copy of
    this body carries something that reads as a genuine header."""
    parsed = split_mail_body(issue_body)
    # the header and table come off only where both are there, up to the separator; anything
    # else (an unclosed header comment, no separator) is kept whole, disarmed below
    body = parsed.body if parsed.has_header and parsed.has_separator else normalize_body(
        normalize_newlines(issue_body or ""))
    return _ANY_HEADER_RE.sub(r"<!--\1vaultmail:quoted-header", body)


# -- verifying ---------------------------------------------------------------------------------


class VerdictStatus(StrEnum):
    VALID = "valid"
    UNSIGNED = "unsigned"
    TAMPERED = "tampered"


@dataclass(frozen=True)
class Verdict:
    """The result of checking a mail. ``header`` is the header as found (None if there is none
    or it is unreadable); ``signed`` says its signature verified, so its values are the ones
    the office signed (keep them in the index even when the mail is tampered); ``office`` is
    that office (the signed vault's owner) when it did; ``problems`` lists every finding,
    ``reason`` joins them."""

    status: VerdictStatus
    reason: str
    problems: tuple[str, ...] = ()
    header: MailHeader | None = None
    signed: bool = False
    body: str = ""
    copy: bool = False  # a genuine header on an issue it was not written for: not that mail
    office: str | None = None
    revoked: bool = False  # signed with a key the operator withdrew (`vaultmail keys revoke`)

    @property
    def valid(self) -> bool:
        return self.status is VerdictStatus.VALID

    @property
    def warning(self) -> str:
        """What a tampered mail's readers are told: a mail whose key was withdrawn was not
        changed (as far as anyone can tell), it is only no longer vouched for."""
        if self.revoked and self.header is not None:
            return (f"The key that signed this mail ({self.header.key_id}) was withdrawn by "
                    "the operator, so its header no longer vouches for who sent it")
        return f"This mail was changed after it was sent ({self.reason})"


def _tampered(problems: list[str], header: MailHeader | None, signed: bool, body: str,
              copy: bool = False, keys: Verifier | None = None) -> Verdict:
    office = vault_office(keys.vault_now(header.key_id, header.vault) if keys else header.vault
                          ) if header is not None and signed else None
    return Verdict(VerdictStatus.TAMPERED, "; ".join(problems), tuple(problems), header, signed,
                   body, copy, office)


def _unknown_key(header: MailHeader, keys: Verifier, revoked: bool) -> str:
    if revoked:  # leaked, so whoever holds it may have written this
        return (f"signed with revoked key {header.key_id}: withdrawn by the operator, it no "
                "longer vouches for anything it signed")
    named, owner = kid_office(header.key_id), vault_office(header.vault)
    if named is not None and named != owner:
        return f"unknown key id {header.key_id} (a key of office {named}, not {owner})"
    return f"unknown key id {header.key_id}"


def _not_this_office(header: MailHeader, keys: Verifier) -> str | None:
    """Why a header whose signature verified is still not the word of the office owning the
    vault it names (its key speaks for another office, or it names another), or None. The
    vault is taken by the name it has now, where the key's office renamed it or itself since
    (`Verifier.vault_now`): a header signed as `old/x-vault` is the word of the office that
    was `old`, wherever that name went, never of whoever holds `old` now."""
    owner = vault_office(keys.vault_now(header.key_id, header.vault))
    offices = keys.speaks_for(header.key_id)
    if offices is not None and owner not in offices:
        if kid_office(header.key_id) is None:
            served = f"office{'s' if len(offices) > 1 else ''} {', '.join(offices)}"
            return (f"signed with the legacy key {header.key_id}, which signed for {served} "
                    f"only, but {header.vault} is office {owner}'s")
        return (f"signed with office {', '.join(offices)}'s key {header.key_id}, but "
                f"{header.vault} is office {owner}'s: a forgery or a copy, not {owner}'s mail")
    signed_for = vault_office(header.vault)  # (the office's name when it signed)
    if header.office is not None and header.office != signed_for:
        return (f"the header names office {header.office}, but {header.vault} is office "
                f"{signed_for}'s: a forgery or a copy, not {signed_for}'s mail")
    return None


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
    issue_number: int | None = None,
    issue_id: int | None = None,
    opened_by: str | None = None,
    app_login: str | None = None,
    home: str | None = None,
) -> Verdict:
    """Check a mail as found in the forge: its title, body and the repository it is in.

    ``keys`` is Keyrings (every office's keys), a Keyring or the published PublicKeys; the
    key must speak for the office owning the signed vault. ``expected_mail_id`` is the mail id
    the index holds for this issue, if any: then a missing header counts as tampering, and a
    header from another mail (copied in) is caught even within the same vault.

    With ``issue_number`` the header must also be bound to that issue (what ``verify_issue``
    checks for every issue from the forge): its mail id is the one the app derives for that
    issue (its forge id ``issue_id``; before, its number) when it adopts a hand-opened issue
    (``adopted_here``), or the issue was opened
    by the app itself (``opened_by`` is ``app_login``), since nobody else can open an issue
    as the app. ``home`` is the issue the index holds this header's mail at, if it knows it:
    a header found anywhere else is a copy.
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
        revoked = keys.revoked(header.key_id)
        return replace(_tampered([_unknown_key(header, keys, revoked)], header, False,
                                 parsed.body), revoked=revoked)
    if not verify_signature(header, keys):
        return _tampered(["header fields changed"], header, False, parsed.body)
    forged = _not_this_office(header, keys)
    if forged is not None:  # nothing in it is the word of the office whose vault it names
        return _tampered([forged], header, False, parsed.body)

    problems: list[str] = []
    vault = vault_full_name.strip().lower()
    now = keys.vault_now(header.key_id, header.vault)  # (renamed since, with its office)
    copy = False
    if now != vault:
        renamed = f" (now {now})" if now != header.vault else ""
        problems.append(f"signed for {header.vault}{renamed} but found in {vault_full_name}")
        copy = True
    if expected_mail_id is not None and header.mail_id != expected_mail_id:
        problems.append(
            f"header belongs to mail {header.mail_id}, not {expected_mail_id} (copied in)"
        )
        copy = True
    if issue_number is not None and not copy:
        here = f"{vault}#{issue_number}"
        if home is not None and home.lower() != here:
            problems.append(f"a copy of {home}: the header is that mail's, not this issue's")
            copy = True
        # (an adopted mail's id names the issue where it was adopted: its forge id, or
        # before, its number under the vault's name then)
        if not adopted_here(header.mail_id, header.vault, issue_number, issue_id) and (
                not opened_by or not app_login or opened_by.lower() != app_login.lower()):
            problems.append(
                f"a copy: the header was written for another issue, and {here} was opened "
                f"by {opened_by or 'someone unknown'}, not by the app ({app_login})")
            copy = True
    title = normalize_subject(issue_title or "")
    if title != header.subject:
        problems.append(
            f"subject changed: signed as {_clip(header.subject)!r}, now {_clip(title)!r}"
        )
    if body_sha256(parsed.body) != header.body_sha256:
        problems.append("body changed after sending")
    if not parsed.has_separator or not _readable_matches(parsed.readable or "", header):
        problems.append("readable header changed: it no longer matches the signed one")
    if problems:
        return _tampered(problems, header, True, parsed.body, copy, keys)
    office = vault_office(now)
    return Verdict(VerdictStatus.VALID, f"signed for office {office}", (), header, True,
                   parsed.body, office=office)


def verify_issue(
    issue: Mapping[str, Any],
    vault_full_name: str,
    keys: Verifier,
    *,
    app_login: str,
    expected_mail_id: str | None = None,
    home: str | None = None,
) -> Verdict:
    """``verify_mail`` for an issue as the forge returns it (title, body, number, and the
    login of whoever opened it), bound to that issue: the check for everything from the forge.
    ``app_login`` is the app's own forge account (``<slug>[bot]`` on GitHub)."""
    user = issue.get("user")
    opened_by = user.get("login") if isinstance(user, Mapping) else None
    return verify_mail(
        str(issue.get("title") or ""), issue.get("body"), vault_full_name, keys,
        expected_mail_id=expected_mail_id, issue_number=int(issue["number"]),
        issue_id=forge_id(issue),
        opened_by=str(opened_by) if opened_by else None, app_login=app_login, home=home)


__all__ = [
    "HEADER_VERSION",
    "SIGNED_FIELDS",
    "MailHeader",
    "ParsedBody",
    "Verdict",
    "VerdictStatus",
    "adopted_here",
    "adopted_mail_id",
    "forge_id",
    "legacy_adopted_mail_id",
    "body_sha256",
    "canonical_bytes",
    "clean_subject",
    "format_sent",
    "headed_by",
    "new_mail_id",
    "normalize_body",
    "normalize_subject",
    "parse_mail_body",
    "render_mail_body",
    "render_notify",
    "render_readable",
    "sign_header",
    "split_mail_body",
    "verify_issue",
    "verify_mail",
    "verify_signature",
]
