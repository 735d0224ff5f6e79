"""Messages taken apart and put together (bot.email.message, outgoing, addresses): pure."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from bot.email.addresses import BadAddress, mailbox, normalise, principal_of
from bot.email.auth import Verdicts
from bot.email.message import BadMessage, parse_inbound, read_meta, render_inbound
from bot.email.outgoing import (
    Outgoing,
    compose,
    mail_of_message_id,
    reply_message_id,
    reply_subject,
    to_wire,
)
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
        parse_office(base + "    scout: [builder]\n")
    with pytest.raises(ValueError, match="no agent 'ghost'"):
        parse_office(base + "    ghost: [g]\n")
    with pytest.raises(ValueError, match="not a mail domain"):
        parse_office("org: acme\nemail: {domain: 'not a domain'}\n")


def test_an_outgoing_reply_cannot_be_given_another_header_line() -> None:
    out = Outgoing(sender="scout@mail.acme.example", sender_name="scout\r\nBcc: evil@x.example",
                   to=("bob@example.org",), cc=(), subject=reply_subject("Hi\r\nBcc: e@x.y"),
                   message_id=reply_message_id("0" * 8 + "-0000-0000-0000-" + "0" * 12, "k",
                                               "mail.acme.example"),
                   in_reply_to="<m1@example.org>", references=("<m1@example.org>",),
                   text="hello", sent=datetime(2026, 12, 4, tzinfo=UTC))
    data = to_wire(compose(out))
    assert b"\r\nBcc:" not in data and data.count(b"\r\nSubject: Re: Hi Bcc: e@x.y\r\n") == 1
    assert mail_of_message_id(out.message_id, "mail.acme.example") == \
        "00000000-0000-0000-0000-000000000000"
    assert mail_of_message_id(out.message_id, "other.example") is None


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
