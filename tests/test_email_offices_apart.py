"""One office's trouble is its own (review 12): a second office installed beside acme whose
email domain's DNS cannot answer, or whose installation has spent its forge requests, made
every office's mail wait. Each RCPT looked up every office's domain proof and let the first
DNS error answer 451 for all; each lookup read every office's config, waiting (up to 15
minutes) for one whose forge said "rate limited"; and the outbox drained the offices one after
another, so acme's mail to the outside waited for evil's. Over real SMTP on loopback."""

from __future__ import annotations

import asyncio

import pytest
import yaml

from tests.test_email_support import (
    DOMAIN,
    Mailroom,
    delivered,
    install_office,
    mailroom,
    message,
    send,
    wire,
)

__all__ = ["mailroom"]  # the fixture, used by name
EVIL_DOMAIN = "lame.evil.example"
EVIL = f"""org: evil
email:
  domain: {EVIL_DOMAIN}
agents:
  - slug: spy
    login: evil-spy
"""
# long enough to tell "waited for evil" from "did not", short of the test run's own limit
PATIENCE = 30.0


async def _install_evil(room: Mailroom) -> None:
    await install_office(room, EVIL)


async def _to_scout(room: Mailroom, subject: str) -> int:
    raw = wire(message("bob@example.org", f"scout@{DOMAIN}", subject, "hello"))
    answer = await asyncio.wait_for(send(room.port, raw, rcpts=[f"scout@{DOMAIN}"]),
                                    PATIENCE)
    assert (await delivered(room, answer))[0].startswith("acme/scout-vault#"), answer
    return answer.code


async def test_another_offices_dns_failing_refuses_none_of_this_offices_mail(
        mailroom: Mailroom) -> None:
    mailroom.dns.failing.add(f"_vaultmail.{EVIL_DOMAIN}")  # evil's own name servers: SERVFAIL
    await _install_evil(mailroom)
    await _to_scout(mailroom, "Hi")
    # evil's own mail is what waits: DNS cannot say now whose the domain is, try again later
    raw = wire(message("bob@example.org", f"spy@{EVIL_DOMAIN}", "Hi", "hello"))
    theirs = await send(mailroom.port, raw, rcpts=[f"spy@{EVIL_DOMAIN}"])
    assert theirs.code == 451, theirs


@pytest.mark.parametrize("trouble", ["limited", "hanging"])
async def test_another_offices_forge_in_trouble_holds_up_none_of_this_offices_mail(
        mailroom: Mailroom, trouble: str) -> None:
    await _install_evil(mailroom)
    emb = mailroom.embedded
    contents = "GET /repos/{owner}/{repo}/contents/{path}"
    if trouble == "limited":  # evil's installation has spent its hour's requests
        emb.forge.faults.add(route=contents, kind="primary_limit", status=403,
                             repo="evil/.github")
    # else evil's config reads are not answered (until the test lets them go)
    held = emb.forge.faults.hold(contents, count=None, repo="evil/.github") \
        if trouble == "hanging" else None
    emb.services.offices.max_age = 0.0  # every office's config is read again at each use
    try:
        await _to_scout(mailroom, "First")
        await _to_scout(mailroom, "Second")
        # and acme's agent's mail to the outside goes, whatever evil's outbox round waits for
        await mailroom.tools("agent:scout")("mail_send", to="bob@example.org", subject="Out",
                                            body="hello bob")
        out = await asyncio.wait_for(mailroom.relay.next(), PATIENCE)
        assert out.rcpt_tos == ["bob@example.org"]
        if held is not None:
            assert held.caught, "evil's config read was never held: the test tested nothing"
    finally:
        if held is not None:
            held.release()


async def test_another_offices_outbox_stuck_holds_up_none_of_this_offices_mail(
        mailroom: Mailroom) -> None:
    await install_office(mailroom, EVIL, proven=True)
    store = mailroom.embedded.services.store
    # evil's drain cannot get on: its outbox's lock is held (a stalled replica's drain, a
    # forge waiting out evil's limits: whatever keeps it)
    async with store.named_lock("email-outbox:evil"):
        for subject in ("One", "Two"):
            await mailroom.tools("agent:scout")("mail_send", to="bob@example.org",
                                                subject=subject, body="hello bob")
            out = await asyncio.wait_for(mailroom.relay.next(), PATIENCE)
            assert f"Subject: {subject}".encode() in out.content, out.content[:300]


async def test_a_pushed_config_not_read_yet_is_waited_for_not_the_one_before_served(
        mailroom: Mailroom) -> None:
    """While the read a push asked for hangs, the config before it is not served to a round
    of every office: scout's alias `research`, removed by the push, is answered 451 (try
    later), not delivered to; once the read is answered, 550."""
    emb = mailroom.embedded
    forge = emb.forge
    config = yaml.safe_load(forge.state.repo("acme", ".github").files["vaultmail.yml"])
    del config["email"]["aliases"]
    held = forge.faults.hold("GET /repos/{owner}/{repo}/contents/{path}", count=None,
                             repo="acme/.github")
    alias = f"research@{DOMAIN}"
    raw = wire(message("bob@example.org", alias, "Hi", "hello"))
    try:
        forge.put_file("acme/.github", "vaultmail.yml", yaml.safe_dump(config),
                       pusher="admin")
        await held.arrived.wait()  # the push's read is at the forge, unanswered
        answer = await asyncio.wait_for(send(mailroom.port, raw, rcpts=[alias]), PATIENCE)
        assert answer.code == 451, answer
    finally:
        held.release()
    await emb.settle()
    answer = await send(mailroom.port, raw, rcpts=[alias])
    assert answer.code == 550 and "no such mailbox" in answer.text, answer


async def test_an_office_unreadable_for_good_turns_no_strangers_550_into_451(
        mailroom: Mailroom) -> None:
    """evil's config read fails every time (its installation suspended, its requests spent):
    mail to a domain no office names, nor evil did when last read, is still refused for good
    (550), not put off (451) for as long as evil's trouble lasts."""
    await _install_evil(mailroom)
    emb = mailroom.embedded
    emb.forge.faults.add(route="GET /repos/{owner}/{repo}/contents/{path}", status=403,
                         kind="primary_limit", repo="evil/.github")
    emb.services.offices.max_age = 0.0
    raw = wire(message("bob@example.org", "nobody@unknown.example", "Hi", "hello"))
    answer = await send(mailroom.port, raw, rcpts=["nobody@unknown.example"])
    assert answer.code == 550 and "no such mailbox" in answer.text, answer
    # evil's own domain, which it named when last read: that may be its, try later
    raw = wire(message("bob@example.org", f"spy@{EVIL_DOMAIN}", "Hi", "hello"))
    answer = await send(mailroom.port, raw, rcpts=[f"spy@{EVIL_DOMAIN}"])
    assert answer.code == 451, answer
