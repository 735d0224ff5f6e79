"""Pacing waits never inside a turn or a lock (issue 27): once an installation's hourly budget of
content creations is spent, the next creation waits for its place in the next hour, but only it
waits. A label move (closing another mail), made for the same principal or anyone else, goes on
meanwhile; the wait shows in /readyz's operator detail and in a metric."""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any

import aiohttp

from bot import metrics
from bot.app.embedded import Embedded
from bot.forge.pacing import WritePacer
from bot.store.budget import Limits, place
from tests.support import ToolClient

GUARD = 60.0  # a hang guard, never a synchronisation
CREATE = "POST /repos/{owner}/{repo}/issues"
OPERATOR = "the-operators-token"


async def test_a_label_move_goes_on_while_a_send_waits_for_the_creation_budget(
        embedded: Embedded, tools: Any, session: aiohttp.ClientSession) -> None:
    """scout has spent its share of the hour's creations: its next mail_send waits for the
    hour, queued at the pacer; its mail_close of an earlier mail (a label move, no creation)
    goes at once; /readyz's detail and the metric show the wait."""
    services = embedded.services
    services.settings = dataclasses.replace(services.settings, operator_token=OPERATOR)
    pacer = services.forge_for(None).pacer  # type: ignore[attr-defined]
    pacer.content_per_hour = 4  # one principal's share: 3 creations an hour
    scout: ToolClient = tools("agent:scout")
    earlier = [(await scout("mail_send", to="builder", subject=f"Earlier {n}",
                            body="sent while the share lasted"))["mail"] for n in range(3)]
    send = asyncio.create_task(scout("mail_send", to="builder", subject="Later",
                                     body="waits for the next hour"))
    try:
        await asyncio.wait_for(pacer.until_waiting(1), GUARD)  # the send waits for its place
        closed = await asyncio.wait_for(scout("mail_close", mail=earlier[0]["ref"]), GUARD)
        assert closed["mail"]["state"] == "mail:closed"
        assert not send.done(), "the send still waits for the hour's budget"
        async with session.get(embedded.app_url + "/readyz",
                               headers={"Authorization": f"Bearer {OPERATOR}"}) as resp:
            ready = await resp.json()
        assert resp.status == 200, ready  # the budget is the forge's: still ready
        assert "wait for the forge's write budget" in ready["checks"]["forge"]["detail"], ready
        shown = metrics.REGISTRY.get_sample_value("vaultmail_forge_budget_wait_seconds")
        assert shown is not None and shown > 5
    finally:
        pacer.content_per_hour = 500  # the next hour, as far as this pacer knows
    await scout("mail_close", mail=earlier[1]["ref"])  # (a write's end passes the turn on)
    sent = await asyncio.wait_for(send, GUARD)
    assert sent["mail"]["subject"] == "Later"


def test_a_label_move_is_never_placed_behind_a_creation_placed_an_hour_ahead() -> None:
    """The shared budget, per kind: with writes spaced (min_interval), a label move placed
    after the next hour's creation goes now, not a second after that creation."""
    spaced = Limits(per_minute=80, per_hour=500, endpoint_points_per_minute=900,
                    min_interval=1.0, slack=0.0)
    ahead = [(3700.0, True, CREATE)]  # the next hour's first creation, placed already
    assert place(ahead, 100.0, False, "PATCH /repos/{owner}/{repo}/issues/{number}",
                 spaced) == 100.0


async def test_a_principals_label_move_passes_its_own_creation_waiting_for_budget() -> None:
    """The process's own pacer, per kind: a creation at the head of a principal's queue,
    waiting for the hour's budget, holds none of that principal's other writes."""
    now = [1000.0]
    sleepers: list[asyncio.Future[None]] = []

    async def sleep(seconds: float) -> None:
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        sleepers.append(future)
        await future

    pacer = WritePacer(min_interval=0.0, content_per_minute=80, content_per_hour=1,
                       principal_share=1.0,
                       monotonic=lambda: now[0], sleep=sleep)
    async with pacer.turn(True, "agent:scout", CREATE):
        pass  # the hour's one creation
    order: list[str] = []

    async def write(content: bool, what: str) -> None:
        async with pacer.turn(content, "agent:scout",
                              CREATE if content else "PATCH /repos/{owner}/{repo}/issues/{n}"):
            order.append(what)

    creation = asyncio.create_task(write(True, "creation"))
    await pacer.until_waiting(1)
    move = asyncio.create_task(write(False, "label move"))
    await asyncio.wait_for(move, GUARD)
    assert order == ["label move"] and not creation.done()
    assert pacer.budget_wait() > 5, "the creation's wait is seen"
    now[0] += 3700.0
    for future in sleepers:
        if not future.done():
            future.set_result(None)
    await asyncio.wait_for(creation, GUARD)
    assert order == ["label move", "creation"]
