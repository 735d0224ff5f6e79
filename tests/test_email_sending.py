"""Mail out to addresses (issue 24), over real SMTP on loopback: an agent's `mail_send` to an
address goes out through the relay DKIM-signed, once, kept in its vault, and the answer by
email threads back to it; the loop guard's hop count carried across email; each message's
fate ledgered once (`email.*`); a message the relay keeps deferring given up as a bounce."""

from __future__ import annotations

from email import message_from_bytes, policy
from email.message import EmailMessage

from bot.email import outgoing
from bot.email.gateway import GATEWAY_KEY
from bot.store import ledger, mails
from tests.support import label_names
from tests.test_email_outbox import _dkim_ok
from tests.test_email_support import DOMAIN, Mailroom, mailroom, message, send, wire

__all__ = ["mailroom"]  # the fixture, used by name
SCOUT_VAULT = "acme/scout-vault"


def _parsed(data: bytes | None) -> EmailMessage:
    msg = message_from_bytes(data or b"", policy=policy.default)
    assert isinstance(msg, EmailMessage)
    return msg


async def _events(room: Mailroom, event: str) -> list[ledger.Entry]:
    return await ledger.entries(room.embedded.services.store, event=event)


async def test_mail_send_to_an_address_goes_out_once_and_the_answer_threads_back(
        mailroom: Mailroom) -> None:
    scout = mailroom.tools("agent:scout")
    # who may: scout's capabilities name example.org and carol@example.net, nothing else
    status, body = await scout.raw("mail_send", {"to": "eve@other.example", "subject": "Hi",
                                                 "body": "x"})
    assert status == 403 and "email:@example.org" in body["error"]["message"]
    status, _ = await mailroom.tools("agent:builder").raw(
        "mail_send", {"to": "bob@example.org", "subject": "Hi", "body": "x"})
    assert status == 403
    assert len(await _events(mailroom, "run.denied")) == 2

    sent = await scout("mail_send", to="bob@example.org", subject="Quote",
                       body="Send a quote, @bob.", idempotencyKey="q1")
    mail = sent["mail"]
    assert mail["to_principal"] == "email:bob@example.org" and mail["vault"] == SCOUT_VAULT
    envelope = await mailroom.relay.next()
    assert envelope.mail_from == f"scout@{DOMAIN}" and envelope.rcpt_tos == ["bob@example.org"]
    assert _dkim_ok(mailroom, envelope.original_content or b"")
    out = _parsed(envelope.original_content)
    assert out["Subject"] == "Quote" and out["To"] == "bob@example.org"
    assert out["Message-ID"] == outgoing.mail_message_id(mail["mail_id"], DOMAIN)
    assert out["Auto-Submitted"] is None, "a message the agent chose to write"
    assert out["X-Vaultmail-Hops"] == "0"
    assert out.get_content().strip() == "Send a quote, @bob."

    again = await scout("mail_send", to="bob@example.org", subject="Quote",
                        body="Send a quote, @bob.", idempotencyKey="q1")
    assert again["mail"]["mail_id"] == mail["mail_id"]
    assert await mailroom.outbox_settled() == 0 and mailroom.relay.received.empty()
    [ledgered] = await _events(mailroom, "email.sent")
    assert ledgered.data["message_id"] == out["Message-ID"]
    issue = await mailroom.person("marco").issue(SCOUT_VAULT, mail["number"])
    assert label_names(issue) == [], "no one's turn in the office"
    comments = await mailroom.person("marco").comments(SCOUT_VAULT, mail["number"])
    assert [c["body"].count("Sent by email") for c in comments] == [1]

    # Bob answers: new mail to scout in the same thread, waking it
    answer = wire(message("bob@example.org", f"scout@{DOMAIN}", "Re: Quote", "12 EUR each.",
                          Message_ID="<a1@example.org>", In_Reply_To=out["Message-ID"],
                          References=out["Message-ID"]))
    said = await send(mailroom.port, answer, rcpts=[f"scout@{DOMAIN}"])
    assert said.code == 250 and f"{SCOUT_VAULT}#2" in said.text
    await mailroom.embedded.settle()
    store = mailroom.embedded.services.store
    reply = await mails.mail_at(store, SCOUT_VAULT, 2)
    assert reply is not None and reply.from_principal == "email:bob@example.org"
    assert reply.in_reply_to == f"{SCOUT_VAULT}#1" and reply.thread_id == mail["thread_id"]
    assert reply.state == "mail:new"
    [received] = await _events(mailroom, "email.received")
    assert received.data["message_id"] == "<a1@example.org>"

    # scout's reply to it threads after Bob's answer, counting one hop more
    await scout("mail_reply", mail=f"{SCOUT_VAULT}#2", body="Deal.")
    back = _parsed((await mailroom.relay.next()).original_content)
    assert back["In-Reply-To"] == "<a1@example.org>"
    assert back["References"].split() == [out["Message-ID"], "<a1@example.org>"]
    assert back["X-Vaultmail-Hops"] == "1" and back["Auto-Submitted"] == "auto-replied"
    assert await mailroom.outbox_settled() == 0  # the round that sent it is over
    assert len(await _events(mailroom, "email.sent")) == 2


async def test_hop_counts_carry_across_email_and_stop_at_the_loop_guard(
        mailroom: Mailroom) -> None:
    """Two agents answering each other by email (another office's agent here played by the
    test) climb one hop an answer, as by mail, and the answer past the guard wakes no one."""
    first = wire(message("bob@example.org", f"scout@{DOMAIN}", "Ping", "Your turn.",
                         Message_ID="<p3@example.org>", X_Vaultmail_Hops="3"))
    assert (await send(mailroom.port, first, rcpts=[f"scout@{DOMAIN}"])).code == 250
    await mailroom.embedded.settle()
    store = mailroom.embedded.services.store
    mail = await mails.mail_at(store, SCOUT_VAULT, 1)
    assert mail is not None and mail.hops == 3 and mail.state == "mail:new"

    await mailroom.tools("agent:scout")("mail_send", to="bob@example.org", subject="Re: Ping",
                                        body="Yours.", inReplyTo=f"{SCOUT_VAULT}#1")
    out = _parsed((await mailroom.relay.next()).original_content)
    assert out["X-Vaultmail-Hops"] == "4"
    assert out["In-Reply-To"] == "<p3@example.org>"

    answer = wire(message("bob@example.org", f"scout@{DOMAIN}", "Re: Ping", "No, yours.",
                          Message_ID="<p5@example.org>", In_Reply_To=out["Message-ID"],
                          X_Vaultmail_Hops="5"))
    said = await send(mailroom.port, answer, rcpts=[f"scout@{DOMAIN}"])
    assert said.code == 250 and f"{SCOUT_VAULT}#3" in said.text
    await mailroom.embedded.settle()
    quiet = await mails.mail_at(store, SCOUT_VAULT, 3)
    assert quiet is not None and quiet.hops == 5 and quiet.state == "quiet"
    assert label_names(await mailroom.person("marco").issue(SCOUT_VAULT, 3)) == []
    [guard] = await _events(mailroom, "mail.loop_guard")
    assert guard.subject == f"{SCOUT_VAULT}#3" and "hops" in guard.data["reason"]
    assert len(await _events(mailroom, "run.queued")) == 1, "the first mail's run only"


async def test_a_reply_deferred_past_the_give_up_time_bounces_each_event_ledgered_once(
        mailroom: Mailroom) -> None:
    raw = wire(message("Bob <bob@example.org>", f"scout@{DOMAIN}", "Prices", "EU prices?",
                       Message_ID="<m1@example.org>"))
    assert (await send(mailroom.port, raw, rcpts=[f"scout@{DOMAIN}"])).code == 250
    assert (await send(mailroom.port, raw, rcpts=[f"scout@{DOMAIN}"])).code == 250
    held = wire(message("eve@other.example", f"builder@{DOMAIN}", "Offer", "Buy now.",
                        Message_ID="<h1@other.example>"))
    assert (await send(mailroom.port, held, rcpts=[f"builder@{DOMAIN}"])).code == 250
    await mailroom.embedded.settle()
    assert len(await _events(mailroom, "email.received")) == 2, "once per message"
    [hold] = await _events(mailroom, "email.held")
    assert hold.subject == "acme/builder-vault#1" and "example.org" in hold.data["reason"]

    outbox = mailroom.embedded.runner.app[GATEWAY_KEY].outbox
    assert outbox is not None
    outbox.give_up_after = 0.0  # the first deferral is past it
    mailroom.relay.refuse.extend(["451 4.3.0 busy, later"] * 20)
    await mailroom.tools("agent:scout")("mail_reply", mail=f"{SCOUT_VAULT}#1", body="Soon.")
    await mailroom.outbox_settled()
    await mailroom.embedded.settle()
    mailroom.relay.refuse.clear()
    assert await mailroom.outbox_settled() == 0 and mailroom.relay.received.empty()
    [deferred] = await _events(mailroom, "email.deferred")
    assert "451" in deferred.data["detail"]
    [bounced] = await _events(mailroom, "email.bounced")
    assert bounced.data["message_id"] == deferred.data["message_id"]
    assert "gave up" in bounced.data["why"]
    store = mailroom.embedded.services.store
    told = [m for m in await mails.all_mails(store) if m.subject.startswith("Undelivered")]
    assert len(told) == 1 and told[0].to_principal == "agent:scout"
    assert await _events(mailroom, "email.sent") == []
    notes = [c["body"] for c in await mailroom.person("marco").comments(SCOUT_VAULT, 1)]
    assert sum(n.startswith("⏳ Deferred") for n in notes) == 1
    assert sum(n.startswith("📭") and "gave up" in n for n in notes) == 1


async def test_mail_to_an_archived_vault_or_an_agent_that_left_bounces_naming_why(
        mailroom: Mailroom) -> None:
    """Internal bounces: mail to an agent whose vault is archived (GitHub: the repository
    PATCHed `archived: true`, every write then 403) or that has left the office answers its
    sender why; an agent sender gets an "Undelivered" mail in its vault too, once."""
    from bot.mail.mailer import Mailer

    emb = mailroom.embedded
    store = emb.services.store
    await mailroom.person("admin").call("PATCH", "/repos/acme/builder-vault",
                                        {"archived": True}, expect=200)
    # by email: refused for good (550) naming why, rather than 451 for ever
    raw = wire(message("bob@example.org", f"builder@{DOMAIN}", "Spec", "the spec"))
    answer = await send(mailroom.port, raw, rcpts=[f"builder@{DOMAIN}"])
    assert answer.code == 550 and "acme/builder-vault is archived" in answer.text
    # an agent: the refusal, and the bounce in its own vault, once however often it tries
    scout = mailroom.tools("agent:scout")
    for _ in range(2):
        status, body = await scout.raw("mail_send", {"to": "builder", "subject": "Review",
                                                     "body": "please", "idempotencyKey": "r1"})
        assert status == 409 and body["error"]["code"] == "undeliverable"
        assert "acme/builder-vault is archived" in body["error"]["message"]
    [bounce] = [m for m in await mails.all_mails(store) if m.subject == "Undelivered: Review"]
    assert bounce.vault == SCOUT_VAULT and bounce.from_principal == "office"
    assert "was not delivered: its vault acme/builder-vault is archived" in bounce.body
    assert f"the bounce is {bounce.ref}" in body["error"]["message"]
    # a person: the refusal says why
    status, body = await mailroom.tools("human:marco@acme.com").raw(
        "mail_send", {"to": "builder", "subject": "Hi", "body": "x"})
    assert status == 409 and "acme/builder-vault is archived" in body["error"]["message"]
    assert [m.subject for m in await mails.all_mails(store)] == ["Undelivered: Review"]
    assert len(await _events(mailroom, "mail.bounced")) == 3

    # builder leaves the office: scout's reply to builder's mail goes on the thread, and its
    # copy, which has nowhere to go, comes back to scout as a bounce naming why
    await mailroom.person("admin").call("PATCH", "/repos/acme/builder-vault",
                                        {"archived": False}, expect=200)
    asked = await mailroom.tools("agent:builder")("mail_send", to="scout", subject="Q",
                                                  body="a question")
    mail = await mails.get_mail(store, asked["mail"]["mail_id"])
    assert mail is not None
    office = emb.office.model_copy(
        update={"agents": [a for a in emb.office.agents if a.slug != "builder"]})
    assert office.agent("builder") is None
    mailer = Mailer(emb.services, emb.services.forge_for_org("acme"), office)
    replied = await mailer.reply(mail, "agent:scout", "an answer", posted=False, key="k1")
    assert replied.state == "mail:replied"
    [left] = [m for m in await mails.all_mails(store) if m.subject == "Undelivered: Re: Q"]
    assert left.vault == SCOUT_VAULT and "agent:builder has left the office" in left.body
    assert left.in_reply_to == mail.ref
