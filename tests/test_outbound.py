"""Outbound triggers: ledger events POSTed, signed, in order, to the office's webhook URLs."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from bot.app.egress import OutboundPolicy
from bot.app.embedded import Embedded, start_embedded
from bot.app.outbound import MAX_BACKOFF, LedgerForwarder
from bot.app.signed_post import check_signed_post
from bot.mail.signing import PublicKeys
from bot.store import ledger, open_store
from bot.store import outbound as cursors

# the receivers listen on loopback, which the app sends to only when the operator allows it
LOOPBACK = OutboundPolicy.parse("127.0.0.1")


class Receiver:
    def __init__(self) -> None:
        self.events: list[tuple[bytes, dict[str, str]]] = []
        self.refused: list[int] = []  # the seq of each POST answered 503 while "down"
        self.tried_while_down = asyncio.Event()
        self.down = False
        self.url = ""

    async def handle(self, request: web.Request) -> web.Response:
        body = await request.read()
        if self.down:
            self.refused.append(json.loads(body)["seq"])
            self.tried_while_down.set()
            return web.Response(status=503)
        self.events.append((body, dict(request.headers)))
        return web.Response(status=204)


async def _serve(handle: Any) -> tuple[web.AppRunner, str]:
    """A receiver on loopback: its runner and its hook's URL."""
    app = web.Application()
    app.router.add_post("/hook", handle)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    return runner, f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}/hook"  # type: ignore[union-attr]


@pytest.fixture
async def receiver() -> AsyncIterator[Receiver]:
    rec = Receiver()
    runner, rec.url = await _serve(rec.handle)
    yield rec
    await runner.cleanup()


@pytest.fixture
async def office_with_hook(tmp_path: Path, receiver: Receiver) -> AsyncIterator[Embedded]:
    from importlib import resources

    text = resources.files("bot").joinpath("example_office.yml").read_text()
    (tmp_path / "office.yml").write_text(text + f"webhooks:\n  - {receiver.url}\n")
    emb = await start_embedded(office_path=tmp_path / "office.yml", data_dir=tmp_path / "d",
                               port=0, forge_port=0, outbound=LOOPBACK)
    yield emb
    await emb.stop()


async def _until(check: Any, timeout: float = 10.0) -> None:
    for _ in range(int(timeout / 0.05)):
        if check():
            return
        await asyncio.sleep(0.05)
    raise AssertionError("timed out")


async def _send(emb: Embedded, subject: str) -> None:
    headers = {"Authorization": f"Bearer {emb.api_tokens['human:marco@acme.com']}"}
    async with aiohttp.ClientSession() as s, s.post(
            emb.app_url + "/api/v1/tools/mail_send", headers=headers,
            json={"to": "scout", "subject": subject, "body": "x"}) as resp:
        assert resp.status == 200


async def test_ledger_events_reach_the_office_webhook_signed_and_in_order(
        office_with_hook: Embedded, receiver: Receiver) -> None:
    emb = office_with_hook
    await _send(emb, "First")
    await _until(lambda: len(receiver.events) >= 2)
    async with aiohttp.ClientSession() as s, s.get(
            emb.app_url + "/.well-known/vaultmail-keys.json") as resp:
        keys = PublicKeys.from_jwks(await resp.json())
    bodies = []
    for body, headers in receiver.events:
        delivery = check_signed_post(keys, "acme", receiver.url, headers, body, now=time.time())
        bodies.append(json.loads(body))
        assert delivery == str(bodies[-1]["seq"])
    assert [b["event"] for b in bodies[:2]] == ["mail.sent", "run.queued"]
    assert [b["seq"] for b in bodies] == sorted(b["seq"] for b in bodies)
    assert receiver.events[0][1]["X-Vaultmail-Event"] == "mail.sent"


async def test_a_receiver_that_was_down_gets_every_event_once_it_is_back(
        office_with_hook: Embedded, receiver: Receiver) -> None:
    emb = office_with_hook
    receiver.down = True
    await _send(emb, "While down")
    await asyncio.wait_for(receiver.tried_while_down.wait(), 10)  # a POST was refused
    assert receiver.events == [], "nothing was accepted while the receiver was down"
    ledger_seqs = [e.seq for e in await ledger.entries(emb.services.store)]
    assert receiver.refused[0] == ledger_seqs[0], "the first event was tried, and refused"
    receiver.down = False
    await _until(lambda: len(receiver.events) >= len(ledger_seqs), timeout=15)
    seqs = [json.loads(body)["seq"] for body, _ in receiver.events]
    assert seqs[:len(ledger_seqs)] == ledger_seqs, "every event, the refused ones first"
    assert seqs == sorted(set(seqs)), "each event once, in ledger order"


async def test_two_replicas_forwarding_one_cursor_at_once_send_each_event_once(
        embedded: Embedded, receiver: Receiver, database_url: str) -> None:
    """A leader that stalled past its lease may wake beside its successor: both forward the
    same URL at once (on PostgreSQL from two replicas' stores). Each event goes once."""
    await _send(embedded, "Once")
    other = await open_store(database_url) if database_url else embedded.services.store
    try:
        services = dataclasses.replace(embedded.services, settings=dataclasses.replace(
            embedded.services.settings, outbound=LOOPBACK))
        first = LedgerForwarder(services)
        second = LedgerForwarder(dataclasses.replace(services, store=other))
        sent = await asyncio.gather(first.forward("acme", receiver.url),
                                    second.forward("acme", receiver.url))
    finally:
        if other is not embedded.services.store:
            await other.close()
    seqs = [json.loads(body)["seq"] for body, _ in receiver.events]
    ledger_seqs = [e.seq for e in await ledger.entries(embedded.services.store)]
    assert seqs, "something was forwarded"
    assert seqs == sorted(set(seqs)), f"an event went twice: {seqs}"
    assert seqs == ledger_seqs[:len(seqs)] and sum(sent) == len(seqs)


async def test_a_receiver_that_hangs_holds_up_no_other_offices_webhook(
        tmp_path: Path, receiver: Receiver) -> None:
    """evil's receiver takes each POST and never answers (until the 10 s timeout): acme's
    webhook gets acme's entry all the same, while evil's POST still hangs."""
    import yaml

    from bot.office.config import parse_office
    from bot.office.seed import seed_office

    hung, release = asyncio.Event(), asyncio.Event()

    async def tarpit(request: web.Request) -> web.Response:
        await request.read()
        hung.set()
        await release.wait()
        return web.Response(status=204)

    runner, evil_url = await _serve(tarpit)
    from importlib import resources

    text = resources.files("bot").joinpath("example_office.yml").read_text()
    (tmp_path / "office.yml").write_text(text + f"webhooks:\n  - {receiver.url}\n")
    emb = await start_embedded(office_path=tmp_path / "office.yml", data_dir=tmp_path / "d",
                               port=0, forge_port=0, outbound=LOOPBACK)
    try:
        seed_office(emb.forge, parse_office(yaml.safe_dump(
            {"org": "evil", "webhooks": [evil_url],
             "agents": [{"slug": "spy", "login": "evil-spy"}]}), "evil.yml", repository=False))
        (app_id,) = emb.forge.state.apps
        emb.services.installations["evil"] = emb.forge.install_app(int(app_id), "evil")
        await ledger.record(emb.services.store, "office.config_refused", "office",
                            "evil/.github", {"errors": ["evil's own"]}, org="evil")
        await asyncio.wait_for(hung.wait(), 10)  # (a guard) evil's POST is in the tarpit
        await ledger.record(emb.services.store, "office.config_refused", "office",
                            "acme/.github", {"errors": ["acme's"]}, org="acme")
        await _until(lambda: any(b"acme's" in body for body, _ in receiver.events),
                     timeout=8.0)
        assert not release.is_set()  # evil's POST never answered meanwhile
    finally:
        release.set()
        await emb.stop()
        await runner.cleanup()


async def test_an_orgs_rename_sends_its_webhook_nothing_it_had_acknowledged(
        tmp_path: Path, receiver: Receiver, database_url: str) -> None:
    """The office follows its org's new name, its ledger with it: its webhook's cursor too.
    Before, the cursor was left under the old name, and the webhook was sent the office's whole
    ledger again from its first entry."""
    from importlib import resources

    text = resources.files("bot").joinpath("example_office.yml").read_text()
    (tmp_path / "office.yml").write_text(text + f"webhooks:\n  - {receiver.url}\n")
    emb = await start_embedded(office_path=tmp_path / "office.yml", data_dir=tmp_path / "d",
                               port=0, forge_port=0, outbound=LOOPBACK,
                               database_url=database_url)
    try:
        await _send(emb, "Before")
        before = len(await ledger.entries(emb.services.store, org="acme"))
        await _until(lambda: len(receiver.events) >= before)
        emb.forge.rename_org("acme", "initech")
        await emb.settle()
        await _send(emb, "After")
        ours = await ledger.entries(emb.services.store, org="initech")
        assert len(ours) > before, "the rename moved the ledger, and the new mail is in it"
        await _until(lambda: len(receiver.events) >= len(ours))
        seqs = [json.loads(body)["seq"] for body, _ in receiver.events]
        assert seqs == sorted(set(seqs)), f"each event once: {seqs}"
    finally:
        await emb.stop()


async def test_a_receiver_down_for_days_is_still_tried_at_most_every_five_minutes(
        embedded: Embedded, receiver: Receiver) -> None:
    """A webhook URL left in an office's config after its receiver went away fails for good.
    Its backoff counted each failure as 2 ** failures, a float past 1,023 of them (3.5 days
    at 5 minutes apart): OverflowError, its next try never saved, and the URL POSTed to at
    every look (twice a second) from then on."""
    await _send(embedded, "Still there?")
    services = dataclasses.replace(embedded.services, settings=dataclasses.replace(
        embedded.services.settings, outbound=LOOPBACK))
    await cursors.save_cursor(services.store, "acme", receiver.url, 0, 1_100, 0.0, "503")
    receiver.down = True
    forwarder = LedgerForwarder(services)
    assert await forwarder.forward("acme", receiver.url) == 0
    assert len(receiver.refused) == 1
    row = await cursors.get_cursor(services.store, "acme", receiver.url)
    assert row is not None and row["failures"] == 1_101
    assert time.time() + 200 < row["next_at"] <= time.time() + MAX_BACKOFF
    assert await forwarder.forward("acme", receiver.url) == 0  # not yet: its backoff holds
    assert len(receiver.refused) == 1
