"""Mail end to end on the local forge: people in the forge, agents through the tools."""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp

from bot.app.embedded import Embedded
from bot.mail.header import parse_mail_body
from bot.store import ledger, mails
from tests.support import Actor, ToolClient, label_names
from tests.test_exactly_once import forge_delivery, replay_under_new_id, short_forge_retries

SCOUT_VAULT = "acme/scout-vault"
BUILDER_VAULT = "acme/builder-vault"
ISSUE = "/repos/{owner}/{repo}/issues/{issue_number}"


async def events(embedded: Embedded, name: str) -> list[ledger.Entry]:
    return await ledger.entries(embedded.services.store, event=name)


async def test_a_person_mails_an_agent_by_opening_an_issue_in_its_vault(
        embedded: Embedded, person: Any) -> None:
    marco: Actor = person("marco")
    issue = await marco.open_issue(SCOUT_VAULT, "EU prices", "Can you check the EU prices?")
    await embedded.settle()
    found = await marco.issue(SCOUT_VAULT, issue["number"])
    assert label_names(found) == ["mail:new"]
    header, body = parse_mail_body(found["body"])
    assert header is not None and header.from_principal == "human:marco@acme.com"
    assert header.to_principal == "agent:scout" and body == "Can you check the EU prices?"
    assert "From" in found["body"] and "human:marco@acme.com" in found["body"]
    [sent] = await events(embedded, "mail.sent")
    assert sent.actor == "human:marco@acme.com" and sent.subject == f"{SCOUT_VAULT}#1"
    [queued] = await events(embedded, "run.queued")
    assert queued.data["agent"] == "agent:scout" and queued.data["kind"] == "mail"


async def test_a_person_without_mail_send_is_refused_with_a_reason(
        embedded: Embedded, person: Any) -> None:
    lee: Actor = person("lee")
    issue = await lee.open_issue(SCOUT_VAULT, "Hello", "Can I mail?")
    await embedded.settle()
    found = await lee.issue(SCOUT_VAULT, issue["number"])
    assert found["state"] == "closed" and label_names(found) == []
    [note] = await lee.comments(SCOUT_VAULT, issue["number"])
    assert "mail.send" in note["body"] and "@lee" in note["body"]
    [denied] = await events(embedded, "run.denied")
    assert denied.actor == "human:lee@acme.com"
    assert await mails.all_mails(embedded.services.store) == []


async def test_agent_allow_lists_are_enforced_both_ways(embedded: Embedded, tools: Any,
                                                        person: Any) -> None:
    builder: ToolClient = tools("agent:builder")
    scout: ToolClient = tools("agent:scout")
    ok = await builder("mail_send", to="scout", subject="Spec", body="Spec attached")
    assert ok["mail"]["vault"] == SCOUT_VAULT and ok["mail"]["from_principal"] == "agent:builder"
    status, refused = await builder.raw("mail_send", {"to": "critic", "subject": "Hi", "body": "x"})
    assert status == 403 and "capabilities.mail.send" in refused["error"]["message"]
    back = await scout("mail_send", to="agent:builder", subject="Question", body="Which spec?")
    assert back["mail"]["vault"] == BUILDER_VAULT
    status, refused = await tools("agent:critic").raw(
        "mail_send", {"to": "scout", "subject": "Hi", "body": "x"})
    assert status == 403
    denied = await events(embedded, "run.denied")
    assert [d.actor for d in denied] == ["agent:builder", "agent:critic"]
    critic_vault = await person("admin").issues("acme/critic-vault")
    assert critic_vault == [], "a refused send leaves nothing on the forge"


async def test_unknown_recipient_error_names_the_known_agents(tools: Any) -> None:
    status, body = await tools("agent:scout").raw(
        "mail_send", {"to": "nobody", "subject": "x", "body": "y"})
    assert status == 404
    assert "scout" in body["error"]["message"] and "builder" in body["error"]["message"]


async def test_reply_is_copied_into_the_agent_senders_vault_with_hops(
        embedded: Embedded, tools: Any, person: Any) -> None:
    builder: ToolClient = tools("agent:builder")
    sent = (await builder("mail_send", to="scout", subject="Spec", body="Spec v1"))["mail"]
    scout_bot: Actor = person("scout-bot")
    await scout_bot.comment(SCOUT_VAULT, sent["number"], "Looks good, one question below.")
    await embedded.settle()
    original = await scout_bot.issue(SCOUT_VAULT, sent["number"])
    assert label_names(original) == ["mail:replied"]
    [copy] = await person("admin").issues(BUILDER_VAULT)
    header, body = parse_mail_body(copy["body"])
    assert header is not None
    assert header.in_reply_to == f"{SCOUT_VAULT}#{sent['number']}"
    assert header.hops == 1 and header.thread_id == sent["thread_id"]
    assert header.from_principal == "agent:scout" and body.startswith("Looks good")
    assert copy["title"] == "Re: Spec" and label_names(copy) == ["mail:new"]
    inbox = (await builder("mail_list"))["inbox"]["mail"]
    assert [m["ref"] for m in inbox] == [f"{BUILDER_VAULT}#{copy['number']}"]
    # "so it wakes up to read it": the copy queued a run of builder for itself
    woken = [e for e in await events(embedded, "run.queued")
             if e.data["agent"] == "agent:builder"]
    assert [(e.subject, e.data["kind"]) for e in woken] == [
        (f"{BUILDER_VAULT}#{copy['number']}", "mail")]


async def test_a_reply_and_close_in_one_comment_replies_then_closes_once(
        embedded: Embedded, tools: Any, person: Any,
        session: aiohttp.ClientSession) -> None:
    """Acted out (review r6): scout-bot's "The answer is 42.\n\n/close" closed the mail, and
    that was all: no `mail.replied`, no copy in builder's vault, nothing in its inbox. The
    recipient's words beside its `/close` are its reply, copied, and then the mail is closed;
    a delivery retried (its close landed, but answered 502) and one replayed after it do each
    once."""
    builder: ToolClient = tools("agent:builder")
    sent = (await builder("mail_send", to="scout", subject="Spec",
                          body="What is the answer?"))["mail"]
    await embedded.settle()
    short_forge_retries(embedded, attempts=1)
    embedded.worker.base_backoff = 0.05
    faults = embedded.forge.faults
    copying = faults.hold("POST /repos/{owner}/{repo}/issues", repo=BUILDER_VAULT)
    await person("scout-bot").comment(SCOUT_VAULT, sent["number"], "The answer is 42.\n\n/close")
    settled = asyncio.ensure_future(embedded.settle())  # (done only if no copy is made)
    await asyncio.wait([settled, asyncio.ensure_future(copying.arrived.wait())],
                       return_when=asyncio.FIRST_COMPLETED)
    assert copying.arrived.is_set(), "the reply written with /close never reached builder"
    # replied on the mail, its copy on the way: the next write on the mail is the close
    closing = faults.add("PATCH " + ISSUE, mode="after", count=1, repo=SCOUT_VAULT)
    copying.release()
    await settled
    assert closing.fired == 1, "the close landed, answered 502, and the delivery ran again"
    reply = forge_delivery(embedded, "issue_comment", "created",
                           lambda p: p["comment"]["user"]["login"] == "scout-bot")
    await replay_under_new_id(embedded, session, "issue_comment", reply)
    original = await person("admin").issue(SCOUT_VAULT, sent["number"])
    assert original["state"] == "closed" and label_names(original) == ["mail:closed"]
    moves = [(e.event, e.data["to"]) for e in await ledger.entries(embedded.services.store)
             if e.subject == sent["ref"] and e.event in ("mail.replied", "mail.closed")]
    assert moves == [("mail.replied", "mail:replied"), ("mail.closed", "mail:closed")], moves
    [copy] = await person("admin").issues(BUILDER_VAULT)
    assert copy["title"] == "Re: Spec" and label_names(copy) == ["mail:new"]
    assert parse_mail_body(copy["body"])[1] == "The answer is 42.", "the words, not /close"
    inbox = (await builder("mail_list"))["inbox"]["mail"]
    assert [m["ref"] for m in inbox] == [f"{BUILDER_VAULT}#{copy['number']}"]



async def test_a_reply_then_a_close_through_the_tools_copies_then_closes(
        embedded: Embedded, tools: Any, person: Any) -> None:
    """The tool path of a reply and a close (mail_reply, then mail_close): the same order."""
    builder, scout = tools("agent:builder"), tools("agent:scout")
    sent = (await builder("mail_send", to="scout", subject="Spec", body="Answer?"))["mail"]
    await scout("mail_reply", mail=sent["ref"], body="42.")
    assert (await scout("mail_close", mail=sent["ref"]))["mail"]["state"] == "mail:closed"
    await embedded.settle()
    moves = [e.event for e in await ledger.entries(embedded.services.store)
             if e.subject == sent["ref"] and e.event in ("mail.replied", "mail.closed")]
    assert moves == ["mail.replied", "mail.closed"], moves
    [copy] = await person("admin").issues(BUILDER_VAULT)
    assert parse_mail_body(copy["body"])[1] == "42." and label_names(copy) == ["mail:new"]


async def test_the_fourth_hop_is_delivered_quietly_with_loop_guard(
        embedded: Embedded, tools: Any, person: Any) -> None:
    builder, scout = tools("agent:builder"), tools("agent:scout")
    mail = (await builder("mail_send", to="scout", subject="Ping", body="ping 0"))["mail"]
    speakers = [scout, builder, scout, builder]
    for hop, speaker in enumerate(speakers, start=1):
        await speaker("mail_reply", mail=mail["ref"], body=f"pong {hop}")
        await embedded.settle()
        [mail] = [m for m in (await speaker("mail_list"))["mails"]
                  if m["hops"] == hop]
    assert mail["hops"] == 4 and mail["state"] == "quiet"
    issue = await person("admin").issue(mail["vault"], mail["number"])
    assert label_names(issue) == []
    [guard] = await events(embedded, "mail.loop_guard")
    assert guard.data["hops"] == 4
    queued = await events(embedded, "run.queued")
    assert len(queued) == 4, "hops 0..3 start runs; the fourth hop does not"
    inbox = (await scout("mail_list"))["inbox"]["mail"]
    assert mail["ref"] in [m["ref"] for m in inbox], "the quiet mail waits in the inbox"


async def test_admission_is_refused_for_an_agent_without_the_mail_trigger(
        embedded: Embedded, tools: Any) -> None:
    sent = await tools("human:marco@acme.com")("mail_send", to="critic", subject="Review",
                                               body="Please review")
    assert sent["mail"]["state"] == "mail:new"
    [refused] = await events(embedded, "run.refused")
    assert refused.data["agent"] == "agent:critic" and "run.triggers" in refused.data["reason"]
    assert await events(embedded, "run.queued") == []


async def test_open_reply_close_through_the_tools(embedded: Embedded, tools: Any,
                                                  person: Any) -> None:
    marco, scout = tools("human:marco@acme.com"), tools("agent:scout")
    mail = (await marco("mail_send", to="scout", subject="Audit", body="Audit the logs"))["mail"]
    assert (await scout("mail_open", mail=mail["ref"]))["mail"]["state"] == "mail:working"
    replied = await scout("mail_reply", mail=mail["mail_id"], body="Done: nothing odd")
    assert replied["mail"]["state"] == "mail:replied"
    # the thread is the issue's ordinary comments: on the forge, and in mail_get
    on_forge = [c["body"] for c in await person("marco").comments(SCOUT_VAULT, mail["number"])]
    assert any("Done: nothing odd" in b for b in on_forge), on_forge
    read = await marco("mail_get", mail=mail["ref"])
    assert [c["body"] for c in read["comments"]] == on_forge
    closed = await marco("mail_close", mail=mail["ref"])
    assert closed["mail"]["state"] == "mail:closed"
    issue = await person("admin").issue(SCOUT_VAULT, mail["number"])
    assert issue["state"] == "closed" and label_names(issue) == ["mail:closed"]
    await embedded.settle()
    # a new message on a closed mail reopens it as new
    await person("marco").comment(SCOUT_VAULT, mail["number"], "One more thing")
    await embedded.settle()
    issue = await person("admin").issue(SCOUT_VAULT, mail["number"])
    assert issue["state"] == "open" and label_names(issue) == ["mail:new"]
    read = await scout("mail_get", mail=mail["ref"])
    assert [c["author"] for c in read["comments"]][-1] == "marco"
    assert read["comments"][-1]["body"] == "One more thing"
    names = [e.event for e in await ledger.entries(embedded.services.store)]
    for name in ("mail.sent", "mail.opened", "mail.replied", "mail.closed"):
        assert name in names
    assert await ledger.verify_chain(embedded.services.store) is None


async def test_working_and_close_commands_in_the_forge(embedded: Embedded,
                                                       person: Any) -> None:
    marco, scout_bot = person("marco"), person("scout-bot")
    issue = await marco.open_issue(SCOUT_VAULT, "Logs", "Rotate the logs")
    await embedded.settle()
    await scout_bot.comment(SCOUT_VAULT, issue["number"], "/working")
    await embedded.settle()
    assert label_names(await marco.issue(SCOUT_VAULT, issue["number"])) == ["mail:working"]
    await marco.comment(SCOUT_VAULT, issue["number"], "/close")
    await embedded.settle()
    found = await marco.issue(SCOUT_VAULT, issue["number"])
    assert found["state"] == "closed" and label_names(found) == ["mail:closed"]


async def test_an_illegal_hand_made_label_change_is_undone_with_a_note(
        embedded: Embedded, person: Any) -> None:
    marco = person("marco")
    issue = await marco.open_issue(SCOUT_VAULT, "Logs", "Rotate the logs")
    await embedded.settle()
    n = issue["number"]
    await marco.call("PUT", f"/repos/{SCOUT_VAULT}/issues/{n}/labels",
                     {"labels": ["mail:replied"]}, expect=200)
    await embedded.settle()
    assert label_names(await marco.issue(SCOUT_VAULT, n)) == ["mail:replied"]
    await marco.call("PUT", f"/repos/{SCOUT_VAULT}/issues/{n}/labels",
                     {"labels": ["mail:working"]}, expect=200)
    await embedded.settle()
    assert label_names(await marco.issue(SCOUT_VAULT, n)) == ["mail:replied"]
    notes = [c["body"] for c in await marco.comments(SCOUT_VAULT, n)]
    assert any("undone" in b and "mail:replied cannot go to mail:working" in b for b in notes)


async def test_slash_mail_command_sends_from_the_commenter(embedded: Embedded,
                                                           person: Any) -> None:
    sara = person("sara")
    issue = await sara.open_issue("acme/builder-vault", "Pricing", "Let's talk pricing")
    await embedded.settle()
    await sara.comment("acme/builder-vault", issue["number"],
                       "/mail scout Competitor prices\nPlease list competitor prices.")
    await embedded.settle()
    [mail] = await person("admin").issues(SCOUT_VAULT)
    header, body = parse_mail_body(mail["body"])
    assert header is not None and header.from_principal == "human:sara@acme.com"
    assert mail["title"] == "Competitor prices" and body == "Please list competitor prices."


async def test_two_mail_commands_in_one_comment_send_two_mails(embedded: Embedded,
                                                               person: Any) -> None:
    sara = person("sara")
    issue = await sara.open_issue("acme/builder-vault", "Plans", "Planning notes")
    await embedded.settle()
    await sara.comment("acme/builder-vault", issue["number"],
                       "/mail scout First\nOne.\n/mail scout Second\nTwo.")
    await embedded.settle()
    titles = sorted(i["title"] for i in await person("admin").issues(SCOUT_VAULT))
    assert titles == ["First", "Second"]


async def test_closing_by_label_swap_closes_the_issue(embedded: Embedded, person: Any) -> None:
    marco = person("marco")
    issue = await marco.open_issue(SCOUT_VAULT, "Done?", "Wrap up")
    await embedded.settle()
    n = issue["number"]
    await marco.call("PUT", f"/repos/{SCOUT_VAULT}/issues/{n}/labels",
                     {"labels": ["mail:closed"]}, expect=200)
    await embedded.settle()
    found = await marco.issue(SCOUT_VAULT, n)
    assert found["state"] == "closed" and label_names(found) == ["mail:closed"]
    [closed] = await events(embedded, "mail.closed")
    assert closed.actor == "human:marco@acme.com"


async def test_a_comment_from_outside_the_office_wakes_no_one(embedded: Embedded,
                                                              person: Any) -> None:
    marco, scout_bot = person("marco"), person("scout-bot")
    issue = await marco.open_issue(SCOUT_VAULT, "Numbers", "Q3?")
    await embedded.settle()
    await scout_bot.comment(SCOUT_VAULT, issue["number"], "Up 4%.")
    await embedded.settle()
    await person("admin").comment(SCOUT_VAULT, issue["number"], "ping from outside")
    await embedded.settle()
    assert label_names(await marco.issue(SCOUT_VAULT, issue["number"])) == ["mail:replied"]


async def test_mentions_in_a_sent_mail_ping_no_one(embedded: Embedded, tools: Any,
                                                   person: Any) -> None:
    sent = await tools("agent:builder")("mail_send", to="scout", subject="FYI",
                                        body="cc @lee and @acme/pricing, mail marco@acme.com")
    issue = await person("admin").issue(SCOUT_VAULT, sent["mail"]["number"])
    assert "@lee" not in issue["body"] and "@acme/pricing" not in issue["body"]
    assert "marco@acme.com" in issue["body"], "emails stay as they were"
    assert (await tools("agent:scout")("mail_get", mail=sent["mail"]["ref"]))["verified"]


async def test_a_quiet_copy_wakes_no_long_poll(embedded: Embedded, tools: Any) -> None:
    """Seed: the loop guard stops "two agents replying to each other" waking each other
    forever. A copy past the guard arrives quietly: it is in the agent's inbox for its next
    run, but it wakes no wait (issue 26: a `list_inbox` wait returned within a second, and an
    agent that polls started a run on it)."""
    from bot.store import mails

    builder, scout = tools("agent:builder"), tools("agent:scout")
    mail = (await builder("mail_send", to="scout", subject="Ping", body="ping 0"))["mail"]
    for hop, speaker in enumerate([scout, builder, scout], start=1):
        await speaker("mail_reply", mail=mail["ref"], body=f"pong {hop}")
        await embedded.settle()
        [mail] = [m for m in (await speaker("mail_list"))["mails"] if m["hops"] == hop]
    await scout("list_inbox")  # scout has been shown what it has
    notifier = embedded.services.notifier
    waiting = asyncio.create_task(notifier.wait_any(["agent:scout"], 60, org="acme"))
    await asyncio.sleep(0)  # registered, as list_inbox's wait registers before it looks
    assert notifier.waiting() == 1
    await builder("mail_reply", mail=mail["ref"], body="pong 4")  # hop 4: the quiet copy
    await embedded.settle()
    try:
        assert notifier.waiting() == 1, "the quiet copy woke scout's wait"
        store = embedded.services.store
        assert not await mails.has_unshown(store, "agent:scout", org="acme")
        quiet = [m for m in (await scout("mail_list"))["inbox"]["mail"] if m["state"] == "quiet"]
        assert len(quiet) == 1, "it waits in the inbox for the next run"
    finally:
        waiting.cancel()
