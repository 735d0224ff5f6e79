"""A load balancer in front of an app's replicas: the forge hands its deliveries to each replica
in turn, passes over one that is down, and records a failure only when none takes it."""

from __future__ import annotations

import socket
from collections.abc import AsyncIterator

import pytest
from aiohttp import web

from .conftest import World

ISSUES = "/repos/acme/vault/issues"


class Replica:
    def __init__(self) -> None:
        self.guids: list[str] = []
        self.runner: web.AppRunner | None = None
        self.url = ""

    async def start(self, port: int = 0) -> None:
        async def receive(request: web.Request) -> web.Response:
            await request.read()
            self.guids.append(request.headers["X-GitHub-Delivery"])
            return web.Response(text="ok")

        app = web.Application()
        app.router.add_post("/webhook", receive)
        self.runner = web.AppRunner(app)
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", port)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        self.url = f"http://127.0.0.1:{port}/webhook"

    async def stop(self) -> None:
        assert self.runner is not None
        await self.runner.cleanup()


@pytest.fixture
async def replicas() -> AsyncIterator[list[Replica]]:
    made = [Replica() for _ in range(3)]
    for r in made:
        await r.start()
    yield made
    for r in made:
        if r.runner is not None:
            await r.stop()


def _issue_deliveries(world: World) -> list:  # type: ignore[type-arg]
    return [d for d in world.forge.state.deliveries.values() if d.event == "issues"]


async def _open(world: World, n: int) -> None:
    for i in range(n):
        await world.call("POST", ISSUES, "marco", {"title": f"t{i}"})
    await world.idle()


async def test_deliveries_go_to_each_replica_in_turn(world: World,
                                                     replicas: list[Replica]) -> None:
    world.forge.balance(world.hooks.url, [r.url for r in replicas])
    await _open(world, 6)
    assert [len(r.guids) for r in replicas] == [2, 2, 2]
    assert world.hooks.received == []  # the balancer's address itself serves nothing
    deliveries = _issue_deliveries(world)
    assert all(d.status == "OK" for d in deliveries)
    assert {world.forge.webhooks.took[d.id] for d in deliveries} == {r.url for r in replicas}


async def test_a_replica_that_is_down_is_passed_over(world: World,
                                                     replicas: list[Replica]) -> None:
    await replicas[1].stop()
    replicas[1].runner = None
    world.forge.balance(world.hooks.url, [r.url for r in replicas])
    await _open(world, 6)
    taken = replicas[0].guids + replicas[2].guids
    assert sorted(taken) == sorted({d.guid for d in _issue_deliveries(world)})
    assert len(taken) == 6  # each exactly once
    assert all(d.status == "OK" for d in _issue_deliveries(world))


async def test_with_every_replica_down_the_delivery_fails_as_it_would_unbalanced(
        world: World) -> None:
    # two ports held (bound, not listening: a connection is refused) until the delivery is
    # tried: let go before, another test's server could be given one
    with socket.socket() as a, socket.socket() as b:
        for s in (a, b):
            s.bind(("127.0.0.1", 0))
        world.forge.balance(world.hooks.url, [f"http://127.0.0.1:{s.getsockname()[1]}/webhook"
                                              for s in (a, b)])
        await _open(world, 1)
    (delivery,) = _issue_deliveries(world)
    assert delivery.status.startswith("failed to connect") and delivery.status_code == 0
    world.forge.balance(world.hooks.url, [])  # no balancer: the address itself again
    await _open(world, 1)
    assert len(world.hooks.received) == 1
