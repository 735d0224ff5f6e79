"""SPF, DKIM and DMARC verdicts (bot.email.auth), offline: DNS answered from a table."""

from __future__ import annotations

from bot.email.auth import authenticate, check_dkim, check_dmarc, check_spf, organisational
from tests.test_email_support import Sender, TableDns, message, wire


def test_spf_follows_includes_redirects_a_and_mx_and_counts_lookups() -> None:
    dns = TableDns(txts={
        "example.org": ["v=spf1 include:_spf.example.org a:web.example.org/24 mx -all"],
        "_spf.example.org": ["v=spf1 ip4:192.0.2.0/24 ip6:2001:db8::/32 ~all"],
        "soft.example": ["v=spf1 ~all"],
        "redir.example": ["v=spf1 redirect=example.org"],
        "two.example": ["v=spf1 -all", "v=spf1 +all"],
        "loop.example": ["v=spf1 include:loop.example -all"],
    }, hosts={"web.example.org": ["198.51.100.7"], "mx1.example.org": ["203.0.113.5"]},
        mxs={"example.org": ["mx1.example.org"]})
    assert check_spf("192.0.2.9", "example.org", dns) == "pass"
    assert check_spf("2001:db8::1", "example.org", dns) == "pass"
    assert check_spf("198.51.100.200", "example.org", dns) == "pass"  # a:/24
    assert check_spf("203.0.113.5", "example.org", dns) == "pass"  # mx
    assert check_spf("10.0.0.1", "example.org", dns) == "fail"
    assert check_spf("10.0.0.1", "soft.example", dns) == "softfail"
    assert check_spf("192.0.2.9", "redir.example", dns) == "pass"
    assert check_spf("10.0.0.1", "nothing.example", dns) == "none"
    assert check_spf("10.0.0.1", "two.example", dns) == "permerror"
    assert check_spf("10.0.0.1", "loop.example", dns) == "permerror"  # past 10 lookups
    assert check_spf("::ffff:192.0.2.9", "example.org", dns) == "pass"
    dns.failing.add("example.org")
    assert check_spf("192.0.2.9", "example.org", dns) == "temperror"


def test_dkim_verifies_a_signature_and_catches_a_changed_body() -> None:
    dns = TableDns()
    bob = Sender("example.org", dns)
    bob.publish()
    raw = bob.sign(wire(message("bob@example.org", "scout@mail.acme.example", "Hi", "Hello")))
    assert check_dkim(raw, dns) == ("pass", ("example.org",))
    assert check_dkim(raw.replace(b"Hello", b"Hullo"), dns)[0] == "fail"
    assert check_dkim(wire(message("a@b.example", "c@d.example", "x", "y")), dns) == \
        ("none", ())
    dns.failing.add("s1._domainkey.example.org")
    assert check_dkim(raw, dns)[0] == "temperror"


def test_dmarc_needs_an_aligned_pass_and_takes_the_policy() -> None:
    dns = TableDns(txts={"_dmarc.example.org": ["v=DMARC1; p=reject; sp=quarantine"],
                         "_dmarc.strict.example": ["v=DMARC1; p=none; aspf=s; adkim=s"]})
    assert check_dmarc("example.org", "pass", "bounces.example.org", "none", (), dns) == \
        ("pass", "reject")  # relaxed: the same organisational domain
    assert check_dmarc("example.org", "pass", "evil.example", "fail", (), dns) == \
        ("fail", "reject")
    assert check_dmarc("example.org", "fail", "example.org", "pass", ("example.org",), dns) \
        == ("pass", "reject")
    assert check_dmarc("news.example.org", "fail", "x.example", "none", (), dns) == \
        ("fail", "quarantine")  # a subdomain: sp=
    assert check_dmarc("strict.example", "pass", "mail.strict.example", "none", (), dns) == \
        ("fail", "none")
    assert check_dmarc("nodmarc.example", "fail", "", "none", (), dns) == ("none", "")
    assert organisational("a.b.example.co.uk") == "example.co.uk"
    assert organisational("mail.acme.example") == "acme.example"


def test_a_forged_from_fails_dmarc_however_good_the_rest_looks() -> None:
    dns = TableDns(txts={"_dmarc.bank.example": ["v=DMARC1; p=reject"],
                         "attacker.example": ["v=spf1 ip4:127.0.0.1 -all"]})
    raw = wire(message("CEO <ceo@bank.example>", "scout@mail.acme.example", "Pay", "now"))
    verdicts = authenticate(raw, ip="127.0.0.1", helo="attacker.example",
                            mail_from="x@attacker.example", from_domain="bank.example",
                            resolver=dns)
    assert verdicts.spf == "pass" and verdicts.dkim == "none"
    assert verdicts.dmarc == "fail" and verdicts.dmarc_policy == "reject"
    assert "DMARC fail (p=reject)" in verdicts.summary()


def test_organisational_domains_follow_the_public_suffix_list() -> None:
    """Relaxed alignment compares organisational domains (RFC 7489 §3.2): one level under a
    public suffix of the Public Suffix List. Under a suffix that list names and a rule of
    thumb does not (a registry's `ne.jp`, a host's `github.io`), each customer's domain is an
    organisation of its own, so one customer's SPF or DKIM pass never vouches for another's
    From, and a subdomain's policy is looked up at its own organisation, not the suffix."""
    assert organisational("mail.victim.ne.jp") == "victim.ne.jp"
    assert organisational("evil.github.io") == "evil.github.io"
    assert organisational("www.school.k12.ma.us") == "school.k12.ma.us"
    assert organisational("a.b.example.co.uk") == "example.co.uk"
    assert organisational("co.uk") == "co.uk"  # a suffix itself stands for itself
    dns = TableDns(txts={"_dmarc.victim.github.io": ["v=DMARC1; p=reject"],
                         "_dmarc.victim.ne.jp": ["v=DMARC1; p=quarantine"],
                         "_dmarc.ne.jp": ["v=DMARC1; p=none"]})
    # evil.github.io's own mail server passes SPF for its domain: not aligned with victim's
    assert check_dmarc("victim.github.io", "pass", "evil.github.io", "none", (), dns) == \
        ("fail", "reject")
    assert check_dmarc("victim.github.io", "fail", "", "pass", ("evil.github.io",), dns) == \
        ("fail", "reject")
    # a subdomain without a record takes its organisation's, not the registry's
    assert check_dmarc("mail.victim.ne.jp", "pass", "evil.ne.jp", "none", (), dns) == \
        ("fail", "quarantine")
    assert check_dmarc("mail.victim.ne.jp", "pass", "bounce.victim.ne.jp", "none", (),
                       dns) == ("pass", "quarantine")


def test_a_signed_message_dkim_cannot_take_apart_fails_dkim_and_raises_nothing() -> None:
    """dkimpy takes the message apart as its DKIM object is made, and raises for a header
    line that is no header field; that was outside the verification's `try`, so the intake's
    DATA answered `500 Error: (MessageFormatError) ...`, the library's own words (the header
    section's check refuses such messages first now: this holds the check's result whatever
    reaches it)."""
    dns = TableDns()
    bob = Sender("example.org", dns)
    bob.publish()
    raw = bob.sign(wire(message("bob@example.org", "scout@mail.acme.example", "Hi", "Hello")))
    head, _, body = raw.partition(b"\r\n\r\n")
    assert check_dkim(head + b"\r\nnot a header field\r\n\r\n" + body, dns) == ("fail", ())
