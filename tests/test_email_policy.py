"""Outside senders held to each agent's policy: pure decisions, then over real SMTP."""

from __future__ import annotations

from bot.email.auth import Verdicts
from bot.email.message import parse_inbound
from bot.email.policy import SenderRate, decide
from bot.office.config import load_office
from bot.store import ledger, mails
from tests.support import label_names
from tests.test_email_support import DOMAIN, Mailroom, Sender, mailroom, message, send, wire

__all__ = ["mailroom"]


def _verdicts(*, aligned: bool, dmarc: str = "pass") -> Verdicts:
    return Verdicts("pass" if aligned else "none", "example.org", "none", (), dmarc,
                    "reject" if dmarc != "none" else "", "example.org", aligned=aligned)


def test_each_agents_policy_decides_in_order() -> None:
    office = load_office()
    agent = {a.slug: a for a in office.agents}
    bob = parse_inbound(b"From: bob@example.org\r\n\r\nhi\r\n")
    stranger = parse_inbound(b"From: eve@other.example\r\n\r\nhi\r\n")
    marco = parse_inbound(b"From: marco@acme.com\r\n\r\nhi\r\n")
    robot = parse_inbound(b"From: bob@example.org\r\nAuto-Submitted: auto-generated\r\n\r\nx\r\n")
    ok = _verdicts(aligned=True)
    assert decide(office, agent["scout"], stranger, ok).action == "deliver"
    assert decide(office, agent["builder"], bob, ok).action == "deliver"
    held = decide(office, agent["builder"], stranger, ok)
    assert held.action == "quiet" and held.held and "example.org" in (held.reason or "")
    assert decide(office, agent["critic"], stranger, ok).action == "refuse"
    assert decide(office, agent["critic"], marco, ok).action == "deliver"
    unproven = decide(office, agent["critic"], marco, _verdicts(aligned=False, dmarc="none"))
    assert unproven.action == "refuse" and "authenticated" in (unproven.reason or "")
    forged = decide(office, agent["scout"], marco, _verdicts(aligned=False, dmarc="fail"))
    assert forged.action == "quiet" and forged.held and "DMARC" in (forged.reason or "")
    assert decide(office, agent["scout"], robot, ok).action == "quiet"


async def test_outside_the_policy_mail_is_refused_or_held_for_the_person(
        mailroom: Mailroom) -> None:
    Sender("example.org", mailroom.dns).publish()
    Sender("other.example", mailroom.dns).publish()
    to_critic = wire(message("eve@other.example", f"critic@{DOMAIN}", "Hi", "let me in"))
    refused = await send(mailroom.port, to_critic, rcpts=[f"critic@{DOMAIN}"],
                         mail_from="eve@other.example")
    assert refused.code == 550 and "critic takes email from the office only" in refused.text
    to_builder = wire(message("eve@other.example", f"builder@{DOMAIN}", "Offer", "cheap!"))
    held = await send(mailroom.port, to_builder, rcpts=[f"builder@{DOMAIN}"],
                      mail_from="eve@other.example")
    assert held.code == 250
    from_bob = wire(message("bob@example.org", f"builder@{DOMAIN}", "Spec", "the spec"))
    accepted = await send(mailroom.port, from_bob, rcpts=[f"builder@{DOMAIN}"])
    assert accepted.code == 250
    await mailroom.embedded.settle()
    sara = mailroom.person("sara")
    first = await sara.issue("acme/builder-vault", 1)
    second = await sara.issue("acme/builder-vault", 2)
    assert label_names(first) == [] and label_names(second) == ["mail:new"]
    [note] = await sara.comments("acme/builder-vault", 1)
    assert note["body"].startswith("@sara this mail is held for you")
    store = mailroom.embedded.services.store
    assert len(await mails.all_mails(store)) == 2
    [queued] = await ledger.entries(store, event="run.queued")
    assert queued.subject == "acme/builder-vault#2"

    # sara releases the held mail to builder, as the note says: the label mail:new
    await sara.call("POST", "/repos/acme/builder-vault/issues/1/labels",
                    {"labels": ["mail:new"]}, expect=200)
    await mailroom.embedded.settle()
    released = await mails.mail_at(store, "acme/builder-vault", 1)
    assert released is not None and released.state == "mail:new"


def test_the_rate_counts_per_sender_and_agent_within_a_minute() -> None:
    now = [0.0]
    rate = SenderRate(2, clock=lambda: now[0])
    assert rate.admit("acme", "scout", "a@x.example") and rate.admit("acme", "scout",
                                                                     "a@x.example")
    assert not rate.admit("acme", "scout", "a@x.example")
    assert rate.admit("acme", "builder", "a@x.example") and rate.admit("acme", "scout",
                                                                       "b@x.example")
    now[0] = 60.5
    assert rate.admit("acme", "scout", "a@x.example")
