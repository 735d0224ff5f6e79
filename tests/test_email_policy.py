"""Outside senders held to each agent's policy: pure decisions, then over real SMTP."""

from __future__ import annotations

import asyncio
import smtplib

import pytest
import yaml

from bot.email.auth import Verdicts
from bot.email.keys import comment_key
from bot.email.message import parse_inbound
from bot.email.policy import SenderRate, decide
from bot.mail.reindex import reindex
from bot.office.config import load_office
from bot.store import ledger, mails
from tests.support import label_names
from tests.test_email_support import (
    DOMAIN,
    Mailroom,
    Sender,
    delivered,
    mailroom,
    message,
    send,
    wire,
)

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
    # DMARC not learned (a lookup failed) is no better than a fail where nothing proves the
    # From (the listener answers it 451 first); proven, no record is needed
    unlearned = decide(office, agent["scout"], marco, _verdicts(aligned=False,
                                                                dmarc="temperror"))
    assert unlearned.held and "DMARC" in (unlearned.reason or "")
    assert decide(office, agent["scout"], stranger,
                  _verdicts(aligned=True, dmarc="temperror")).action == "deliver"
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
    assert label_names(first) == ["mail:held"] and label_names(second) == ["mail:new"]
    [note] = await sara.comments("acme/builder-vault", 1)
    assert note["body"].startswith("@sara this mail is held for you")
    assert "giving it the label `mail:new`" in note["body"], "as GitHub vaults spell it"
    store = mailroom.embedded.services.store
    assert len(await mails.all_mails(store)) == 2
    [queued] = await ledger.entries(store, event="run.queued")
    assert queued.subject == "acme/builder-vault#2"
    held_mail = await mails.mail_at(store, "acme/builder-vault", 1)
    assert held_mail is not None and held_mail.state == "mail:held"
    # held is no mail for builder to handle (no run, not in its inbox): its person's turn
    waiting, _ = await mails.to_handle(store, "agent:builder", org="acme")
    assert [m.ref for m in waiting] == ["acme/builder-vault#2"]
    builder = mailroom.tools("agent:builder")
    listed = await builder("mail_list", state="held")
    assert [m["ref"] for m in listed["mails"]] == ["acme/builder-vault#1"]
    # the index is the forge's to rebuild: held comes back from the label
    emb = mailroom.embedded
    live = await mails.all_mails(store)
    await mails.replace_all(store, [])
    await reindex(store, emb.services.forge_for_org("acme"), emb.office, emb.services.keyring,
                  app_login=emb.services.bot_login,
                  comment_key=comment_key(emb.services.settings.data_dir, "acme"))
    assert await mails.all_mails(store) == live
    # a person cannot hold mail by hand: only the office holds mail, as it arrives
    await sara.call("POST", "/repos/acme/builder-vault/issues/2/labels",
                    {"labels": ["mail:held"]}, expect=200)
    await mailroom.embedded.settle()
    assert label_names(await sara.issue("acme/builder-vault", 2)) == ["mail:new"]

    # sara releases the held mail to builder, as the note says: the label mail:new
    await sara.call("POST", "/repos/acme/builder-vault/issues/1/labels",
                    {"labels": ["mail:new"]}, expect=200)
    await mailroom.embedded.settle()
    released = await mails.mail_at(store, "acme/builder-vault", 1)
    assert released is not None and released.state == "mail:new"
    [held_entry] = await ledger.entries(store, event="email.held")
    [released_entry] = await ledger.entries(store, event="email.released")
    assert held_entry.subject == released_entry.subject == "acme/builder-vault#1"
    assert released_entry.actor == "human:sara@acme.com"


async def test_the_held_queue_shows_the_verdicts_and_releases_or_drops(
        mailroom: Mailroom) -> None:
    """The console's held queue (/console/held): sara sees the mail held for builder with its
    SPF, DKIM and DMARC verdicts; Release gives one to builder (a run), Drop closes another."""
    Sender("other.example", mailroom.dns).publish()
    for n in (1, 2):
        raw = wire(message("eve@other.example", f"builder@{DOMAIN}", f"Offer {n}", "cheap!",
                           Message_ID=f"<offer{n}@other.example>"))
        assert (await send(mailroom.port, raw, rcpts=[f"builder@{DOMAIN}"],
                           mail_from="eve@other.example")).code == 250
    await mailroom.embedded.settle()
    emb, session = mailroom.embedded, mailroom.session
    store = emb.services.store

    async def console(method: str, path: str, who: str, form: dict[str, str] | None = None
                      ) -> tuple[int, str]:
        async with session.request(method, emb.app_url + path, data=form,
                                   allow_redirects=False, headers={
                                       "Authorization": f"Bearer {emb.api_tokens[who]}"}) as r:
            return r.status, await r.text()

    status, page = await console("GET", "/console/held", "human:sara@acme.com")
    assert status == 200 and "Offer 1" in page and "Offer 2" in page
    assert "eve@other.example" in page and 'verdict-pass">pass' in page  # SPF, DKIM, DMARC
    # on every page of her console, beside Held, how much waits for her there
    status, mail_page = await console("GET", "/console/mail", "human:sara@acme.com")
    assert status == 200 and 'aria-label="2 held for you"' in mail_page
    status, mail_page = await console("GET", "/console/mail", "human:lee@acme.com")
    assert status == 200 and "held for you" not in mail_page
    status, page = await console("GET", "/console/held", "human:lee@acme.com")
    assert status == 200 and "No mail is held for you" in page
    first = await mails.mail_at(store, "acme/builder-vault", 1)
    second = await mails.mail_at(store, "acme/builder-vault", 2)
    assert first is not None and second is not None
    status, _ = await console("POST", "/console/held/release", "human:lee@acme.com",
                              {"mail": first.mail_id})
    assert status == 404, "lee, no editor nor builder's person, is not even shown it"
    status, _ = await console("POST", "/console/held/release", "human:sara@acme.com",
                              {"mail": first.mail_id})
    assert status == 303
    status, _ = await console("POST", "/console/held/drop", "human:sara@acme.com",
                              {"mail": second.mail_id})
    assert status == 303
    await emb.settle()
    released = await mails.mail_at(store, "acme/builder-vault", 1)
    dropped = await mails.mail_at(store, "acme/builder-vault", 2)
    assert released is not None and released.state == "mail:new"
    assert dropped is not None and dropped.state == "mail:closed"
    [queued] = await ledger.entries(store, event="run.queued")
    assert queued.subject == "acme/builder-vault#1"
    [entry] = await ledger.entries(store, event="email.released")
    assert entry.actor == "human:sara@acme.com" and entry.subject == "acme/builder-vault#1"
    status, page = await console("GET", "/console/held", "human:sara@acme.com")
    assert "No mail is held for you" in page and "held for you\"" not in page


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


async def test_a_message_to_an_agent_that_refuses_it_and_one_that_takes_it_loses_neither(
        mailroom: Mailroom) -> None:
    """eve, outside the office, writes to scout (anyone) and critic (the office only) in one
    message. The answer to DATA is every recipient's (RFC 5321): it was 250, so eve's server
    took critic's copy as delivered, and critic's refusal was said only in the 250's text,
    which no mail server reads (found by review). critic now waits for a message of its own
    (452 at RCPT, which a server tries again alone), and there it is refused 550 with why."""
    Sender("other.example", mailroom.dns).publish()
    both = wire(message("eve@other.example", f"scout@{DOMAIN}", "Hi", "both of you",
                        Cc=f"critic@{DOMAIN}"))
    answer = await send(mailroom.port, both, rcpts=[f"scout@{DOMAIN}", f"critic@{DOMAIN}"],
                        mail_from="eve@other.example")
    assert answer.code == 250 and "refused" not in answer.text, answer
    assert set(answer.refused) == {f"critic@{DOMAIN}"}, answer
    code, said = answer.refused[f"critic@{DOMAIN}"]
    assert code == 452 and b"4.5.3" in said and b"of its own" in said, said
    alone = await send(mailroom.port, both, rcpts=[f"critic@{DOMAIN}"],
                       mail_from="eve@other.example")
    assert alone.code == 550 and "critic takes email from the office only" in alone.text
    store = mailroom.embedded.services.store
    assert [m.to_principal for m in await mails.all_mails(store)] == ["agent:scout"]


async def test_a_message_to_an_archived_vault_and_one_that_takes_it_refuses_only_that_copy(
        mailroom: Mailroom) -> None:
    """Bob writes to scout and to echo, whose vault is archived. That was found only at DATA,
    which answered 250 '...; refused <echo@...>': the answer to DATA is every recipient's, so
    Bob's server counted echo's copy delivered and it was lost (found by review). The vault's
    state is known at RCPT: echo is refused there, 550, and scout's copy goes alone."""
    await mailroom.person("admin").call("PATCH", "/repos/acme/echo-vault",
                                        {"archived": True}, expect=200)
    raw = wire(message("bob@example.org", f"scout@{DOMAIN}", "Hi", "both of you",
                       Cc=f"echo@{DOMAIN}"))
    answer = await send(mailroom.port, raw, rcpts=[f"scout@{DOMAIN}", f"echo@{DOMAIN}"])
    assert answer.code == 250 and "refused" not in answer.text, answer
    assert set(answer.refused) == {f"echo@{DOMAIN}"}, answer
    code, said = answer.refused[f"echo@{DOMAIN}"]
    assert code == 550 and b"5.7.1" in said and b"takes no mail now" in said, said
    assert b"echo-vault" not in said  # a stranger learns no repository's name
    store = mailroom.embedded.services.store
    assert [m.to_principal for m in await mails.all_mails(store)] == ["agent:scout"]
    # the office is told, once however often a server asks
    assert (await send(mailroom.port, raw, rcpts=[f"echo@{DOMAIN}"])).code == 550
    [bounced] = await ledger.entries(store, event="mail.bounced")
    assert "acme/echo-vault is archived" in bounced.data["why"], bounced.data


def _open_transaction(port: int, rcpts: list[str]) -> smtplib.SMTP:
    """A client that has said MAIL and RCPT (each accepted) and not yet DATA."""
    client = smtplib.SMTP("127.0.0.1", port, timeout=60)
    client.ehlo("client.example.org")
    assert client.mail("bob@example.org")[0] == 250
    for rcpt in rcpts:
        assert client.rcpt(rcpt)[0] == 250, rcpt
    return client


def _data(client: smtplib.SMTP, raw: bytes) -> tuple[int, str]:
    try:
        code, text = client.data(raw)
        return code, text.decode()
    finally:
        client.quit()


@pytest.mark.parametrize("lost", ["archived", "left"])
async def test_a_recipient_lost_between_rcpt_and_data_is_refused_alone_and_nothing_is_lost(
        mailroom: Mailroom, lost: str) -> None:
    """Bob's server has named scout and echo at RCPT (both 250); before DATA, echo's vault is
    archived, or echo leaves the office. DATA answered 250 '...; refused <echo@...>' (echo's
    copy counted delivered and lost) or 550 for the whole message though scout's copy was
    delivered (Bob told it failed). DATA's answer is every recipient's: with one that can no
    longer take it, the message is 451 (not taken now), scout's copy kept; Bob's server
    sends it again, echo is refused at RCPT with why, and scout has it once."""
    emb = mailroom.embedded
    rcpts = [f"scout@{DOMAIN}", f"echo@{DOMAIN}"]
    raw = wire(message("bob@example.org", f"scout@{DOMAIN}", "Hi", "both of you",
                       Cc=f"echo@{DOMAIN}", Message_ID="<both@example.org>"))
    client = await asyncio.to_thread(_open_transaction, mailroom.port, rcpts)
    if lost == "archived":
        await mailroom.person("admin").call("PATCH", "/repos/acme/echo-vault",
                                            {"archived": True}, expect=200)
    else:
        repo = emb.forge.state.repo("acme", ".github")
        assert repo is not None
        config = yaml.safe_load(repo.files["vaultmail.yml"])
        config["agents"] = [a for a in config["agents"] if a["slug"] != "echo"]
        emb.forge.put_file("acme/.github", "vaultmail.yml", yaml.safe_dump(config),
                           pusher="admin")
        await emb.settle()
    code, text = await asyncio.to_thread(_data, client, raw)
    assert code == 451 and "4.3.0" in text and f"echo@{DOMAIN}" in text, (code, text)
    again = await send(mailroom.port, raw, rcpts=rcpts)
    assert again.code == 250 and "refused" not in again.text, again
    assert set(again.refused) == {f"echo@{DOMAIN}"}, again
    assert again.refused[f"echo@{DOMAIN}"][0] == 550, again
    store = emb.services.store
    assert [m.to_principal for m in await mails.all_mails(store)] == ["agent:scout"]
    if lost == "archived":
        # the office is told once of echo's copy: DATA found the vault closed and ledgered
        # it, and the retry's RCPT found it again (two mail.bounced, keyed apart: found by
        # review). (echo, never mailed, is no departed agent the index knows: nothing told.)
        bounced = await ledger.entries(store, event="mail.bounced")
        assert [b.data["to"] for b in bounced] == ["agent:echo"], [b.data for b in bounced]


async def test_a_message_sent_again_after_a_451_is_charged_only_for_copies_not_delivered(
        mailroom: Mailroom) -> None:
    """Bob (authenticated; 5 a minute to one agent) has written scout 4 messages and echo 5.
    His message to both: scout's copy is delivered (scout's fifth), echo's is over the rate,
    451 for the whole message, scout's copy kept. His server sends it again: scout's copy
    was charged again, though it is delivered and costs nothing, and the retry was refused
    for scout (found by review); it is refused for echo alone, and scout has it once."""
    bob = Sender("example.net", mailroom.dns)
    bob.publish()
    scout, echo = f"scout@{DOMAIN}", f"echo@{DOMAIN}"
    for n, to in enumerate([scout] * 4 + [echo] * 5):
        raw = wire(message("bob@example.net", to, f"Note {n}", "x"))
        assert (await send(mailroom.port, raw, rcpts=[to],
                           mail_from="bob@example.net")).code == 250
    both = wire(message("bob@example.net", scout, "Both", "you two", Cc=echo,
                        Message_ID="<both@example.net>"))
    for _ in range(2):
        answer = await send(mailroom.port, both, rcpts=[scout, echo],
                            mail_from="bob@example.net")
        assert answer.code == 451 and f"to {echo}: at most 5 a minute" in answer.text, answer
    store = mailroom.embedded.services.store
    assert [m.subject for m in await mails.all_mails(store)
            if m.to_principal == "agent:scout"].count("Both") == 1


async def test_a_header_anyone_can_add_makes_mail_quieter_never_lets_it_in(
        mailroom: Mailroom) -> None:
    """Auto-Submitted, Precedence: bulk and List-* mark mail an automaton sent, and anyone
    can write them (believed unsigned: a list adds them after the author signed). decide()
    took them first, so a stranger critic refuses (it takes the office only) was refused
    550, and the same message with `Precedence: bulk` was delivered into critic's vault (250,
    quiet, not held); a message to builder from outside its policy (held) was delivered
    quiet and not held; and a forged From failing DMARC, with `Auto-Submitted`, was delivered
    quiet, not held (found by review). They only make a delivery quiet: what is refused or
    held without them is refused or held with them. And a policy's refusal comes before
    DMARC's hold: a forged From to critic was held, delivered, where an honest stranger's
    message is refused."""
    Sender("other.example", mailroom.dns).publish()
    bank = Sender("bank.example", mailroom.dns)
    bank.publish(spf="v=spf1 ip4:192.0.2.1 -all")  # (no loopback: a From it did not send)
    store = mailroom.embedded.services.store
    critic = f"critic@{DOMAIN}"
    for n, marks in enumerate(({"Precedence": "bulk"}, {"Auto_Submitted": "auto-generated"},
                               {"List_Id": "<news.other.example>"})):
        raw = wire(message("eve@other.example", critic, "Hi", "let me in",
                           Message_ID=f"<bulk-{n}@other.example>", **marks))
        answer = await send(mailroom.port, raw, rcpts=[critic], mail_from="eve@other.example")
        assert answer.code == 550 and "critic takes email from the office only" \
            in answer.text, (marks, answer)
    # a From failing DMARC is no less refused than one not authenticated: it was held (250),
    # in critic's vault, its person mentioned at a stranger's word (found with the above)
    forged = wire(message("ceo@bank.example", critic, "Wire it", "today",
                          Message_ID="<wire-critic@bank.example>"))
    answer = await send(mailroom.port, forged, rcpts=[critic], mail_from="ceo@bank.example")
    assert answer.code == 550 and "ceo@bank.example is not authenticated" in answer.text, answer
    assert [m for m in await mails.all_mails(store) if m.vault == "acme/critic-vault"] == []

    builder = wire(message("eve@other.example", f"builder@{DOMAIN}", "Offer", "cheap!",
                           Precedence="bulk", Message_ID="<offer@other.example>"))
    [held_ref] = await delivered(mailroom, await send(
        mailroom.port, builder, rcpts=[f"builder@{DOMAIN}"], mail_from="eve@other.example"))
    forged = wire(message("ceo@bank.example", f"scout@{DOMAIN}", "Wire it", "today",
                          Auto_Submitted="auto-generated", Message_ID="<wire@bank.example>"))
    [forged_ref] = await delivered(mailroom, await send(
        mailroom.port, forged, rcpts=[f"scout@{DOMAIN}"], mail_from="ceo@bank.example"))
    got = {m.ref: m for m in await mails.all_mails(store)}
    assert got[held_ref].state == got[forged_ref].state == "mail:held", got
    held = {e.subject: e.data["reason"] for e in await ledger.entries(store, event="email.held")}
    assert "builder takes email from" in held[held_ref], held
    assert "fails DMARC for bank.example" in held[forged_ref], held


async def test_a_copy_counted_over_a_day_ago_is_counted_again(mailroom: Mailroom) -> None:
    """A rate hit names the copy it counted, so that a message sent again after a 451 is
    not charged again; that memory is for a day (rates.MESSAGE_KEPT). But its lookup had no
    age bound, and a key's old hits went only once it was quiet a whole window: while bob
    kept writing scout, a copy counted a month ago was sent again free, past his rate, and
    his key's hits were never forgotten (found by review). Counted over a day ago, it is
    counted as new (451 past his rate), and a busy key's hits older than a day go as it
    counts."""
    bob = Sender("example.net", mailroom.dns)
    bob.publish()
    scout = f"scout@{DOMAIN}"
    store = mailroom.embedded.services.store
    old = wire(message("bob@example.net", scout, "Old", "x", Message_ID="<old@example.net>"))
    for raw in [old] + [wire(message("bob@example.net", scout, f"Note {n}", "x"))
                        for n in range(4)]:
        assert (await send(mailroom.port, raw, rcpts=[scout],
                           mail_from="bob@example.net")).code == 250
    # the old message was counted a month ago, by the index's clock (each key's first hit:
    # bob's and example.net's), and bob has written since without a quiet minute
    async with store.transaction() as db:
        await db.execute("UPDATE rate_hits SET at=at-? WHERE id IN (SELECT MIN(id) FROM"
                         " rate_hits GROUP BY key)", (30 * 86400.0,))
    assert (await send(mailroom.port, wire(message("bob@example.net", scout, "Note 4", "x")),
                       rcpts=[scout], mail_from="bob@example.net")).code == 250
    row = await store.fetchone("SELECT COUNT(*) FROM rate_hits WHERE at<vm_now()-86400")
    assert row is not None and int(row[0]) == 0, "a busy key's month-old hits are gone"
    answer = await send(mailroom.port, old, rcpts=[scout], mail_from="bob@example.net")
    assert answer.code == 451 and f"to {scout}: at most 5 a minute" in answer.text, answer
