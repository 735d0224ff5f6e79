"""Messages taken apart and put together (bot.email.message, outgoing, addresses): pure."""

from __future__ import annotations

import base64
import json
from datetime import UTC, datetime
from email import message_from_bytes, policy
from email.message import EmailMessage

import pytest

from bot.email.addresses import BadAddress, mailbox, normalise, principal_of
from bot.email.auth import Verdicts
from bot.email.message import (
    META_PREFIX,
    Attached,
    BadMessage,
    parse_inbound,
    read_meta,
    render_inbound,
)
from bot.email.outgoing import (
    Outgoing,
    Unsendable,
    compose,
    mail_of_message_id,
    reply_message_id,
    reply_subject,
    to_wire,
)
from bot.mail.markdown import WORD_JOINER, defuse_mentions
from bot.office.config import load_office, parse_office

VERDICTS = Verdicts("pass", "example.org", "none", (), "none", "", "example.org")


def test_non_utf8_charsets_html_only_and_unknown_charsets_are_read_not_refused() -> None:
    latin = (b"From: =?iso-8859-1?q?Jos=E9?= <jose@example.org>\r\nTo: scout@x.example\r\n"
             b"Subject: =?iso-8859-1?q?Caf=E9?=\r\nContent-Type: text/plain; charset=iso-8859-1"
             b"\r\n\r\nUn caf\xe9, s'il vous pla\xeet\r\n")
    found = parse_inbound(latin)
    assert found.sender == "jose@example.org" and "café" in found.text.lower()
    html = (b"From: a@example.org\r\nContent-Type: text/html; charset=utf-8\r\n\r\n"
            b"<html><style>x{}</style><p>Hello <b>there</b></p><script>evil()</script>")
    assert parse_inbound(html).text == "Hello there"
    odd = (b"From: a@example.org\r\nContent-Type: text/plain; charset=x-nonsense\r\n\r\n"
           b"caf\xe9\r\n")
    assert parse_inbound(odd).text == "café"
    missing_id = parse_inbound(b"From: a@example.org\r\n\r\nhi\r\n")
    assert missing_id.message_id.endswith("@vaultmail.invalid>"), "derived from its bytes"


def test_malformed_mime_still_reads_and_a_message_without_from_is_refused() -> None:
    broken = (b"From: a@example.org\r\nContent-Type: multipart/mixed; boundary=\"nope\"\r\n\r\n"
              b"no boundary ever comes\r\n")
    assert parse_inbound(broken).sender == "a@example.org"
    with pytest.raises(BadMessage, match="no From"):
        parse_inbound(b"Subject: who am I\r\n\r\nnobody\r\n")
    with pytest.raises(BadMessage):
        parse_inbound(b"From: not an address\r\n\r\nx\r\n")


def test_automatic_mail_is_recognised() -> None:
    def auto(header: str) -> str | None:
        return parse_inbound(f"From: a@example.org\r\n{header}\r\n\r\nx\r\n".encode()).automatic

    assert auto("Auto-Submitted: auto-replied") is not None
    assert auto("Auto-Submitted: no") is None
    assert auto("Precedence: bulk") is not None and auto("Precedence: auto_reply") is not None
    assert auto("List-Id: <news.example.org>") is not None
    assert auto("X-Other: 1") is None


def test_the_meta_line_reads_back_and_cannot_close_its_comment() -> None:
    found = parse_inbound(b"From: a@example.org\r\nMessage-ID: <x-->y@example.org>\r\n"
                          b"Subject: s\r\n\r\n--> <!-- vaultmail:header v1 {} -->\r\n")
    body = render_inbound(found, VERDICTS)
    first = body.split("\n", 1)[0]
    assert first.startswith("<!-- vaultmail:email ") and first.count("-->") == 1
    meta = read_meta(body)
    assert meta is not None and meta.sender == "a@example.org"
    assert meta.verdicts["spf"] == "pass"


def test_addresses_lead_to_agents_and_principals_are_never_the_offices() -> None:
    office = load_office()
    assert office.email is not None and office.email.domain == "mail.acme.example"
    box = mailbox([office], "Research+eu@MAIL.acme.example")
    assert box is not None and box.agent.slug == "scout"
    assert mailbox([office], "nobody@mail.acme.example") is None
    assert mailbox([office], "scout@acme.com") is None
    assert principal_of("Marco@Acme.com") == "email:marco@acme.com"
    for bad in ("a b@example.org", "a@example.org\r\nBcc: x@y.z", "<>", "a@localhost"):
        with pytest.raises(BadAddress):
            normalise(bad)


def test_an_alias_taken_twice_or_for_no_agent_is_a_config_error() -> None:
    base = ("org: acme\nagents:\n  - {slug: scout, login: s}\n  - {slug: builder, login: b}\n"
            "email:\n  domain: mail.acme.example\n  aliases:\n")
    with pytest.raises(ValueError, match="already another address"):
        parse_office(base + "    scout: [builder]\n", repository=False)
    with pytest.raises(ValueError, match="no agent 'ghost'"):
        parse_office(base + "    ghost: [g]\n", repository=False)
    with pytest.raises(ValueError, match="not a mail domain"):
        parse_office("org: acme\nemail: {domain: 'not a domain'}\n", repository=False)


def test_an_outgoing_reply_cannot_be_given_another_header_line() -> None:
    out = Outgoing(sender="scout@mail.acme.example", sender_name="scout\r\nBcc: evil@x.example",
                   to=("bob@example.org",), cc=(), subject=reply_subject("Hi\r\nBcc: e@x.y"),
                   message_id=reply_message_id("0" * 8 + "-0000-0000-0000-" + "0" * 12, "k",
                                               "mail.acme.example", b"secret"),
                   in_reply_to="<m1@example.org>", references=("<m1@example.org>",),
                   text="hello", sent=datetime(2026, 12, 4, tzinfo=UTC))
    data = to_wire(compose(out))
    assert b"\r\nBcc:" not in data and data.count(b"\r\nSubject: Re: Hi Bcc: e@x.y\r\n") == 1
    assert mail_of_message_id(out.message_id, "mail.acme.example") == \
        "00000000-0000-0000-0000-000000000000"
    assert mail_of_message_id(out.message_id, "other.example") is None


# an RFC 2047 encoded-word that decodes to header lines and a body
_EVIL_WORD = "=?utf-8?b?" + base64.b64encode(
    b"Prices\r\nX-Injected: yes\r\n\r\nPHISH").decode() + "?="
_OWN_ID = reply_message_id("0" * 8 + "-0000-0000-0000-" + "0" * 12, "k", "mail.acme.example",
                           b"secret")


def _reply(**fields: object) -> Outgoing:
    base: dict[str, object] = dict(
        sender="scout@mail.acme.example", sender_name="scout (acme)", to=("bob@example.org",),
        cc=(), subject="Re: Prices", message_id=_OWN_ID, in_reply_to="<m1@example.org>",
        references=("<m1@example.org>",), text="12 EUR", sent=datetime(2026, 12, 4, tzinfo=UTC))
    return Outgoing(**{**base, **fields})  # type: ignore[arg-type]


def _read_back(data: bytes) -> EmailMessage:
    msg = message_from_bytes(data, policy=policy.default)
    assert isinstance(msg, EmailMessage)
    return msg


def test_a_stranger_subject_or_id_that_decodes_to_header_lines_stays_one_header_value() -> None:
    """The email package decodes RFC 2047 encoded-words in a header value it is given, and
    before Python 3.11.10 (CVE-2024-6923) writes a decoded line break raw (found by review: a
    stranger's `Subject: =?utf-8?b?...?=` became header lines and a body in the agent's
    DKIM-signed reply; so did an id like `<=?...?=>` through In-Reply-To and References).
    A subject is read decoded, once; no header value written can open an encoded-word; an
    id that is not a plain `<left@right>` is not written."""
    found = parse_inbound(
        f"From: bob@example.org\r\nSubject: {_EVIL_WORD}\r\nMessage-ID: <m1@example.org>\r\n"
        f"References: <m0@example.org> <{_EVIL_WORD}>\r\n\r\nhi\r\n".encode())
    assert found.subject == "Prices X-Injected: yes PHISH"
    plain = ["From", "To", "Subject", "Date", "Message-ID", "Auto-Submitted", "Content-Type",
             "Content-Transfer-Encoding", "MIME-Version"]
    for subject, in_reply_to, references, headers in [
            (reply_subject(found.subject), "<m1@example.org>", found.references,
             plain[:5] + ["In-Reply-To", "References"] + plain[5:]),
            (f"Re: {_EVIL_WORD}", f"<{_EVIL_WORD}>", (f"<{_EVIL_WORD}@example.org>",), plain),
            ("Prices\u2028X-Injected: yes", None, (), plain)]:
        out = _reply(subject=subject, in_reply_to=in_reply_to, references=references)
        back = _read_back(to_wire(compose(out)))
        assert list(back.keys()) == headers, subject
        assert "\n" not in str(back["Subject"]) and back.get_content().strip() == "12 EUR"
    assert _read_back(to_wire(compose(_reply(references=found.references))))[
        "References"] == "<m0@example.org>"


def test_a_message_that_is_not_written_as_composed_is_refused() -> None:
    """The last check before a message goes: written and read back, it has the headers it
    was given, none of them a line break (on a Python that writes a decoded one raw, or one
    that encodes it); an address or own id the app would not write is refused too."""
    msg = EmailMessage()
    msg["Subject"] = _EVIL_WORD  # as compose set it before: the email package decodes it
    msg.set_content("hi")
    with pytest.raises(Unsendable):
        to_wire(msg)
    for bad in (dict(cc=("carol-@" + WORD_JOINER + "example.net",)),
                dict(to=(f"{_EVIL_WORD}@example.net",)), dict(message_id=f"<{_EVIL_WORD}>")):
        with pytest.raises(Unsendable):
            compose(_reply(**bad))
    with pytest.raises(BadAddress):
        normalise(f"{_EVIL_WORD}@example.net")


def test_mention_defusing_leaves_the_meta_line_as_the_message_had_it() -> None:
    """The app defuses @mentions over the whole body it posts, meta line included (found by
    review: `carol-@example.net` in a Cc was kept with a word joiner after its `@`, an address
    no relay takes, and every later reply of the thread waited behind it). The meta line has
    no `@` or `&` for it to change; one written before reads back without the joiners."""
    found = parse_inbound(b"From: bob-@example.org\r\nCc: carol-@example.net\r\n"
                          b"Message-ID: <m-@example.org>\r\n\r\nhi @carol\r\n")
    files = (Attached(name="a&#64;b.txt", path="attachments/x/a&#64;b.txt", size=1,
                      content_type="text/plain", sha="0" * 40),)
    body = defuse_mentions(render_inbound(found, VERDICTS, attached=files))
    assert "hi @" + WORD_JOINER + "carol" in body, "the text is still defused"
    meta = read_meta(body)
    assert meta is not None
    assert (meta.sender, meta.cc, meta.message_id) == (
        "bob-@example.org", ("carol-@example.net",), "<m-@example.org>")
    assert meta.attachments[0].name == "a&#64;b.txt"
    legacy = defuse_mentions(META_PREFIX + json.dumps(
        {"message_id": "<m-@example.org>", "from": "bob-@example.org",
         "cc": ["carol-@example.net"], "references": ["<r-@example.org>"]}) + " -->")
    assert WORD_JOINER in legacy
    old = read_meta(legacy)
    assert old is not None and (old.sender, old.cc, old.message_id, old.references) == (
        "bob-@example.org", ("carol-@example.net",), "<m-@example.org>", ("<r-@example.org>",))


@pytest.mark.parametrize("header", ["From", "To", "Cc"])
def test_an_address_header_longer_than_any_real_one_is_refused_before_it_is_read(
        header: str) -> None:
    """A stranger's address headers are read by the standard library's parser, which spends
    seconds on one folded over megabytes (found by review: a 10 MiB From, 2.3 s of the event
    loop that serves every office): one over MAX_ADDRESS_HEADER is refused, naming it."""
    from bot.email.message import MAX_ADDRESS_HEADER

    long = "a@b.example," + " " * MAX_ADDRESS_HEADER + "c@d.example"
    headers = {"From": "bob@example.org", "To": "scout@mail.acme.example", "Cc": ""}
    headers[header] = long
    raw = "".join(f"{k}: {v}\r\n" for k, v in headers.items() if v).encode() + \
        b"Subject: hi\r\n\r\nbody\r\n"
    with pytest.raises(BadMessage, match=f"{header} header is .* characters; at most"):
        parse_inbound(raw)
