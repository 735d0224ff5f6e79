"""What one stranger on the internet, or one office, can make the mail of the others wait for
(review 11): the SMTP listener's work on strangers' messages, the sender rate, and the
recipients of a reply. Over real SMTP on loopback, as tests/test_email_server.py."""

from __future__ import annotations

import asyncio
import os
import threading

from bot.email.server import STRANGER_THREADS
from bot.store import mails
from tests.test_email_support import (
    DOMAIN,
    Mailroom,
    Sender,
    mailroom,
    message,
    send,
    wire,
)

__all__ = ["mailroom"]  # the fixture, used by name
SCOUT_VAULT = "acme/scout-vault"


async def _smtp(port: int, mail_from: str, rcpt: str, data: bytes) -> str:
    """One message over a raw asyncio SMTP session (no thread of the loop's pool: the test's
    own client must not be what fills it); the answer to the final dot."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)

    async def said() -> str:
        line = await reader.readline()
        while line[3:4] == b"-":
            line = await reader.readline()
        return line.decode()

    try:
        await said()
        for command in (b"EHLO client.slow.example", f"MAIL FROM:<{mail_from}>".encode(),
                        f"RCPT TO:<{rcpt}>".encode(), b"DATA"):
            writer.write(command + b"\r\n")
            await said()
        writer.write(data.replace(b"\r\n.", b"\r\n..") + b"\r\n.\r\n")
        return await said()
    finally:
        writer.close()


async def test_a_strangers_slow_dns_stalls_no_one_elses_mail(mailroom: Mailroom) -> None:
    """A message's SPF, DKIM and DMARC lookups name domains its sender chooses, and a domain
    whose DNS answers slowly (just inside the resolver's 5 s, lookup after lookup: SPF
    alone may take ten) held a thread of the event loop's one default pool for each message,
    with no limit on sessions: the pool every office shares for its config parsing, key
    loading, domain proofs and the relay's sends. A handful of connections from outside,
    and acme's agent's mail to bob waited for the stranger's DNS."""
    release, entered, arrived = threading.Event(), [0], asyncio.Event()
    pool = min(32, (os.cpu_count() or 1) + 4)  # asyncio's default executor
    busy = min(pool, STRANGER_THREADS)
    loop = asyncio.get_running_loop()
    look = mailroom.dns._look

    def slow_look(table: dict[str, list[str]], name: str) -> list[str]:
        if name.lower().rstrip(".").endswith("slow.example"):
            entered[0] += 1
            if entered[0] == busy:  # as many lookups waiting as threads can run them
                loop.call_soon_threadsafe(arrived.set)
            release.wait(60)  # the stranger's name server, answering at its leisure
        return look(table, name)

    mailroom.dns._look = slow_look  # type: ignore[method-assign]
    # the office is warm: its domain proven, its keys read
    await mailroom.tools("agent:scout")("mail_send", to="bob@example.org", subject="Warm",
                                        body="first")
    await asyncio.wait_for(mailroom.relay.received.get(), 30)
    raw = wire(message("x@slow.example", f"scout@{DOMAIN}", "Hello", "slowly"))
    stalls = [asyncio.create_task(_smtp(mailroom.port, f"x{n}@slow.example",
                                        f"scout@{DOMAIN}", raw)) for n in range(pool + 2)]
    try:
        await asyncio.wait_for(arrived.wait(), 20)  # the stranger's lookups fill the threads
        await mailroom.tools("agent:scout")("mail_send", to="bob@example.org",
                                            subject="Prices", body="12 EUR")
        try:
            out = await asyncio.wait_for(mailroom.relay.received.get(), 15)
        except TimeoutError:
            raise AssertionError("acme's mail to bob waited behind a stranger's DNS") from None
        assert out.rcpt_tos == ["bob@example.org"]
    finally:
        release.set()
        await asyncio.gather(*stalls, return_exceptions=True)


async def test_a_forged_from_cannot_spend_a_real_senders_rate(mailroom: Mailroom) -> None:
    """The sender rate (5 a minute here) was counted per From header, whatever
    authenticated it: a stranger forging `boss@partner.example` five times a minute had
    the real boss's signed, SPF- and DMARC-passing mail to scout answered 451, for as long
    as the stranger kept on (and its server gives up after days: refused)."""
    boss = Sender("partner.example", mailroom.dns)
    boss.publish()  # SPF for loopback, DKIM, DMARC p=reject: the real boss authenticates
    for n in range(5):  # forged: no signature, an envelope sender of the stranger's own
        forged = wire(message("boss@partner.example", f"scout@{DOMAIN}", f"Urgent {n}",
                              "pay now", Message_ID=f"<forged{n}@evil.example>"))
        await send(mailroom.port, forged, rcpts=[f"scout@{DOMAIN}"],
                   mail_from="bounce@evil.example")
    real = boss.sign(wire(message("boss@partner.example", f"scout@{DOMAIN}", "Contract",
                                  "Here it is.", Message_ID="<real@partner.example>")))
    answer = await send(mailroom.port, real, rcpts=[f"scout@{DOMAIN}"],
                        mail_from="boss@partner.example")
    assert answer.code == 250, answer


async def test_one_domain_writing_a_new_sender_each_time_is_told_to_try_later(
        mailroom: Mailroom) -> None:
    """Acted out: an authenticated sender (an aligned SPF or DKIM pass) was counted by its
    whole From address, so whoever publishes a domain's SPF (or holds its DKIM key) sent
    a0@evil.example, a1@evil.example, ... each under a count of its own, from an address of
    its own each: 26 messages, 26 issues on the forge, and no end to it. The aligned domain
    (its organisational domain: a subdomain is the same owner's) now has a count of its own
    per agent too, five times a sender's (25 a minute here): past it 451, try again later;
    another domain's senders are not held up by it."""
    Sender("evil.example", mailroom.dns).publish()  # SPF passes for every loopback address
    answers = []
    for n in range(26):
        raw = wire(message(f"a{n}@evil.example", f"scout@{DOMAIN}", f"Offer {n}", "!!!"))
        answers.append(await send(mailroom.port, raw, rcpts=[f"scout@{DOMAIN}"],
                                  mail_from=f"a{n}@evil.example", source=f"127.0.1.{n + 1}"))
    assert [a.code for a in answers] == [250] * 25 + [451], [a.code for a in answers]
    assert "evil.example" in answers[-1].text and "at most 25 a minute" in answers[-1].text
    assert "try again" in answers[-1].text
    # a subdomain's From, aligned with evil.example's SPF (relaxed), is evil.example's
    raw = wire(message("b@news.evil.example", f"scout@{DOMAIN}", "Offer", "!!!"))
    assert (await send(mailroom.port, raw, rcpts=[f"scout@{DOMAIN}"],
                       mail_from="b@evil.example", source="127.0.2.1")).code == 451
    Sender("example.net", mailroom.dns).publish()
    calm = wire(message("bob@example.net", f"scout@{DOMAIN}", "Hello", "just me"))
    assert (await send(mailroom.port, calm, rcpts=[f"scout@{DOMAIN}"],
                       mail_from="bob@example.net", source="127.0.2.2")).code == 250
    await mailroom.embedded.settle()
    assert len(await mails.all_mails(mailroom.embedded.services.store)) == 26


async def test_one_address_cannot_have_the_app_look_up_dns_without_limit(
        mailroom: Mailroom) -> None:
    """Acted out: the count per connecting address of mail whose From is not authenticated
    was asked only after the message's SPF, DKIM and DMARC lookups, so an address past it,
    told 451, still had the app ask DNS for every message it sent (names of its choosing:
    an amplifier against their name servers, and work on the app's own threads). Each
    message's authentication is now counted per address first, five times the rate (25 a
    minute here): past it 451 before any lookup."""
    answers = []
    for n in range(25):
        raw = wire(message(f"x{n}@amplifier.example", f"scout@{DOMAIN}", f"Hi {n}", "?"))
        answers.append(await send(mailroom.port, raw, rcpts=[f"scout@{DOMAIN}"],
                                  mail_from=f"x{n}@amplifier.example"))
    assert [a.code for a in answers] == [250] * 5 + [451] * 20, [a.code for a in answers]
    assert "amplifier.example" in mailroom.dns.asked  # (SPF: the envelope sender's domain)
    before = len(mailroom.dns.asked)
    raw = wire(message("y@amplifier.example", f"scout@{DOMAIN}", "Once more", "?"))
    answer = await send(mailroom.port, raw, rcpts=[f"scout@{DOMAIN}"],
                        mail_from="y@amplifier.example")
    assert answer.code == 451 and "try again" in answer.text, answer
    looked = [name for name in mailroom.dns.asked[before:] if "amplifier" in name]
    assert looked == [], f"a message past the address's budget was looked up: {looked}"
    # another address is not held up by it
    assert (await send(mailroom.port, raw, rcpts=[f"scout@{DOMAIN}"],
                       mail_from="y@amplifier.example", source="127.0.0.2")).code == 250


async def test_a_strangers_cc_list_is_not_whom_the_office_mails(mailroom: Mailroom) -> None:
    """A reply goes to the message's sender and, reply-all, to everyone its Cc named: a
    stranger (no authentication) naming 400 addresses in Cc had scout's one answer go out
    DKIM-signed as acme to all of them (the header's only limit is 64 KiB)."""
    many = ", ".join(f"victim{n}@spam-target.example" for n in range(400))
    raw = wire(message("someone@example.org", f"scout@{DOMAIN}", "Question", "Prices?",
                       Message_ID="<cc@example.org>", Cc=many))
    assert (await send(mailroom.port, raw, rcpts=[f"scout@{DOMAIN}"])).code == 250
    await mailroom.embedded.settle()
    await mailroom.tools("agent:scout")("mail_reply", mail=f"{SCOUT_VAULT}#1",
                                        body="12 EUR.")
    out = await mailroom.relay.next()
    assert len(out.rcpt_tos) <= 21, f"one reply went to {len(out.rcpt_tos)} addresses"


async def _greeting(port: int, local: str) -> tuple[asyncio.StreamWriter, str]:
    """A session opened from loopback address `local`, and the server's first line."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port, local_addr=(local, 0))
    return writer, (await reader.readline()).decode()


async def test_strangers_hold_no_more_sessions_than_the_listener_takes(
        mailroom: Mailroom) -> None:
    """Each SMTP session may hold a message of up to SMTP_MAX_BYTES in memory until it is
    read, and nothing capped how many sessions strangers open (webhook bodies have a cap
    for the whole process): one peer holds at most MAX_PEER_SESSIONS, everyone together
    MAX_SESSIONS; past them a session is answered 421 (try later) and closed. A session
    that ends gives its place back."""
    from bot.email.server import MAX_PEER_SESSIONS, MAX_SESSIONS

    held: list[asyncio.StreamWriter] = []
    try:
        for _ in range(MAX_PEER_SESSIONS):
            writer, line = await _greeting(mailroom.port, "127.0.0.2")
            held.append(writer)
            assert line.startswith("220"), line
        writer, line = await _greeting(mailroom.port, "127.0.0.2")
        writer.close()
        assert line.startswith("421") and "from your address" in line, line
        peers = -(-MAX_SESSIONS // MAX_PEER_SESSIONS)
        for n in range(1, peers):
            for _ in range(min(MAX_PEER_SESSIONS, MAX_SESSIONS - len(held))):
                writer, line = await _greeting(mailroom.port, f"127.0.1.{n}")
                held.append(writer)
                assert line.startswith("220"), line
        writer, line = await _greeting(mailroom.port, "127.0.2.1")
        writer.close()
        assert line.startswith("421") and "too many sessions" in line, line
        held.pop().close()  # one ends: its place is given back
        for _ in range(100):
            writer, line = await _greeting(mailroom.port, "127.0.2.1")
            if line.startswith("220"):
                held.append(writer)
                break
            writer.close()  # (the server has not seen the end of the one closed yet)
            await asyncio.sleep(0.01)
        else:
            raise AssertionError("a session that ended never gave its place back")
    finally:
        for writer in held:
            writer.close()
