"""A named lock on PostgreSQL whose sessions the server ends while this replica hears nothing
of it (its host cut off from the database, or frozen, past the server's keepalive give-up,
VANISHED_PEER): the holder must be stopped, or at least fenced before each write, before
another replica can take the lock. Found by review (r7): the holder was stopped only once its
side heard the close, which a silent peer never sends, so two replicas held one lock.

Replica a reaches the database through a proxy that, on `cut`, forwards nothing more either
way and ends a's sessions on the server's side only (as the server does once a's host stops
answering its keepalives); a's sockets stay open and silent."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from urllib.parse import urlsplit, urlunsplit

import pytest

from bot.store import idempotency, open_store
from bot.store.db import Store
from bot.store.postgres import VANISHED_PEER
from tests.support import free_port

GUARD = 30.0  # a hang guard, never a synchronisation
# the soonest the server gives up a silent peer's session: idle, then its unanswered probes
GIVE_UP = float(VANISHED_PEER["tcp_keepalives_idle"]) + \
    float(VANISHED_PEER["tcp_keepalives_interval"]) * int(VANISHED_PEER["tcp_keepalives_count"])
KEY = "email-in:acme:scout:<m1@example.org>"


class Proxy:
    """A TCP proxy to the database, for replica a."""

    def __init__(self, host: str, port: int) -> None:
        self.host, self.port = host, port
        self.upstreams: list[asyncio.StreamWriter] = []
        self.downstreams: list[asyncio.StreamWriter] = []
        self.tasks: set[asyncio.Task[None]] = set()
        self.blackholed = False

    async def start(self) -> int:
        port = free_port()
        self.server = await asyncio.start_server(self._accepted, "127.0.0.1", port)
        return port

    def _accepted(self, down_r: asyncio.StreamReader, down_w: asyncio.StreamWriter) -> None:
        task = asyncio.ensure_future(self._pipe(down_r, down_w))
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def _pipe(self, down_r: asyncio.StreamReader, down_w: asyncio.StreamWriter) -> None:
        self.downstreams.append(down_w)
        up_r, up_w = await asyncio.open_connection(self.host, self.port)
        self.upstreams.append(up_w)

        async def pump(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
            while data := await r.read(65536):
                if not self.blackholed:
                    w.write(data)
                    await w.drain()
            if not self.blackholed:
                w.close()

        await asyncio.gather(pump(down_r, up_w), pump(up_r, down_w), return_exceptions=True)

    def blackhole(self) -> None:
        """a's host is cut off: nothing reaches either side, nothing closes."""
        self.blackholed = True

    def server_gives_up(self) -> None:
        """The server ends a's sessions (its keepalives unanswered); a hears nothing of it."""
        for up_w in self.upstreams:
            up_w.transport.abort()

    async def close(self) -> None:
        """Every socket closed on both sides (a hears it: its close waits for nothing)."""
        self.server.close()
        for writer in self.upstreams + self.downstreams:
            writer.transport.abort()
        for task in list(self.tasks):
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)


@pytest.fixture
async def proxied(postgres_url: str) -> AsyncIterator[tuple[Store, Store, Proxy]]:
    """Replicas a (through the proxy) and b on one database."""
    parts = urlsplit(postgres_url)
    proxy = Proxy(parts.hostname or "127.0.0.1", parts.port or 5432)
    netloc = parts.netloc.rsplit(":", 1)[0] + f":{await proxy.start()}"
    a = await open_store(urlunsplit(parts._replace(netloc=netloc)))
    b = await open_store(postgres_url)
    await a.join("replica-a")
    await b.join("replica-b")
    try:
        yield a, b, proxy
    finally:
        await b.close()
        await proxy.close()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(a.close(), GUARD)


async def test_a_holder_cut_off_from_the_database_is_stopped_before_the_server_lets_go(
        proxied: tuple[Store, Store, Proxy]) -> None:
    """a holds the lock, working (a forge call that takes its time); a's host is cut off.
    a's own probes of its lock's sessions go unanswered: a's holder is stopped (NamedLockLost)
    before the server gives a's sessions up, and only then does b get the lock."""
    a, b, proxy = proxied
    order: list[str] = []
    entered = asyncio.Event()

    async def work() -> None:
        try:
            async with a.named_lock(KEY):
                order.append("a in")
                entered.set()
                await asyncio.Event().wait()
        except ConnectionError as exc:
            order.append(f"a stopped: {type(exc).__name__}")

    holder = asyncio.create_task(work())
    await asyncio.wait_for(entered.wait(), GUARD)
    proxy.blackhole()
    await asyncio.sleep(GIVE_UP)  # the server's own give-up: the scenario, not a wait for a
    proxy.server_gives_up()
    async with asyncio.timeout(GUARD), b.named_lock(KEY):
        order.append("b in")
    assert order == ["a in", "a stopped: NamedLockLost", "b in"]
    await asyncio.wait_for(holder, GUARD)


async def test_a_holder_frozen_past_the_give_up_is_fenced_before_it_writes(
        proxied: tuple[Store, Store, Proxy]) -> None:
    """a's host freezes (a VM paused) while a holds the lock; the server gives its sessions
    up meanwhile. Woken, a's holder goes on to a forge write before anything else of a's has
    run: the fence before it (`check_claim`) says the lock is lost, and b gets it."""
    a, b, proxy = proxied
    fenced: list[str] = []
    with pytest.raises(ConnectionError) as stopped:  # noqa: PT012 - the holder's whole work
        async with asyncio.timeout(GUARD), a.named_lock(KEY):
            proxy.blackhole()
            proxy.server_gives_up()
            time.sleep(GIVE_UP)  # noqa: ASYNC251 - the freeze itself: nothing of a's runs
            await idempotency.check_claim()
            fenced.append("a wrote after the fence")
    assert type(stopped.value).__name__ == "NamedLockLost"
    assert fenced == []
    async with asyncio.timeout(GUARD), b.named_lock(KEY):
        pass
