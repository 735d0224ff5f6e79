"""The seed's loop guard (mail.md) for agents that answer each other with `mail_send` +
`inReplyTo` (issue 26): "Two agents replying to each other could wake each other forever.
Each automatic reply notification carries a hops count. Beyond 3 hops, the notification is
still delivered, but without mail:new, so it doesn't start a run: the agent sees it on its next
run. The office ledgers mail.loop_guard when this happens."

Before issue 26 only the app's reply copy counted hops: agents answering each other with
`mail_send` ran round after round at hop 0, each one a run, and the guard never held."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml
from aiohttp import web

from bot.app import runs
from bot.app.egress import OutboundPolicy
from bot.app.embedded import Embedded, start_embedded
from bot.app.signed_post import check_signed_post
from bot.mail.reindex import mail_from_issue
from bot.mail.signing import PublicKeys
from bot.office.config import PYTHON
from bot.store import api_tokens, mails
from bot.store.mails import MailRecord
from tests.support import Actor, ToolClient, app_key, label_names

SCOUT, BUILDER = "acme/scout-vault", "acme/builder-vault"
MARCO = "human:marco@acme.com"
CREATE = "POST /repos/{owner}/{repo}/issues"


def quick_retries(emb: Embedded) -> None:
    """The app's forge client and its worker try again at once, as many times as before: a
    test that counts tries against a fault that keeps failing waits out no backoff (1, 2, 4,
    8 s for a create, from GitHub's advice; 1-3 s for a delivery's retry)."""
    forge = emb.services.forge_for(None)
    forge.config = dataclasses.replace(  # type: ignore[attr-defined]
        forge.config, backoff_base=0.01, backoff_max=0.05)  # type: ignore[attr-defined]
    emb.worker.base_backoff = 0.02


async def test_two_agents_replying_to_each_other_with_mail_send_could_wake_each_other_forever(
        embedded: Embedded, tools: Any, person: Any) -> None:
    """builder and scout answer each other's mail with `mail_send` + `inReplyTo`: each answer
    is one hop more than the mail it answers; past 3 hops it arrives quiet (no mail:new on the
    forge, no run, no wake-up of a wait) and `mail.loop_guard` is ledgered each time."""
    builder, scout = tools("agent:builder"), tools("agent:scout")
    mail = (await builder("mail_send", to="scout", subject="Ping", body="ping"))["mail"]
    assert mail["hops"] == 0
    await scout("list_inbox")  # scout has been shown what it has: a wait waits past it
    notifier = embedded.services.notifier
    sent: list[dict[str, Any]] = [mail]
    speakers = [(scout, "builder"), (builder, "scout")] * 3
    waiting = None
    try:
        for hop, (speaker, to) in enumerate(speakers[:5], start=1):
            if hop == 4:  # scout waits (list_inbox's long poll) as builder's hop 4 goes out
                await scout("list_inbox")
                waiting = asyncio.create_task(notifier.wait_any(["agent:scout"], 60, org="acme"))
                await asyncio.sleep(0)  # registered, as list_inbox's wait registers first
                assert notifier.waiting() == 1
            mail = (await speaker("mail_send", to=to, subject="Re: Ping", body=f"pong {hop}",
                                  inReplyTo=mail["ref"]))["mail"]
            await embedded.settle()
            sent.append(mail)
            if hop == 4:
                assert notifier.waiting() == 1, "the quiet mail woke scout's wait"
    finally:
        if waiting is not None:
            waiting.cancel()
    assert [(m["hops"], m["state"]) for m in sent] == [
        (0, "mail:new"), (1, "mail:new"), (2, "mail:new"), (3, "mail:new"),
        (4, "quiet"), (5, "quiet")]
    assert {m["thread_id"] for m in sent} == {sent[0]["thread_id"]}
    admin = person("admin")
    for m in sent[4:]:
        assert label_names(await admin.issue(m["vault"], m["number"])) == [], (
            "a quiet mail carries no mail:new on the forge")
    guards = await embedded.ledger_events("mail.loop_guard")
    assert [(g.subject, g.data["hops"]) for g in guards] == [
        (sent[4]["ref"], 4), (sent[5]["ref"], 5)], "ledgered each time the guard holds"
    queued = await embedded.ledger_events("run.queued")
    assert [q.subject for q in queued] == [m["ref"] for m in sent[:4]], (
        "hops 0..3 start runs; the quiet ones do not")
    # "the agent sees it on its next run": it waits in the inbox
    inbox = (await scout("mail_list"))["inbox"]["mail"]
    assert sent[4]["ref"] in [m["ref"] for m in inbox]


async def test_a_mail_a_person_writes_in_answer_to_a_quiet_mail_starts_at_hop_0(
        embedded: Embedded, tools: Any) -> None:
    """Only agents' answers climb: marco answering the quiet end of a deep thread writes
    a mail at hop 0 that wakes scout, and scout's answer to him is one hop on from there."""
    builder, scout = tools("agent:builder"), tools("agent:scout")
    mail = (await builder("mail_send", to="scout", subject="Ping", body="ping"))["mail"]
    for hop, (speaker, to) in enumerate([(scout, "builder"), (builder, "scout")] * 2, start=1):
        mail = (await speaker("mail_send", to=to, subject="Re: Ping", body=f"pong {hop}",
                              inReplyTo=mail["ref"]))["mail"]
    assert (mail["hops"], mail["state"], mail["vault"]) == (4, "quiet", SCOUT)
    mine = (await tools(MARCO)("mail_send", to="scout", subject="Where are we?",
                               body="Sum it up for me", inReplyTo=mail["ref"]))["mail"]
    assert (mine["hops"], mine["state"]) == (0, "mail:new")
    queued = await embedded.ledger_events("run.queued")
    assert queued[-1].subject == mine["ref"]
    answer = (await scout("mail_send", to="builder", subject="Summary", body="Done so far",
                          inReplyTo=mine["ref"]))["mail"]
    assert (answer["hops"], answer["state"], answer["vault"]) == (1, "mail:new", BUILDER)


async def test_two_agents_writing_on_the_mail_each_sent_the_other_stop_at_the_guard(
        embedded: Embedded, tools: Any, person: Any) -> None:
    """An agent's comment on a mail it sent hands the mail back to its recipient: a
    follow-up, which woke the recipient whatever had come before. builder writes on the mail
    it sent scout, scout on the one it sent builder, each time it is woken, neither answering:
    before, they woke each other forever. Each agent's follow-up counts a hop on its mail
    (only a person starts the count again); past 3 it stays on the issue, wakes no
    one, and `mail.loop_guard` is ledgered (found by review)."""
    builder, scout = tools("agent:builder"), tools("agent:scout")
    to_scout = (await builder("mail_send", to="scout", subject="Ping", body="ping"))["mail"]
    to_builder = (await scout("mail_send", to="builder", subject="Pong", body="pong"))["mail"]
    await embedded.settle()
    writers = {"builder": person("builder-bot"), "scout": person("scout-bot")}
    woken = []
    for round_ in range(1, 6):
        for agent, mail, recipient in (("builder", to_scout, scout),
                                       ("scout", to_builder, builder)):
            await recipient("mail_open", mail=mail["ref"])  # the recipient is at work on it
            await writers[agent].comment(mail["vault"], mail["number"], f"any news? {round_}")
            await embedded.settle()
            got = (await recipient("mail_get", mail=mail["ref"]))["mail"]
            woken.append(got["state"] == "mail:new")
    assert woken == [True] * 6 + [False] * 4, woken  # three follow-ups each, then quiet
    guards = await embedded.ledger_events("mail.loop_guard")
    assert [(g.subject, g.data["hops"], g.data["follow_up"]) for g in guards] == [
        (to_scout["ref"], 4, True), (to_builder["ref"], 4, True)] * 2  # held ones count not
    # a person's follow-up wakes scout, and starts the count again
    await person("marco").comment(to_scout["vault"], to_scout["number"], "Where are we?")
    await embedded.settle()
    assert (await scout("mail_get", mail=to_scout["ref"]))["mail"]["state"] == "mail:new"


async def test_an_agents_follow_up_retried_after_a_forge_failure_counts_once(
        embedded: Embedded, tools: Any, person: Any) -> None:
    """The follow-up's count is written with its move: a delivery retried after the forge
    failed its write counted again at each attempt, and a follow-up that never woke anyone
    could push the agent's next one past the guard (review)."""
    builder, scout = tools("agent:builder"), tools("agent:scout")
    sent = (await builder("mail_send", to="scout", subject="Ping", body="ping"))["mail"]
    await embedded.settle()
    await scout("mail_open", mail=sent["ref"])
    quick_retries(embedded)  # (what is counted is each try, not when it came)
    failing = embedded.forge.faults.add(
        route="PATCH /repos/{owner}/{repo}/issues/{issue_number}", status=502, count=4)
    await person("builder-bot").comment(sent["vault"], sent["number"], "any news?")
    await embedded.settle()
    assert failing.fired == 4  # (the client tries 3 times a delivery: the worker again)
    got = (await scout("mail_get", mail=sent["ref"]))["mail"]
    assert got["state"] == "mail:new", got
    row = await embedded.services.store.fetchone(
        "SELECT agent_turns FROM mails WHERE mail_id=?", (sent["mail_id"],))
    assert row is not None and row["agent_turns"] == 1, row


async def test_two_agents_reopening_the_mail_each_sent_the_other_stop_at_the_guard(
        embedded: Embedded, tools: Any, person: Any) -> None:
    """Reopening a closed mail hands it back to its recipient (mail:new, a run), as a
    follow-up does, but it counted no hop: builder reopening the mail it sent scout each time
    scout closed it, scout the one it sent builder, woke each other forever (review). An
    agent's reopen counts a hop on its mail like its follow-up; past 3 the mail is back in the
    recipient's inbox quiet (no mail label, no run) and `mail.loop_guard` is ledgered. A
    person's reopen always wakes, and starts the count again."""
    builder, scout = tools("agent:builder"), tools("agent:scout")
    to_scout = (await builder("mail_send", to="scout", subject="Ping", body="ping"))["mail"]
    to_builder = (await scout("mail_send", to="builder", subject="Pong", body="pong"))["mail"]
    await embedded.settle()
    # each may reopen on the forge what it sent the other (the org gives agents write)
    embedded.forge.set_permission(SCOUT, "builder-bot", "write")
    embedded.forge.set_permission(BUILDER, "scout-bot", "write")
    reopeners = {"builder": person("builder-bot"), "scout": person("scout-bot")}
    woken, states = [], []
    for _ in range(1, 6):
        for agent, mail, recipient in (("builder", to_scout, scout),
                                       ("scout", to_builder, builder)):
            await recipient("mail_close", mail=mail["ref"])  # done with it, it says
            await embedded.settle()
            queued = len(await embedded.ledger_events("run.queued"))
            await reopeners[agent].call("PATCH", f"/repos/{mail['vault']}/issues/"
                                        f"{mail['number']}", {"state": "open"}, expect=200)
            await embedded.settle()
            woken.append(len(await embedded.ledger_events("run.queued")) > queued)
            states.append((await recipient("mail_get", mail=mail["ref"]))["mail"]["state"])
    assert woken == [True] * 6 + [False] * 4, woken  # three reopens each, then no run
    assert states == ["mail:new"] * 6 + ["quiet"] * 4, states
    issue = await person("admin").issue(to_scout["vault"], to_scout["number"])
    assert (issue["state"], label_names(issue)) == ("open", []), "delivered without mail:new"
    guards = await embedded.ledger_events("mail.loop_guard")
    assert [(g.subject, g.data["hops"], g.data.get("reopened")) for g in guards] == [
        (to_scout["ref"], 4, True), (to_builder["ref"], 4, True)] * 2
    # a person's reopen wakes scout whatever came before, and starts the count again
    await scout("mail_close", mail=to_scout["ref"])
    await embedded.settle()
    await person("marco").call("PATCH", f"/repos/{to_scout['vault']}/issues/"
                               f"{to_scout['number']}", {"state": "open"}, expect=200)
    await embedded.settle()
    assert (await scout("mail_get", mail=to_scout["ref"]))["mail"]["state"] == "mail:new"
    await scout("mail_close", mail=to_scout["ref"])
    await embedded.settle()
    await reopeners["builder"].call("PATCH", f"/repos/{to_scout['vault']}/issues/"
                                    f"{to_scout['number']}", {"state": "open"}, expect=200)
    await embedded.settle()
    assert (await scout("mail_get", mail=to_scout["ref"]))["mail"]["state"] == "mail:new"


async def test_two_agents_answering_and_following_up_on_two_mails_stop_at_the_guard(
        embedded: Embedded, tools: Any, person: Any) -> None:
    """The recipient's reply started an agent's count on the mail again: builder and scout,
    each woken, replied to the mail it got and wrote on the one it had sent the other, and
    woke each other forever, each follow-up at its mail's first turn (review). Only a
    person's follow-up or reopen starts the count again."""
    builder, scout = tools("agent:builder"), tools("agent:scout")
    to_scout = (await builder("mail_send", to="scout", subject="Ping", body="ping"))["mail"]
    to_builder = (await scout("mail_send", to="builder", subject="Pong", body="pong"))["mail"]
    await embedded.settle()
    writers = {"builder": person("builder-bot"), "scout": person("scout-bot")}
    woken = []
    for round_ in range(1, 6):
        for agent, mail, recipient in (("builder", to_scout, scout),
                                       ("scout", to_builder, builder)):
            await recipient("mail_reply", mail=mail["ref"], body=f"done {round_}")
            await writers[agent].comment(mail["vault"], mail["number"], f"and now? {round_}")
            await embedded.settle()
            got = (await recipient("mail_get", mail=mail["ref"]))["mail"]
            woken.append(got["state"] == "mail:new")
    assert woken == [True] * 6 + [False] * 4, woken
    guards = [g for g in await embedded.ledger_events("mail.loop_guard")
              if g.data.get("follow_up")]
    assert [(g.subject, g.data["hops"]) for g in guards] == [
        (to_scout["ref"], 4), (to_builder["ref"], 4)] * 2


# An echo-style agent that answers each wake with FRESH mail to the other (no inReplyTo):
# "Ping N" woke it, it mails "Ping N+1", up to Ping 8 (a bound, so the loop the guard missed
# ends by itself when it does)
FRESH_PINGER = """
import json, os, sys
from bot.agents.echo import call
run = json.load(sys.stdin)
n = int(run["title"].split()[-1])
other = {"agent:scout": "builder", "agent:builder": "scout"}[os.environ["VAULTMAIL_AGENT"]]
if n < 8:
    call("mail_send", {"to": other, "subject": f"Ping {n + 1}", "body": "your turn",
                       "idempotencyKey": f"run-{run['run']}"})
"""


async def test_two_agents_answering_each_wake_with_fresh_mail_stop_at_the_guard(
        tmp_path: Path, database_url: str) -> None:
    """scout and builder run a command each time mail wakes them, and answer with fresh mail to
    the other (mail_send, no inReplyTo): every mail started at hop 0, so they woke each other
    forever. Mail an agent sends during a run a mail woke counts one hop more than that mail;
    past 3 it arrives quiet (no run) and `mail.loop_guard` is ledgered. Mail the agent sends
    outside a run (its long-lived token) starts at 0, as a person's does."""
    office = yaml.safe_load((Path(__file__).resolve().parents[1] / "bot" /
                             "example_office.yml").read_text())
    for agent in office["agents"]:
        if agent["slug"] in ("scout", "builder"):
            agent["run"]["dispatch"] = {"command": [PYTHON, "-c", FRESH_PINGER], "timeout": 60}
    path = tmp_path / "office.yml"  # the operator's own file: it may name a command
    path.write_text(yaml.safe_dump(office, sort_keys=False))
    emb = await start_embedded(office_path=path, data_dir=tmp_path / "d", port=0, forge_port=0,
                               database_url=database_url, app_key=app_key())
    try:
        async with aiohttp.ClientSession() as session:
            await ToolClient(session, emb, MARCO)("mail_send", to="scout", subject="Ping 0",
                                                  body="start")
            await emb.settle()
            sent = sorted(await mails.list_mails(emb.services.store, org="acme"),
                          key=lambda m: int(m.subject.split()[-1]))  # (one second: one `sent`)
            assert [(m.subject, m.from_principal, m.hops, m.state) for m in sent] == [
                ("Ping 0", MARCO, 0, "mail:new"),
                ("Ping 1", "agent:scout", 1, "mail:new"),
                ("Ping 2", "agent:builder", 2, "mail:new"),
                ("Ping 3", "agent:scout", 3, "mail:new"),
                ("Ping 4", "agent:builder", 4, "quiet")], sent
            finished = await emb.ledger_events("run.finished")
            # (as a set: a run's end is recorded when its process is seen to exit, and the
            # run its mail woke may end first on a loaded machine)
            assert sorted(f.subject for f in finished) == sorted(m.ref for m in sent[:4]), (
                "hops 0..3 start runs; the quiet one does not")
            assert all(f.data["exit"] == 0 for f in finished), [f.data for f in finished]
            guards = await emb.ledger_events("mail.loop_guard")
            assert [(g.subject, g.data["hops"]) for g in guards] == [(sent[4].ref, 4)]
            # the agent's own mail outside any run (its long-lived token) starts at 0
            outside = (await ToolClient(session, emb, "agent:scout")(
                "mail_send", to="builder", subject="Ping 8", body="by hand"))["mail"]
            assert (outside["hops"], outside["state"]) == (0, "mail:new")
            await emb.settle()
    finally:
        await emb.stop()


Answer = Callable[[Embedded, aiohttp.ClientSession, dict[str, Any]], Awaitable[None]]


@contextlib.asynccontextmanager
async def dispatched_by_post(
        tmp_path: Path, database_url: str, answer: Answer,
        edit: Callable[[dict[str, Any]], None] = lambda agent: None,
) -> AsyncIterator[tuple[Embedded, aiohttp.ClientSession, list[dict[str, Any]],
                         Callable[[], Awaitable[None]]]]:
    """An office whose scout and builder are run by a signed POST to a runner here, which
    checks the signature, answers 204 and then calls `answer(office, session, run)` (as a
    runner does after its 204). Yields the office, a session, the runs received and `settle`:
    what the answers caused, settled (each may wake the other agent). `edit` changes each
    agent of the office file before it starts."""
    answering: set[asyncio.Task[None]] = set()
    answers_ended = 0  # (an answer may start and end within one settle: see `settle`)
    received: list[dict[str, Any]] = []
    emb: Embedded | None = None
    session = aiohttp.ClientSession()

    async def runner(request: web.Request) -> web.Response:
        assert emb is not None
        body = await request.read()
        async with session.get(emb.app_url + "/.well-known/vaultmail-keys.json") as resp:
            keys = PublicKeys.from_jwks(await resp.json())  # (the office's, made at its first)
        check_signed_post(keys, "acme", url,
                          request.headers, body, now=time.time(),
                          seen={f"run-{r['run']}" for r in received})
        run = json.loads(body)
        received.append(run)
        task = asyncio.create_task(answer(emb, session, run))  # the runner answers after the 204
        answering.add(task)
        task.add_done_callback(answered)
        return web.Response(status=204)

    def answered(task: asyncio.Task[None]) -> None:
        nonlocal answers_ended
        answering.discard(task)
        answers_ended += 1

    async def settle() -> None:
        # each answer may wake the other agent: settle what it caused, until no answer is
        # under way and none ended while settling (one that ends after the office's last look
        # at its webhooks, say an issue it opened, is settled by the next round)
        assert emb is not None
        while True:
            await asyncio.gather(*answering)
            ended = answers_ended
            await emb.settle()
            if not answering and answers_ended == ended:
                return

    app = web.Application()
    app.router.add_post("/runs", runner)
    site_runner = web.AppRunner(app)
    await site_runner.setup()
    site = web.TCPSite(site_runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    url = f"http://127.0.0.1:{port}/runs"
    office = yaml.safe_load((Path(__file__).resolve().parents[1] / "bot" /
                             "example_office.yml").read_text())
    for agent in office["agents"]:
        if agent["slug"] in ("scout", "builder"):
            agent["run"]["dispatch"] = url
        edit(agent)
    path = tmp_path / "office.yml"
    path.write_text(yaml.safe_dump(office, sort_keys=False))
    emb = await start_embedded(office_path=path, data_dir=tmp_path / "d", port=0, forge_port=0,
                               database_url=database_url, app_key=app_key(),
                               outbound=OutboundPolicy.parse("127.0.0.1"))
    try:
        yield emb, session, received, settle
    finally:
        await emb.stop()
        await session.close()
        await site_runner.cleanup()


async def pinged_back(emb: Embedded, session: aiohttp.ClientSession,
                      run: dict[str, Any]) -> None:
    """A runner's answer to "Ping N": mail_send "Ping N+1" to the other agent with the agent's
    long-lived token (all a POST's runner has), up to Ping 8 (a bound, so a loop the guard
    misses ends by itself)."""
    n = int(run["title"].split()[-1])
    other = {"scout": "builder", "builder": "scout"}[run["agent"]]
    if n < 8:
        await ToolClient(session, emb, f"agent:{run['agent']}")(
            "mail_send", to=other, subject=f"Ping {n + 1}", body="your turn",
            idempotencyKey=f"run-{run['run']}")


async def _stopped_at_ping_4(emb: Embedded, received: list[dict[str, Any]]) -> MailRecord:
    """marco's Ping 0 and the agents' answers, scout and builder in turn: hops 0..3 new and
    dispatched, Ping 4 quiet (not dispatched) with one `mail.loop_guard`. Returns Ping 4."""
    sent = sorted(await mails.list_mails(emb.services.store, org="acme"),
                  key=lambda m: int(m.subject.split()[-1]))
    assert [(m.subject, m.from_principal, m.hops, m.state) for m in sent] == [
        ("Ping 0", MARCO, 0, "mail:new"),
        ("Ping 1", "agent:scout", 1, "mail:new"),
        ("Ping 2", "agent:builder", 2, "mail:new"),
        ("Ping 3", "agent:scout", 3, "mail:new"),
        ("Ping 4", "agent:builder", 4, "quiet")], sent
    assert [r["subject"] for r in received] == [m.ref for m in sent[:4]], (
        "hops 0..3 are dispatched; the quiet one is not")
    guards = await emb.ledger_events("mail.loop_guard")
    assert [(g.subject, g.data["hops"]) for g in guards] == [(sent[4].ref, 4)]
    return sent[4]


async def test_two_agents_dispatched_by_post_answering_each_wake_with_fresh_mail_stop_at_the_guard(
        tmp_path: Path, database_url: str) -> None:
    """scout and builder are run by a signed POST to their runner, which answers each wake
    with fresh mail to the other using the agent's long-lived token (the only one a POST
    runner has): every such mail started at hop 0, so they woke each other forever. Mail an
    agent sends while a run a mail woke is open counts one hop past that mail, whatever token
    it is sent with; past 3 it arrives quiet (no run) and `mail.loop_guard` is ledgered."""
    async with dispatched_by_post(tmp_path, database_url, pinged_back) as (
            emb, session, received, settle):
        await ToolClient(session, emb, MARCO)("mail_send", to="scout", subject="Ping 0",
                                              body="start")
        await settle()
        await _stopped_at_ping_4(emb, received)


async def builder_opens_issues(emb: Embedded, session: aiohttp.ClientSession,
                               run: dict[str, Any]) -> None:
    """builder's runner answers "Ping N" with an issue in scout's vault as builder-bot, scout's
    with mail_send (`pinged_back`)."""
    n = int(run["title"].split()[-1])
    if run["agent"] == "builder" and n < 8:
        await Actor(session, emb, "builder-bot").open_issue(SCOUT, f"Ping {n + 1}", "your turn")
    else:
        await pinged_back(emb, session, run)


async def test_an_agent_opening_issues_by_hand_in_anothers_vault_stops_at_the_guard(
        tmp_path: Path, database_url: str) -> None:
    """builder answers each wake by opening an issue in scout's vault as its own forge login
    (builder-bot), scout by mail_send: the app adopts builder's issue as builder's mail, and
    adopted mail started at hop 0 whoever opened it, so the two woke each other forever. An
    issue an agent opens climbs as its mail_send would (from its mail run still open); past 3
    it is adopted quiet (no mail:new on the forge, no run) and `mail.loop_guard` is ledgered."""
    async with dispatched_by_post(tmp_path, database_url, builder_opens_issues) as (
            emb, session, received, settle):
        await ToolClient(session, emb, MARCO)("mail_send", to="scout", subject="Ping 0",
                                              body="start")
        await settle()
        quiet = await _stopped_at_ping_4(emb, received)
        adopted = await Actor(session, emb, "marco").issue(SCOUT, quiet.number)
        assert label_names(adopted) == [], "a quiet adopted mail carries no mail:new"


async def test_an_agent_naming_its_run_climbs_from_that_runs_mail_not_its_latest(
        tmp_path: Path, database_url: str) -> None:
    """marco asks builder to brief critic; meanwhile scout, in an unrelated chain, wakes
    builder at hop 3. builder's runner, answering marco, mails critic with the long-lived
    token: it climbed from builder's latest open run (hop 3), so the brief went out quiet at
    hop 4 and critic was never woken. A runner names its run (`run`, the number its payload
    carries) and climbs from that run's mail; only one of that agent's own open runs is taken,
    and naming none still climbs from the latest."""
    def edit(agent: dict[str, Any]) -> None:
        if agent["slug"] == "builder":
            agent["capabilities"]["mail.send"] = ["*"]
        if agent["slug"] == "critic":
            agent["run"]["triggers"] = ["mail"]

    async def answer(emb: Embedded, session: aiohttp.ClientSession,
                     run: dict[str, Any]) -> None:
        return None  # this runner answers by hand, below

    async with dispatched_by_post(tmp_path, database_url, answer, edit) as (
            emb, session, received, settle):
        marco, scout, builder = (ToolClient(session, emb, who) for who in (
            MARCO, "agent:scout", "agent:builder"))
        await marco("mail_send", to="builder", subject="brief critic", body="please")
        await marco("mail_send", to="scout", subject="chain", body="go")
        await settle()
        [asked] = [r["run"] for r in received if r["title"] == "brief critic"]
        [chain] = [r["run"] for r in received if r["title"] == "chain"]
        for speaker, to, hop in ((scout, "builder", 1), (builder, "scout", 2),
                                 (scout, "builder", 3)):
            mail = (await speaker("mail_send", to=to, subject=f"P{hop}", body="..."))["mail"]
            assert mail["hops"] == hop
            await settle()
        brief = (await builder("mail_send", to="critic", subject="marco asks: review X",
                               body="x", run=asked))["mail"]
        assert (brief["hops"], brief["state"]) == (1, "mail:new"), brief
        # naming no run: the latest open one (scout's P3, hop 3), as before
        unnamed = (await builder("mail_send", to="critic", subject="and this", body="y"))["mail"]
        assert (unnamed["hops"], unnamed["state"]) == (4, "quiet"), unnamed
        # another agent's run, or one that is none, is refused: nothing sent
        for run in (chain, 999):
            status, body = await builder.raw("mail_send", {
                "to": "critic", "subject": "not mine", "body": "z", "run": run})
            assert (status, body["error"]["code"]) == (422, "run_not_open"), body
        await settle()
        sent = await mails.list_mails(emb.services.store, org="acme")
        assert "not mine" not in [m.subject for m in sent]


async def test_an_agent_naming_its_first_run_for_every_send_stops_at_the_guard(
        tmp_path: Path, database_url: str) -> None:
    """A POST's run is never marked over, so it stays open for the hour: each agent's runner
    named its first run (a person's hop-0 mail) for every send, every Ping went out at hop
    1 and scout and builder woke each other forever (review). A run is a budget, not a label:
    each send from one run to one recipient counts a hop past the last, so the same first run
    climbs 1, 2, 3 and the fourth send from it arrives quiet, `mail.loop_guard` ledgered."""
    first: dict[str, int] = {}  # each agent's first run, a person's mail's, named every time

    async def answer(emb: Embedded, session: aiohttp.ClientSession,
                     run: dict[str, Any]) -> None:
        first.setdefault(run["agent"], run["run"])
        if run["title"].startswith("Ping") and int(run["title"].split()[-1]) < 8:
            n = int(run["title"].split()[-1])
            other = {"scout": "builder", "builder": "scout"}[run["agent"]]
            await ToolClient(session, emb, f"agent:{run['agent']}")(
                "mail_send", to=other, subject=f"Ping {n + 1}", body="your turn",
                run=first[run["agent"]])

    async with dispatched_by_post(tmp_path, database_url, answer) as (
            emb, session, received, settle):
        marco = ToolClient(session, emb, MARCO)
        await marco("mail_send", to="builder", subject="hello", body="hi")  # builder's first
        await settle()
        await marco("mail_send", to="scout", subject="Ping 0", body="start")
        await settle()
        sent = sorted([m for m in await mails.list_mails(emb.services.store, org="acme")
                       if m.subject.startswith("Ping")],
                      key=lambda m: int(m.subject.split()[-1]))
        assert [(m.subject, m.from_principal, m.hops, m.state) for m in sent] == [
            ("Ping 0", MARCO, 0, "mail:new"),
            ("Ping 1", "agent:scout", 1, "mail:new"),
            ("Ping 2", "agent:builder", 1, "mail:new"),
            ("Ping 3", "agent:scout", 2, "mail:new"),
            ("Ping 4", "agent:builder", 2, "mail:new"),
            ("Ping 5", "agent:scout", 3, "mail:new"),
            ("Ping 6", "agent:builder", 3, "mail:new"),
            ("Ping 7", "agent:scout", 4, "quiet")], sent
        guards = await emb.ledger_events("mail.loop_guard")
        assert [(g.subject, g.data["hops"]) for g in guards] == [(sent[7].ref, 4)]


async def test_one_wake_fanning_out_to_several_agents_wakes_each_and_climbs_per_recipient(
        tmp_path: Path, database_url: str) -> None:
    """marco asks builder to brief critic, echo and scout: one mail from builder's run to each
    is one hop past marco's (1), all mail:new, however many it briefs. Mailing one of them
    again from that run climbs: 2, 3, then quiet at 4 (before, every send from the run was
    hop 1, so a run could wake its agent's peers without end)."""
    def edit(agent: dict[str, Any]) -> None:
        if agent["slug"] == "builder":
            agent["capabilities"]["mail.send"] = ["*"]
        if agent["slug"] in ("critic", "echo"):
            agent["run"].update(triggers=["mail"], dispatch="none")

    async def answer(emb: Embedded, session: aiohttp.ClientSession,
                     run: dict[str, Any]) -> None:
        return None  # this runner answers by hand, below

    async with dispatched_by_post(tmp_path, database_url, answer, edit) as (
            emb, session, received, settle):
        builder = ToolClient(session, emb, "agent:builder")
        await ToolClient(session, emb, MARCO)("mail_send", to="builder",
                                              subject="brief the others", body="please")
        await settle()
        [asked] = [r["run"] for r in received if r["title"] == "brief the others"]
        briefs = [(await builder("mail_send", to=to, subject="brief", body="x",
                                 run=asked))["mail"] for to in ("critic", "echo", "scout")]
        assert [(b["to_principal"], b["hops"], b["state"]) for b in briefs] == [
            ("agent:critic", 1, "mail:new"), ("agent:echo", 1, "mail:new"),
            ("agent:scout", 1, "mail:new")], briefs
        again = [(await builder("mail_send", to="critic", subject=f"more {n}", body="y",
                                run=asked))["mail"] for n in range(3)]
        assert [(m["hops"], m["state"]) for m in again] == [
            (2, "mail:new"), (3, "mail:new"), (4, "quiet")], again
        await settle()


async def _scouts_run(emb: Embedded, session: aiohttp.ClientSession) -> ToolClient:
    """scout as its runner holds it, woken by marco's hop-0 mail: the run's own token (which
    names that mail, bot.app.runs), whose sends to one recipient climb from hop 1."""
    woke = (await ToolClient(session, emb, MARCO)("mail_send", to="scout", subject="Go",
                                                  body="start"))["mail"]
    await emb.settle()
    token = await api_tokens.create_token(emb.services.store, "agent:scout", "acme",
                                          lasts=600.0, woken_by=woke["mail_id"])
    return ToolClient(session, emb, "agent:scout", token)


async def test_sends_from_one_run_to_one_recipient_made_at_once_each_climb_a_hop(
        embedded: Embedded, session: aiohttp.ClientSession) -> None:
    """scout's runner fans out four mail_send to builder at once from one run (its run's
    token, asyncio.gather): each counted the sends recorded before it, none yet, so all four
    went out at hop 1 and a runner sending concurrently spent no budget (review). Each send
    claims its place in the run's budget as it counts: 1, 2, 3, then quiet at 4."""
    scout = await _scouts_run(embedded, session)
    sent = await asyncio.gather(*(scout("mail_send", to="builder", subject=f"P{n}", body="x")
                                  for n in range(4)))
    assert sorted((s["mail"]["hops"], s["mail"]["state"]) for s in sent) == [
        (1, "mail:new"), (2, "mail:new"), (3, "mail:new"), (4, "quiet")], sent
    await embedded.settle()
    guards = await embedded.ledger_events("mail.loop_guard")
    assert [g.data["hops"] for g in guards] == [4]


async def test_a_send_keeps_its_place_in_the_runs_budget_however_it_is_indexed_or_retried(
        embedded: Embedded, session: aiohttp.ClientSession) -> None:
    """Sends from one run to builder, each claiming its place as it counts, whatever happens
    to it after. A send whose create landed but was answered 502 is indexed from its own
    webhook (`record_found`), which knew no run: it was not counted, so the next send from
    the run signed the same hop. A send whose create failed and is retried with its key
    after another send keeps the place it claimed, as a crash before the create would: each
    issue's signed header and index row agree, and no two sends share a hop."""
    scout = await _scouts_run(embedded, session)
    faults = embedded.forge.faults
    faults.add(route=CREATE, mode="after", status=502, count=1)
    recovered = (await scout("mail_send", to="builder", subject="A", body="a",
                             idempotencyKey="a"))["mail"]
    after = (await scout("mail_send", to="builder", subject="B", body="b"))["mail"]
    # (A's create was looked for after its backoff, by which time its webhook had indexed
    # it; C's tries all fail whenever they come)
    quick_retries(embedded)
    failing = faults.add(route=CREATE, status=502)
    status, _ = await scout.raw("mail_send", {"to": "builder", "subject": "C", "body": "c",
                                              "idempotencyKey": "c"})
    assert status >= 500 and failing.fired >= 1
    faults.remove(failing)
    meanwhile = (await scout("mail_send", to="builder", subject="D", body="d"))["mail"]
    retried = (await scout("mail_send", to="builder", subject="C", body="c",
                           idempotencyKey="c"))["mail"]
    again = (await scout("mail_send", to="builder", subject="A", body="a",
                         idempotencyKey="a"))["mail"]
    sent = (recovered, after, retried, meanwhile)
    assert [m["hops"] for m in sent] == [1, 2, 3, 4], sent
    assert again["mail_id"] == recovered["mail_id"] and again["hops"] == 1
    services = embedded.services
    for mail in sent:
        issue = await Actor(session, embedded, "marco").issue(mail["vault"], mail["number"])
        signed = mail_from_issue(mail["vault"], issue, services.keyring,
                                 app_login=services.bot_login)
        assert signed is not None and signed.hops == mail["hops"], (mail, signed)


# a command answering each wake on the forge with its agent's own token (a runner may hold it):
# an issue opened in the other's vault, or `/mail <other>` on the issue that woke it
FORGE_PINGER = """
import json, os, sys, urllib.request
run = json.load(sys.stdin)
n = int(run["title"].split()[-1])
cfg = json.load(open(sys.argv[1]))
me = os.environ["VAULTMAIL_AGENT"].removeprefix("agent:")
other = {"scout": "builder", "builder": "scout"}[me]
if cfg["by"] == "issue":
    path, body = f"/repos/acme/{other}-vault/issues", {"title": f"Ping {n + 1}", "body": "go"}
else:
    number = run["subject"].split("#")[1]
    path = f"/repos/acme/{me}-vault/issues/{number}/comments"
    body = {"body": f"/mail {other} Ping {n + 1}\\nyour turn"}
if n < 8:
    urllib.request.urlopen(urllib.request.Request(
        cfg["api"] + path, data=json.dumps(body).encode(), method="POST",
        headers={"Authorization": "token " + cfg[me], "Content-Type": "application/json"}))
"""


def moved_clock(monkeypatch: pytest.MonkeyPatch) -> Callable[[float], None]:
    """`time.time`, the app's and the forge's alike, from here on; each call moves it on by
    that many seconds (for the test's rest)."""
    real, shift = time.time, [0.0]
    monkeypatch.setattr(time, "time", lambda: real() + shift[0])

    def advance(seconds: float) -> None:
        shift[0] += seconds
    return advance


async def heard_late(emb: Embedded, settle: Callable[[], Awaitable[None]], later: float,
                     advance: Callable[[float], None]) -> None:
    """The deliveries the forge dropped (`drop_webhooks`: what the agents wrote), each sent
    again once everything before it has settled (the run that wrote it over, for a command)
    and `later` seconds on, round after round until none is left (past the guard nothing
    runs, so nothing more is written)."""
    forge, sent_again = emb.forge, set[str]()
    for _ in range(12):
        await settle()
        lost = [d for d in forge.state.deliveries.values()
                if d.status.endswith("(dropped)") and d.guid not in sent_again]
        if not lost:
            return
        advance(later)
        for delivery in lost:
            sent_again.add(delivery.guid)
            assert forge.webhooks.redeliver(delivery) is not None
    raise AssertionError("the agents kept writing")


async def _pings(emb: Embedded) -> list[tuple[str, str, int, str]]:
    sent = sorted([m for m in await mails.list_mails(emb.services.store, org="acme")
                   if m.subject.startswith("Ping")], key=lambda m: int(m.subject.split()[-1]))
    return [(m.subject, m.from_principal, m.hops, m.state) for m in sent]


STOPPED_AT_PING_4 = [("Ping 0", MARCO, 0, "mail:new"), ("Ping 1", "agent:scout", 1, "mail:new"),
                     ("Ping 2", "agent:builder", 2, "mail:new"),
                     ("Ping 3", "agent:scout", 3, "mail:new"),
                     ("Ping 4", "agent:builder", 4, "quiet")]


@pytest.mark.parametrize("by", ["issue", "mail"])
@pytest.mark.parametrize("later", [0.0, runs.RUN_HELD_OPEN + 60.0])
async def test_command_agents_writing_on_the_forge_stop_at_the_guard_however_late_heard(
        tmp_path: Path, database_url: str, monkeypatch: pytest.MonkeyPatch, by: str,
        later: float) -> None:
    """scout and builder each run a command that answers its wake on the forge with the
    agent's own token: an issue opened in the other's vault (`by` issue), or `/mail <other>`
    on the issue that woke it. Their hops counted from the agent's run still open when the
    app handled the write, and a command's run is over once it exits, before the forge's
    delivery of what it wrote arrives: every Ping started at 0 (or, by timing, now and then),
    each a run, without end; so did any runner's write whose lost delivery came back past
    `RUN_HELD_OPEN`. Here each such delivery is lost and sent again once the run is over
    (`later` seconds on): a write counts from the run open when the forge says it was made,
    1, 2, 3, then quiet at 4, `mail.loop_guard` ledgered."""
    office = yaml.safe_load((Path(__file__).resolve().parents[1] / "bot" /
                             "example_office.yml").read_text())
    cfgfile = tmp_path / "forge.json"
    for agent in office["agents"]:
        if agent["slug"] in ("scout", "builder"):
            agent["run"]["dispatch"] = {"command": [PYTHON, "-c", FORGE_PINGER, str(cfgfile)],
                                        "timeout": 60}
            agent["capabilities"]["mail.send"] = ["*"]
    path = tmp_path / "office.yml"
    path.write_text(yaml.safe_dump(office, sort_keys=False))
    emb = await start_embedded(office_path=path, data_dir=tmp_path / "d", port=0, forge_port=0,
                               database_url=database_url, app_key=app_key())
    advance = moved_clock(monkeypatch)
    try:
        cfgfile.write_text(json.dumps({"api": emb.forge.url + "/api/v3", "by": by, **{
            slug: emb.forge_tokens[f"{slug}-bot"] for slug in ("scout", "builder")}}))
        emb.forge.faults.drop_webhooks(rate=1.0, senders=("scout-bot", "builder-bot"),
                                       redeliveries=False)
        async with aiohttp.ClientSession() as session:
            await ToolClient(session, emb, MARCO)("mail_send", to="scout", subject="Ping 0",
                                                  body="start")
            await heard_late(emb, emb.settle, later, advance)
        pings = await _pings(emb)
        assert pings == STOPPED_AT_PING_4, pings
        finished = await emb.ledger_events("run.finished")
        assert len(finished) == 4 and all(f.data["exit"] == 0 for f in finished), [
            f.data for f in finished]
        guards = await emb.ledger_events("mail.loop_guard")
        assert [g.data["hops"] for g in guards] == [4]
    finally:
        await emb.stop()


async def test_an_agents_issue_heard_of_past_the_hour_climbs_from_the_run_it_was_opened_in(
        tmp_path: Path, database_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """builder's runner (dispatched by POST: its run never ends for the app) answers each wake
    with an issue in scout's vault, scout's with mail_send. Each issue's delivery is lost and
    sent again past `RUN_HELD_OPEN`: read by the time it was handled, builder's run was no
    longer open and each issue was adopted at hop 0, so they woke each other without end. It
    climbs from the run open when the forge says it was opened."""
    async with dispatched_by_post(tmp_path, database_url, builder_opens_issues) as (
            emb, session, received, settle):
        advance = moved_clock(monkeypatch)
        emb.forge.faults.drop_webhooks(rate=1.0, senders=("builder-bot",), redeliveries=False)
        await ToolClient(session, emb, MARCO)("mail_send", to="scout", subject="Ping 0",
                                              body="start")
        await heard_late(emb, settle, runs.RUN_HELD_OPEN + 60.0, advance)
        pings = await _pings(emb)
        assert pings == STOPPED_AT_PING_4, pings
