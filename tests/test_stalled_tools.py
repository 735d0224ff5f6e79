"""Keyed tools whose try stalls past DEAD_AFTER (a frozen loop, a VM pause, a slow forge)
before it records what it did, while another replica takes the key over and does the work:
the stalled try, woken, records nothing and wakes no one. Staged with two replicas' own
stores on one index, each with its own forge client and permission cache (cold: the try's
look at the forge is the request held)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from bot.app import runs
from bot.app.egress import OutboundPolicy
from bot.app.embedded import Embedded, start_embedded
from bot.email.auth import Verdicts
from bot.email.gateway import GATEWAY_KEY
from bot.email.message import parse_inbound
from bot.office.visibility import Visibility
from bot.store import ledger, mails, open_store
from bot.store.db import Store
from bot.tools.registry import Call, call_tool
from tests.support import app_key, served
from tests.test_email_sending import _replica, _ReplicaIntake
from tests.test_email_support import DOMAIN, Mailroom, delivered, mailroom, message, send, wire
from tests.test_stalled_send import GUARD, _silence

SCOUT_VAULT = "acme/scout-vault"
MARCO = "human:marco@acme.com"
__all__ = ["mailroom"]  # the fixture, used by name
PERMISSION = "GET /repos/{owner}/{repo}/collaborators/{username}/permission"


@dataclass
class Office:
    """The example office with scout's runs dispatched as signed POSTs to `received`'s
    runner, and two replicas' stores (a, b) beside the app's."""

    embedded: Embedded
    a: Store
    b: Store
    received: list[bytes] = field(default_factory=list)

    def call(self, store: Store, principal: str) -> Call:
        """A call on the replica of `store`: its own forge client and a cold permission
        cache (another process's)."""
        services = _replica(self.embedded.services, store)
        services.visibility = Visibility()
        return Call(services, principal, self.embedded.office, services.forge_for_org("acme"))


@pytest.fixture
async def office(tmp_path: Path, database_url: str) -> AsyncIterator[Office]:
    received: list[bytes] = []

    async def runner(request: web.Request) -> web.Response:
        received.append(await request.read())
        return web.Response(status=204)

    app = web.Application()
    app.router.add_post("/runs", runner)
    async with served(app) as base:
        text = (Path(__file__).parents[1] / "bot" / "example_office.yml").read_text()
        # scout's (the first agent's) dispatch
        (tmp_path / "office.yml").write_text(
            text.replace("dispatch: none\n", f"dispatch: {base}/runs\n", 1))
        emb = await start_embedded(office_path=tmp_path / "office.yml", data_dir=tmp_path / "d",
                                   port=0, forge_port=0, database_url=database_url,
                                   outbound=OutboundPolicy.parse("127.0.0.1"),
                                   app_key=app_key())
        index = database_url or str(emb.data_dir / "index.sqlite3")
        a, b = await open_store(index), await open_store(index)
        try:
            await a.join("replica-a")
            await b.join("replica-b")
            yield Office(emb, a, b, received)
        finally:
            await a.close()
            await b.close()
            await emb.stop()


async def _stalled_at_the_forge(office: Office, principal: str, route: str, tool: str,
                                args: dict[str, Any], repo: str = SCOUT_VAULT
                                ) -> tuple[dict[str, Any], dict[str, Any]]:
    """a's keyed call is held at `route` (its first such request) past DEAD_AFTER; b's retry
    takes the key over and finishes; then a is let go. Both answers, a's and b's."""
    held = office.embedded.forge.faults.hold(route, count=1, repo=repo)
    first = asyncio.create_task(call_tool(office.call(office.a, principal), tool, args))
    await asyncio.wait_for(held.arrived.wait(), GUARD)  # a is at the forge, unanswered
    await _silence(office.b, "replica-a")
    retried = await asyncio.wait_for(call_tool(office.call(office.b, principal), tool, args),
                                     GUARD)
    held.release()  # a wakes
    answered = await asyncio.wait_for(first, GUARD)
    assert await runs.idle(office.embedded.services, GUARD), "the dispatches ended"
    return answered, retried


async def test_a_keyed_chat_stalled_past_its_takeover_is_kept_and_run_once(
        office: Office) -> None:
    """Replica a's keyed `agent_chat` stalls (at its look at marco's access to scout's vault)
    past DEAD_AFTER; b's retry takes the key over, keeps the chat and dispatches scout's run.
    a, woken, must keep no second chat and wake scout no second time (acted out: two chats,
    two `chat` runs, the runner POSTed twice)."""
    chat = {"agent": "scout", "message": "EU or US first?", "idempotencyKey": "chat-1"}
    answered, retried = await _stalled_at_the_forge(office, MARCO, PERMISSION, "agent_chat",
                                                    chat)
    assert answered == retried, "both tries answer the one chat"
    store = office.embedded.services.store
    assert len(await store.fetchall("SELECT * FROM chats")) == 1, "one chat kept"
    queued = await ledger.entries(store, event="run.queued")
    assert [e.subject for e in queued] == [f"chat:{retried['chat']['chat']}"], "one run"
    assert len(office.received) == 1, "the runner got one run"


class _Watched(dict[str, tuple[asyncio.Lock, int]]):
    """A replica's table of its tasks' locks (`Store._named`: key -> lock, its users) that
    tells when a second user, a waiter behind the holder, comes to `key`: a wait no request
    of its shows."""

    def __init__(self, key: str, table: dict[str, tuple[asyncio.Lock, int]]) -> None:
        super().__init__(table)
        self.key, self.waiting = key, asyncio.Event()

    def __setitem__(self, key: str, value: tuple[asyncio.Lock, int]) -> None:
        super().__setitem__(key, value)
        if key == self.key and value[1] >= 2:
            self.waiting.set()


async def test_a_keyed_reply_stalled_past_its_takeover_after_its_comment_moves_the_mail_once(
        office: Office) -> None:
    """Scout's keyed `mail_reply` on replica a posts its comment and passes its fence, then
    waits for the mail's lock (another task of a's holds it: the worker, say) past
    DEAD_AFTER; b's retry takes the key over, finds the comment and moves the mail. a, woken,
    must not move it again (acted out: `mail.replied` ledgered twice for the one reply, what
    list_changes and the office's trigger URL are told twice)."""
    emb = office.embedded
    builder = Call(emb.services, "agent:builder", emb.office, emb.services.forge_for_org("acme"))
    sent = (await call_tool(builder, "mail_send", {"to": "scout", "subject": "Stall",
                                                   "body": "x"}))["mail"]
    await emb.settle()
    reply = {"mail": sent["mail_id"], "body": "Done.", "idempotencyKey": "r1"}
    watched = office.a._named = _Watched(sent["mail_id"], office.a._named)  # noqa: SLF001
    held = office.a._local_lock(sent["mail_id"])  # noqa: SLF001 (a's own task holds it)
    await held.__aenter__()
    try:
        first = asyncio.create_task(call_tool(office.call(office.a, "agent:scout"),
                                              "mail_reply", reply))
        await asyncio.wait_for(watched.waiting.wait(), GUARD)  # a's reply waits for the lock
        await _silence(office.b, "replica-a")
        retried = await asyncio.wait_for(
            call_tool(office.call(office.b, "agent:scout"), "mail_reply", reply), GUARD)
    finally:
        await held.__aexit__(None, None, None)  # a wakes
    answered = await asyncio.wait_for(first, GUARD)
    assert answered["mail"]["mail_id"] == retried["mail"]["mail_id"] == sent["mail_id"]
    replied = await ledger.entries(emb.services.store, event="mail.replied")
    assert [e.data.get("reply") for e in replied] == [replied[0].data["reply"]], \
        "the reply is ledgered once"


async def test_an_email_answer_stalled_past_its_takeover_after_its_comment_wakes_the_agent_once(
        mailroom: Mailroom) -> None:
    """Bob answers his own message on a mail scout has opened: a comment on it, and the mail
    scout's turn again (a follow-up), once per Message-ID (`email-in`'s once). Replica a's try
    posts the comment and passes its fence, then waits for the mail's lock (another task of
    a's holds it) past DEAD_AFTER; b's retry takes the key over and hands the mail back to
    scout, who opens it again. a, woken, must not hand it back a second time (acted out: the
    mail back to mail:new and a second run queued for scout, for one message)."""
    emb = mailroom.embedded
    raw = wire(message("bob@example.org", f"scout@{DOMAIN}", "Question", "First words",
                       Message_ID="<q1@example.org>"))
    assert f"{SCOUT_VAULT}#1" in await delivered(
        mailroom, await send(mailroom.port, raw, rcpts=[f"scout@{DOMAIN}"]))
    await emb.settle()
    scout = mailroom.tools("agent:scout")
    await scout("mail_open", mail=f"{SCOUT_VAULT}#1")
    answer = parse_inbound(wire(message(
        "bob@example.org", f"scout@{DOMAIN}", "Re: Question", "The EU ones",
        Message_ID="<q2@example.org>", In_Reply_To="<q1@example.org>",
        References="<q1@example.org>")))
    verdicts = Verdicts("pass", "example.org", "none", (), "none", "", "example.org")
    intake = emb.runner.app[GATEWAY_KEY].intake
    assert intake is not None
    a, b = await open_store(mailroom.index), await open_store(mailroom.index)
    await a.join("replica-a")
    await b.join("replica-b")

    async def add(store: Store) -> object:
        services = _replica(emb.services, store)
        its = _ReplicaIntake(services, intake.proofs, services.forge_for_org("acme"))
        box = await its.mailbox(f"scout@{DOMAIN}")
        assert box is not None
        thread = await its.thread_of(box, answer)
        assert thread is not None and thread.number == 1
        return await its._add_to_thread(box, thread, answer, verdicts, None)  # noqa: SLF001

    mail = await mails.get_mail(emb.services.store, (await scout(
        "mail_get", mail=f"{SCOUT_VAULT}#1"))["mail"]["mail_id"])
    assert mail is not None and mail.state == "mail:working"
    try:
        watched = a._named = _Watched(mail.mail_id, a._named)  # noqa: SLF001
        held = a._local_lock(mail.mail_id)  # noqa: SLF001 (a's own task holds it)
        await held.__aenter__()
        try:
            first = asyncio.create_task(add(a))
            await asyncio.wait_for(watched.waiting.wait(), GUARD)  # a waits for the lock
            await _silence(b, "replica-a")
            await asyncio.wait_for(add(b), GUARD)
            await scout("mail_open", mail=f"{SCOUT_VAULT}#1")  # scout's run took it up
        finally:
            await held.__aexit__(None, None, None)  # a wakes
        await asyncio.wait_for(first, GUARD)
    finally:
        await a.close()
        await b.close()
    await emb.settle()
    now = await mails.get_mail(emb.services.store, mail.mail_id)
    assert now is not None and now.state == "mail:working", "scout's open stands"
    queued = [e for e in await ledger.entries(emb.services.store, event="run.queued")
              if e.subject == mail.ref]
    assert len(queued) == 2, "one run for bob's first message, one for his answer"
