"""Seed mail.md, the loop guard: "Beyond 3 hops, the notification is still delivered, but
without mail:new, so it doesn't start a run: the agent sees it on its next run."

Issue 26: the next run carried only its own mail, nothing of the quiet one waiting, and the
example agent never looked. Each run's payload now names what waits for the agent (`waiting`:
quiet mail, mail still new, unread comments, questions whose turn is its), and `echo` (the
example office's local agent, `dispatch: command`) reads it."""

from __future__ import annotations

from typing import Any

from bot.app.embedded import Embedded
from tests.items_support import MARCO, make_item

ECHO = "acme/echo-vault"


async def test_past_the_loop_guard_the_agent_sees_it_on_its_next_run(
        embedded: Embedded, tools: Any, person: Any) -> None:
    builder, scout = tools("agent:builder"), tools("agent:scout")
    mail = (await builder("mail_send", to="scout", subject="Ping", body="ping"))["mail"]
    for hop, (speaker, to) in enumerate([(scout, "builder"), (builder, "scout"),
                                         (scout, "builder")], start=1):
        mail = (await speaker("mail_send", to=to, subject="Re: Ping", body=f"pong {hop}",
                              inReplyTo=mail["ref"]))["mail"]
    quiet = (await scout("mail_send", to="echo", subject="Loop", body="over to you",
                         inReplyTo=mail["ref"]))["mail"]
    assert (quiet["hops"], quiet["state"]) == (4, "quiet")
    await embedded.settle()
    assert await embedded.ledger_events("run.finished") == [], "the quiet mail starts no run"

    # a question for echo on an outcome it holds: its turn, and a comment it has not seen
    outcome = await make_item(embedded, person("marco"), "outcome", "Echo test",
                              assignees=["echo-bot"], repo=ECHO)
    await tools(MARCO)("add_comment", targetType="outcome", target=outcome, header="Ready",
                       body="Are you ready?", needsReply=True, to=["agent"])

    sent = (await tools(MARCO)("mail_send", to="echo", subject="Hello",
                               body="Anything else on your desk?"))["mail"]
    await embedded.settle()
    [finished] = await embedded.ledger_events("run.finished")
    assert finished.subject == sent["ref"] and finished.data["exit"] == 0, finished.data
    [reply] = await person("admin").comments(ECHO, sent["number"])
    [also] = [p for p in reply["body"].split("\n\n") if p.startswith("Also waiting")]
    assert also.startswith("Also waiting for me: 1 quiet mail(s) held by the loop guard: "
                           f"{quiet['ref']} (“Loop”, 4 hops)"), reply["body"]
    assert "1 unread comment(s)" in also and "1 question(s) where it is my turn" in also
    assert "other new mail" not in also, "the run's own mail is not counted as waiting"
    assert also in finished.data["stdout"]
    # naming them handled nothing: the quiet mail and the question wait for the agent still
    echo = tools("agent:echo")
    waiting = (await echo("mail_list"))["inbox"]["mail"]
    assert [m["ref"] for m in waiting if m["state"] == "quiet"] == [quiet["ref"]]
    inbox = await echo("list_inbox")
    assert len(inbox["agents"]["yourTurn"]) == 1


async def test_a_run_counts_nothing_waiting_on_an_item_the_agent_cannot_see(
        embedded: Embedded, tools: Any, person: Any) -> None:
    """builder and echo share sara's agents box; a comment for builder on an outcome in
    acme/builds, which echo-bot may not read, is not echo's to see: its list_inbox leaves it
    out, and so does the count its run's payload carries (`waiting.unread`)."""
    embedded.forge.add_repo("acme", "builds")
    embedded.forge.set_permission("acme/builds", "marco", "admin")
    embedded.forge.set_permission("acme/builds", "builder-bot", "write")
    outcome = await make_item(embedded, person("marco"), "outcome", "Build farm",
                              repo="acme/builds")
    await tools(MARCO)("add_comment", targetType="outcome", target=outcome,
                       to=["agent:builder"], body="Please build it")
    assert (await tools("agent:echo")("list_inbox", markRead=False))["agents"]["unread"] == []
    sent = (await tools(MARCO)("mail_send", to="echo", subject="Hello",
                               body="Anything else on your desk?"))["mail"]
    await embedded.settle()
    [finished] = await embedded.ledger_events("run.finished")
    assert finished.subject == sent["ref"] and finished.data["exit"] == 0, finished.data
    [reply] = await person("admin").comments(ECHO, sent["number"])
    assert "unread comment" not in reply["body"], reply["body"]
