"""A named lock on PostgreSQL whose session the server ends while this replica hears nothing
of it (its host cut off from the database, or frozen, past the server's keepalive give-up):
another replica must not get the lock while the holder may still write. Found by review (r7):
the holder was stopped only once its side heard the close, which a silent peer never sends,
so two replicas held one lock and both wrote. A first fix (probes of each lane with a short
bound) was withdrawn after review r10 acted out four healthy holders it stopped: each of those
is a test here too, and each holder must finish its work.

Replica a reaches the database through a proxy that, on `blackhole`, forwards nothing more
either way, and on `server_gives_up` ends a's sessions on the server's side only (as the
server does once a's host stops answering its keepalives); a's sockets stay open and silent.
The holder's forge writes are stood for by their fence, `idempotency.check_claim`."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from urllib.parse import urlsplit, urlunsplit

import asyncpg
import pytest

from bot.forge.pacing import without_wait_limit
from bot.store import idempotency, open_store
from bot.store.db import Store
from bot.store.postgres import LEASE, named_lock_lane
from tests.support import free_port

GUARD = 60.0  # a hang guard, never a synchronisation
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
        cut = False  # this pipe's server side was ended: it stays silent for good

        async def pump(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
            nonlocal cut
            with contextlib.suppress(ConnectionError):
                while data := await r.read(65536):
                    if not (self.blackholed or cut):
                        w.write(data)
                        await w.drain()
            if self.blackholed or up_w.transport.is_closing():
                cut = True  # (a's side hears nothing of it)
            else:
                w.close()

        await asyncio.gather(pump(down_r, up_w), pump(up_r, down_w), return_exceptions=True)

    def blackhole(self) -> None:
        """a's host is cut off: nothing reaches either side, nothing closes."""
        self.blackholed = True

    def server_gives_up(self) -> None:
        """The server ends a's sessions (its keepalives unanswered); a hears nothing of it."""
        for up_w in self.upstreams:
            up_w.transport.abort()

    def heal(self) -> None:
        """a's host is reachable again: new connections pass (the ended ones stay silent)."""
        self.blackholed = False

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


@pytest.fixture
async def a(postgres_url: str) -> AsyncIterator[Store]:
    store = await open_store(postgres_url)
    await store.join("replica-a")
    try:
        yield store
    finally:
        await store.close()


async def test_a_holder_cut_off_from_the_database_writes_nothing_once_another_replica_has_it(
        proxied: tuple[Store, Store, Proxy]) -> None:
    """a holds the lock and writes to the forge now and then; a's host is cut off and the
    server ends its sessions (letting a's locks go). b takes the lock: from then on, none of
    a's writes passes its fence."""
    a, b, proxy = proxied
    order: list[str] = []
    entered = asyncio.Event()

    async def work() -> None:
        with contextlib.suppress(ConnectionError):  # (stopped once a hears the close)
            async with a.named_lock(KEY):
                entered.set()
                while True:
                    await idempotency.check_claim()  # the fence before each forge write
                    order.append("a wrote")
                    await asyncio.sleep(0.05)  # (the write itself)

    holder = asyncio.create_task(work())
    await asyncio.wait_for(entered.wait(), GUARD)
    proxy.blackhole()
    proxy.server_gives_up()
    async with asyncio.timeout(GUARD), b.named_lock(KEY):
        order.append("b in")
        await asyncio.sleep(1)  # (b's work)
    await proxy.close()
    await asyncio.wait_for(holder, GUARD)
    assert "a wrote" in order
    assert "a wrote" not in order[order.index("b in"):]


async def test_a_holder_frozen_past_its_lease_is_refused_at_its_next_write(
        proxied: tuple[Store, Store, Proxy]) -> None:
    """a's host freezes (a VM paused) while a holds the lock; the server ends its sessions
    meanwhile. Woken, and reachable again, a's holder goes on to a forge write before anything
    else of a's has run: the fence asks the server, which says the session is gone."""
    a, b, proxy = proxied
    fenced: list[str] = []
    with pytest.raises(ConnectionError) as stopped:  # noqa: PT012 - the holder's whole work
        async with asyncio.timeout(GUARD), a.named_lock(KEY):
            proxy.blackhole()
            proxy.server_gives_up()
            time.sleep(LEASE)  # noqa: ASYNC251 - the freeze itself: nothing of a's runs
            proxy.heal()
            await idempotency.check_claim()
            fenced.append("a wrote after the fence")
    assert type(stopped.value).__name__ == "NamedLockLost"
    assert fenced == []
    async with asyncio.timeout(GUARD), b.named_lock(KEY):
        pass


# -- healthy holders are never stopped (review r10's four) -----------------------------------

def _same_lane(prefix: str, lane: int, count: int) -> list[str]:
    keys: list[str] = []
    i = 0
    while len(keys) < count:
        i += 1
        if named_lock_lane(f"{prefix}-{i}") == lane:
            keys.append(f"{prefix}-{i}")
    return keys


async def test_a_task_started_inside_a_lock_writes_after_the_lock_is_let_go(a: Store) -> None:
    """A task started inside a named lock (runs._background, as a run's dispatch) outliving it:
    it is simply outside the lock then, and its forge write past the lease goes."""
    written: list[str] = []

    async def dispatch() -> None:
        await asyncio.sleep(LEASE + 0.5)  # (waiting for the forge's budget)
        await idempotency.check_claim()
        written.append("dispatched")

    async with a.named_lock("mail:m1"):
        task = asyncio.create_task(dispatch(), context=without_wait_limit())
    await asyncio.wait_for(task, GUARD)
    assert written == ["dispatched"]


async def test_a_table_lock_on_replicas_delays_a_lane_but_stops_no_holder(
        a: Store, postgres_url: str) -> None:
    """A migration or VACUUM FULL holds `replicas` for 3 s: a try on the holder's lane waits on
    it, holding the lane's turn. The holder writes meanwhile and finishes."""
    other = _same_lane("other", named_lock_lane("mail:m1"), 1)[0]
    events: list[str] = []
    entered = asyncio.Event()

    async def hold() -> None:
        async with a.named_lock("mail:m1"):
            entered.set()
            for _ in range(3):
                await asyncio.sleep(LEASE / 2)
                await idempotency.check_claim()
            events.append("holder done")

    async def try_other() -> None:
        async with a.named_lock(other):
            events.append("other got")

    holder = asyncio.create_task(hold())
    await asyncio.wait_for(entered.wait(), GUARD)
    dba = await asyncpg.connect(postgres_url)
    try:
        async with dba.transaction():
            await dba.execute("LOCK TABLE replicas IN ACCESS EXCLUSIVE MODE")
            tried = asyncio.create_task(try_other())
            await asyncio.sleep(3)  # (the migration's work)
    finally:
        await dba.close()
    await asyncio.wait_for(asyncio.gather(holder, tried), GUARD)
    assert sorted(events) == ["holder done", "other got"]


async def test_event_loop_stalls_stop_no_holder(a: Store) -> None:
    """CPU-bound stalls of 1.6 s (a large parse, GC) while a holds the lock: it writes after
    each and finishes."""
    written = 0
    async with a.named_lock("mail:m1"):
        for _ in range(5):
            time.sleep(1.6)  # noqa: ASYNC251 - the stall itself
            await asyncio.sleep(0)
            await idempotency.check_claim()
            written += 1
    assert written == 5


async def test_a_burst_of_tries_on_the_holders_lane_stops_no_holder(a: Store) -> None:
    """Thousands of tries queued on the holder's lane: the holder writes on and finishes."""
    lane = named_lock_lane("mail:m1")
    keys = _same_lane("burst", lane, 2000)
    events: list[str] = []
    entered = asyncio.Event()

    async def hold() -> None:
        async with a.named_lock("mail:m1"):
            entered.set()
            while not burst.done():
                await idempotency.check_claim()
                await asyncio.sleep(0.2)
            events.append("holder done")

    async def one(key: str) -> None:
        async with a.named_lock(key):
            pass

    burst = asyncio.ensure_future(asyncio.sleep(GUARD))
    holder = asyncio.create_task(hold())
    await asyncio.wait_for(entered.wait(), GUARD)
    burst.cancel()
    burst = asyncio.ensure_future(asyncio.gather(*(one(k) for k in keys)))
    await asyncio.wait_for(asyncio.shield(burst), GUARD * 2)
    await asyncio.wait_for(holder, GUARD)
    assert events == ["holder done"]


async def test_renewals_held_up_past_the_lease_delay_the_holders_write_and_refuse_none(
        a: Store, postgres_url: str) -> None:
    """A migration holds `lane_leases` itself for longer than a lease: no renewal is answered,
    and the holder's fence, its lease no longer fresh, waits for one. Once the table is free
    the renewal says the session is alive, and the write goes: delayed, never refused."""
    entered = asyncio.Event()
    written: list[str] = []

    async def hold() -> None:
        async with a.named_lock("mail:m1"):
            entered.set()
            await asyncio.sleep(LEASE)  # (past its lease: the fence must ask)
            await idempotency.check_claim()
            written.append("wrote")

    holder = asyncio.create_task(hold())
    await asyncio.wait_for(entered.wait(), GUARD)
    dba = await asyncpg.connect(postgres_url)
    try:
        async with dba.transaction():
            await dba.execute("LOCK TABLE lane_leases IN ACCESS EXCLUSIVE MODE")
            await asyncio.sleep(LEASE + 2)  # (the migration's work)
            assert written == []  # the fence waited for the server's word
    finally:
        await dba.close()
    await asyncio.wait_for(holder, GUARD)
    assert written == ["wrote"]
