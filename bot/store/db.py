"""The store's one interface, whatever the engine: transactions, reads, and what replicas
share (heartbeats, leadership). `bot.store.sqlite` and `bot.store.postgres` implement it;
`bot.store.engines.open_store` picks one from a URL."""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import time
import uuid
from abc import ABC, abstractmethod
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import ClassVar, TypeVar

from bot.store.idempotency import SCHEMA as IDEMPOTENCY_SCHEMA
from bot.store.idempotency import IdempotencyMixin
from bot.store.migrations import register_backfill, register_columns, register_schema
from bot.store.queue import (
    DEAD_AFTER,
    HEARTBEAT,
    LET_GO_FREE,
    STEADY_GAP,
    QueueItem,
    QueueMixin,
    ReplicaIdInUse,
    ReplicaIdTaken,
)
from bot.store.sql import Connection, Params, Row, Statement

T = TypeVar("T")

SCHEMA = """
CREATE TABLE IF NOT EXISTS deliveries (
    guid {text} PRIMARY KEY,
    event {text} NOT NULL,
    action {text},
    installation_id {int},
    received_at {real} NOT NULL
);
CREATE TABLE IF NOT EXISTS queue (
    id {id},
    guid {text} NOT NULL,
    event {text} NOT NULL,
    installation_id {int},
    issue_key {text},                           -- owner/repo#N the delivery is about, if any
    payload {text} NOT NULL,
    state {text} NOT NULL DEFAULT 'pending',   -- pending | done | dead | ignored | parked
    attempts {int} NOT NULL DEFAULT 0,
    next_at {real} NOT NULL,
    last_error {text},
    created_at {real} NOT NULL,
    finished_at {real}
);
CREATE INDEX IF NOT EXISTS queue_due ON queue(state, next_at, id);
"""
register_schema(SCHEMA)
register_schema(IDEMPOTENCY_SCHEMA)
register_columns("queue", {"issue_key": "{text}"})

# Issue keys are lower case (bot.store.queue.issue_key): those queued before are lowered, and
# a trigger lowers each one a replica of the release before writes (in its payload's case)
# during a rolling deploy, so its rows order with this release's. (The trigger can go once
# no replica of a release before 43 can be left.)
register_schema("""
UPDATE queue SET issue_key=lower(issue_key)
    WHERE state IN ('pending', 'parked') AND issue_key<>lower(issue_key);
CREATE TRIGGER IF NOT EXISTS queue_issue_key_lower AFTER INSERT ON queue
    WHEN NEW.issue_key<>lower(NEW.issue_key) BEGIN
    UPDATE queue SET issue_key=lower(NEW.issue_key) WHERE id=NEW.id;
END;
""", postgres="""
UPDATE queue SET issue_key=lower(issue_key)
    WHERE state IN ('pending', 'parked') AND issue_key<>lower(issue_key);
CREATE OR REPLACE FUNCTION vm_issue_key_lower() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    NEW.issue_key := lower(NEW.issue_key);
    RETURN NEW;
END $$;
DROP TRIGGER IF EXISTS queue_issue_key_lower ON queue;
CREATE TRIGGER queue_issue_key_lower BEFORE INSERT OR UPDATE OF issue_key ON queue
    FOR EACH ROW WHEN (NEW.issue_key <> lower(NEW.issue_key))
    EXECUTE FUNCTION vm_issue_key_lower();
""", version=43)

# Replicas: each process that opens the store is one, and says it is alive every HEARTBEAT
# seconds. What a replica holds (queue leases, idempotency claims, leadership) is held while
# its heartbeat is younger than DEAD_AFTER; after that any other replica takes it over.
register_schema("""
CREATE TABLE IF NOT EXISTS replicas (
    id {text} PRIMARY KEY,
    url {text},
    started_at {real} NOT NULL,
    seen_at {real} NOT NULL
);
""", version=2)
register_columns("queue", {"lease_owner": "{text}"}, version=2)
register_columns("idempotency", {"owner": "{text}"}, version=2)
# each try's claim its own id, which an office's rename, moving the key, keeps (bot.store.
# idempotency.Claim); indexed while unfinished, the rows a try finishes or lets go of
register_columns("idempotency", {"claim": "{text}"}, version=44)
_CLAIMS = ("CREATE INDEX IF NOT EXISTS idempotency_claim ON idempotency(claim)"
           " WHERE result IS NULL;\n")
register_backfill(_CLAIMS, postgres=_CLAIMS, version=44)
# how often a replica stopped (died, or was taken for dead) while it held the delivery, the
# number of its latest claim, since when a replica has beaten without a gap (see
# bot.store.queue, suspects and poison, and fencing), and which process holds a replica id
register_columns("queue", {"takeovers": "{int} NOT NULL DEFAULT 0",
                           "lease_seq": "{int} NOT NULL DEFAULT 0"}, version=3)
register_columns("replicas", {"steady_since": "{real}", "incarnation": "{text}"}, version=3)
# how a replica numbers its locks (PostgreSQL, bot.store.postgres): 3, SHA-256 (this release);
# 2, hashtextextended (schema 16's); none, a replica of a release before, whose named locks were
# 32-bit hashes
NAMED_LOCKS_KIND = 3
register_columns("replicas", {"named_locks": "{int}"}, version=16)
# PostgreSQL's named locks' sessions ("lanes"), each with a lease (`until`, the database's
# clock) renewed while the server shows the session alive (bot.store.postgres); unused on
# SQLite, whose locks are in-process
register_schema("""
CREATE TABLE IF NOT EXISTS lane_leases (
    pid {int} NOT NULL,
    started {real} NOT NULL,
    replica {text} NOT NULL,
    lane {int} NOT NULL,
    until {real} NOT NULL,
    PRIMARY KEY (pid, started)
);
CREATE INDEX IF NOT EXISTS lane_leases_lane ON lane_leases(lane, until);
""", version=38)
# whether a replica numbers rows per office (bot.store.offices.next_number): 1, this release;
# none, a release before schema 20, whose rows take their id (rolling deploys)
NUMBERING = 1
register_columns("replicas", {"numbering": "{int}"}, version=20)
# The pending rows as a claim reads them (bot.store.queue, CLAIM and WAKEUP): in arrival order,
# by issue, by due time, each with the columns the claim filters on (`state` too, though it is
# 'pending' throughout: SQLite reads an index alone only if it holds every column named).
# Partial: a finished row leaves them, so they hold the backlog, not the queue's history.
register_schema("""
CREATE INDEX IF NOT EXISTS queue_claim ON queue(id, next_at, lease_owner, issue_key, state)
    WHERE state='pending';
CREATE INDEX IF NOT EXISTS queue_held ON queue(issue_key, id, next_at, lease_owner, state)
    WHERE state='pending';
CREATE INDEX IF NOT EXISTS queue_wake ON queue(next_at, id, lease_owner, issue_key, state)
    WHERE state='pending';
""", version=6)

# Each queued delivery's office (bot.store.queue.office_of): claims share the worker between
# offices by it, and leave alone the offices the worker holds back. The pending rows in
# arrival order are indexed with it (queue_claim_office, in place of queue_claim), and by it
# (queue_pending_office: each office's first pending row, queue.NEXT_PENDING_BUT); rows queued
# before are given their issue's office (one about no issue keeps none: it is taken only while
# no office is held back, as before).
register_columns("queue", {"office": "{text}"}, version=18)
_CLAIM_INDEX = """
DROP INDEX IF EXISTS queue_claim;
CREATE INDEX IF NOT EXISTS queue_claim_office
    ON queue(id, next_at, lease_owner, issue_key, office, state) WHERE state='pending';
CREATE INDEX IF NOT EXISTS queue_pending_office ON queue(office, id) WHERE state='pending';
"""
register_backfill(
    "UPDATE queue SET office=lower(substr(issue_key, 1, instr(issue_key, '/') - 1))"
    " WHERE state IN ('pending', 'parked') AND issue_key IS NOT NULL;" + _CLAIM_INDEX,
    postgres="UPDATE queue SET office=lower(split_part(issue_key, '/', 1))"
             " WHERE state IN ('pending', 'parked') AND issue_key IS NOT NULL;" + _CLAIM_INDEX,
    version=18)

# The pending rows a replica has claimed, by issue (bot.store.queue, EARLIER): a claim on
# PostgreSQL looks whether another replica runs one of its issue's deliveries, among these few.
register_schema("""
CREATE INDEX IF NOT EXISTS queue_leased ON queue(issue_key, lease_owner)
    WHERE state='pending' AND lease_owner IS NOT NULL;
""", version=8)

# The deliveries parked until their issue becomes mail, by issue (bot.store.queue, `unpark`):
# the adoption finds them among these few, not in the queue's history.
register_schema("""
CREATE INDEX IF NOT EXISTS queue_parked ON queue(issue_key) WHERE state='parked';
""", version=11)

# Heartbeats and liveness go by the database's clock, vm_now() (SQLite: the one host's),
# so replicas on hosts whose clocks disagree still agree on who is alive.
register_schema("", postgres="""
CREATE OR REPLACE FUNCTION vm_now() RETURNS double precision
    LANGUAGE sql VOLATILE AS $$ SELECT extract(epoch FROM clock_timestamp())::double precision $$;
""", version=2)



# another process's row under a replica id, and whether it beat within DEAD_AFTER
_OTHER_UNDER_ID = ("SELECT seen_at, seen_at>vm_now()-? AS live FROM replicas WHERE id=?"
                   " AND (incarnation IS NULL OR incarnation<>?)")


def new_replica_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


async def hold(db: Connection, key: str) -> None:
    """Inside a transaction: wait until no other transaction holds `key`, then hold it until
    this one ends (PostgreSQL: an advisory lock of the transaction; SQLite has one writer, so
    nothing to do). For a read-then-write of one office's, or one row's, that no single
    statement can make (the ledger's chain, a budget's window): only writers of that key ever
    wait for each other."""
    await db.hold(key)


def key_order(key: str) -> tuple[bool, str]:
    """The one order every transaction takes its keys in: by name, an office's ledger chain
    last (an entry is appended after the rows it records, so a key held inside a transaction
    comes before the ledger's there too)."""
    return key.startswith("ledger:"), key


def keyed(db: Connection) -> bool:
    """Whether `db`'s engine runs writers side by side, so that `hold` takes a lock: a caller
    that must read to learn its key reads only then."""
    return db.keyed


class Store(QueueMixin, IdempotencyMixin, ABC):
    """The index. Writes go through `transaction()`, reads through `fetchone`/`fetchall`.

    There is no global write lock: each write is correct by the database's own means (a
    conditional UPDATE, `ON CONFLICT`, `FOR UPDATE SKIP LOCKED`), and a read-then-write that
    is not names what it reads (`transaction(key, ...)` or `hold(db, key)`), so two writes
    wait for each other only when they touch the same thing. SQLite has one writer anyway."""

    engine: ClassVar[str]

    def __init__(self) -> None:
        self._arrivals = deque()
        self._arrivals_writer = None
        self._parked = {}
        self._parked_writer = None
        self._finishes = []
        self._carried = []
        self._finishes_writer = None
        self._handed_over = {}
        self._running = {}
        self._unsettled = set()
        self._stray = []
        self._preclaims = {}
        self._at_work = set()
        self.claim_waits = 0
        self._named: dict[str, tuple[asyncio.Lock, int]] = {}  # key -> lock, its users
        self._keyed: dict[str, tuple[asyncio.Lock, int]] = {}  # transactions' keys, the same
        self.replica_id = new_replica_id()
        self.incarnation = uuid.uuid4().hex  # this process, under whatever replica id
        self.retired: str | None = None  # why this process no longer works (ReplicaIdTaken)
        # why the latest write failed, until one succeeds again (readiness: a full disk, a
        # read-only file; the probe's own lock-and-let-go writes nothing and proves nothing)
        self.write_failure: str | None = None
        self.write_transactions = 0  # committed by this process (/metrics)

    # -- one task at a time on a key ---------------------------------------------------------

    @asynccontextmanager
    async def named_lock(self, key: str) -> AsyncIterator[None]:
        """One holder at a time of `key` (a mail, an agent's runs): serialises the worker and
        tool calls on it, among this process's tasks (PostgreSQL: and every replica's)."""
        async with self._local_lock(key):
            yield

    @asynccontextmanager
    async def local_lock(self, key: str) -> AsyncIterator[None]:
        """One holder at a time of `key` among this process's tasks only, on every engine:
        never the database's, so a replica stalled inside it holds up no other replica."""
        async with self._local_lock(f"local:{key}"):
            yield

    @asynccontextmanager
    async def _local_lock(self, key: str,
                          table: dict[str, tuple[asyncio.Lock, int]] | None = None,
                          ) -> AsyncIterator[None]:
        """This process's lock on `key`, forgotten when its last user (holder or waiter) is
        done: never while a woken waiter has yet to run, which would let a newcomer in too."""
        locks = self._named if table is None else table
        lock, users = locks.get(key, (asyncio.Lock(), 0))
        locks[key] = (lock, users + 1)
        try:
            async with lock:
                yield
        finally:
            lock, users = locks[key]
            if users == 1:
                del locks[key]
            else:
                locks[key] = (lock, users - 1)

    @asynccontextmanager
    async def _turns(self, keys: tuple[str, ...]) -> AsyncIterator[list[str]]:
        """This process's turn at each of a transaction's keys, in one order: its writers of
        one key queue here, holding no connection, and meet at the database only those of
        other replicas. Yields the keys, sorted."""
        ordered = sorted(set(keys), key=key_order)
        async with contextlib.AsyncExitStack() as turns:
            for key in ordered:
                await turns.enter_async_context(self._local_lock(key, self._keyed))
            yield ordered

    # -- what each engine provides ---------------------------------------------------------

    @abstractmethod
    def transaction(self, *keys: str) -> AbstractAsyncContextManager[Connection]:
        """A write transaction: commit on success, roll back on error. With `keys`, it first
        waits until no other transaction holds any of them, and holds them to its end."""

    async def run_transaction(self, body: Callable[[Connection], Awaitable[T]],
                              *keys: str) -> T:
        """`body(db)` as one write transaction under `keys`, committed when it returns and
        rolled back when it raises; returns what it returns.

        `body` awaits the store's connection and nothing else, and changes nothing but the
        database and its own locals: SQLite runs it whole in its connection's thread, in one
        hop, so the one writer is not held across turns of the event loop between statements
        (on a busy loop, each turn was most of a transaction's time under the lock). Like
        `transaction()` elsewhere."""
        async with self.transaction(*keys) as db:
            return await body(db)

    @abstractmethod
    async def fetchall(self, sql: Statement, params: Params = ()) -> list[Row]: ...

    @abstractmethod
    async def fetchone(self, sql: Statement, params: Params = ()) -> Row | None: ...

    @abstractmethod
    async def close(self) -> None: ...

    async def check_writable(self) -> None:
        """Raises when the index cannot take a write (readiness): begins a write transaction,
        then ends it without changing anything."""
        async with self.transaction() as db:
            await db.execute("SELECT 1")

    @staticmethod
    def now() -> float:
        return time.time()

    # -- replicas --------------------------------------------------------------------------

    async def join(self, replica_id: str | None = None, url: str | None = None, *,
                   sole: bool = False) -> None:
        """Say this replica is alive. A replica that restarts under its old id takes back at
        once what it held; `sole` (SQLite: one process per file) frees what any other held.
        Raises ReplicaIdInUse when another process still beats under the id."""
        if replica_id:
            self.replica_id = replica_id
        seen = None if sole else await self._wait_for_silence()
        # two processes starting under one id at once: one looks and joins, then the other
        async with self.transaction(f"replica:{self.replica_id}") as db:
            if not sole:  # and nobody beat or joined under it since that look
                now = await db.fetchone(_OTHER_UNDER_ID,
                                        (DEAD_AFTER, self.replica_id, self.incarnation))
                if now is not None and now["live"] and (
                        seen is None or now["seen_at"] > seen["seen_at"]):
                    raise self._in_use()
            # a claim still held at a start was held by a process that stopped without
            # leaving (a crash): counted as a takeover
            if sole:
                await db.execute("DELETE FROM replicas WHERE id<>?", (self.replica_id,))
                await db.execute("UPDATE queue SET lease_owner=NULL, takeovers=takeovers+1"
                                 " WHERE state='pending' AND lease_owner IS NOT NULL")
            await db.execute("DELETE FROM replicas WHERE id=?", (self.replica_id,))
            await db.execute("INSERT INTO replicas(id, url, started_at, seen_at, steady_since,"
                             " incarnation, named_locks, numbering) VALUES (?,?,vm_now(),"
                             "vm_now(),vm_now(),?,?,?)", (self.replica_id, url, self.incarnation,
                                                          NAMED_LOCKS_KIND, NUMBERING))
            await db.execute("UPDATE queue SET lease_owner=NULL, takeovers=takeovers+1"
                             " WHERE lease_owner=? AND state='pending'", (self.replica_id,))

    async def _wait_for_silence(self) -> Row | None:
        """Under an id another process holds, go on only once that one has stopped beating
        (a restart after a kill: its last beat was at most DEAD_AFTER ago); what was seen."""
        params = (DEAD_AFTER, self.replica_id, self.incarnation)
        before = await self.fetchone(_OTHER_UNDER_ID, params)
        if before is None or not before["live"]:
            return before
        await asyncio.sleep(STEADY_GAP)  # long enough for a live process to beat
        after = await self.fetchone(_OTHER_UNDER_ID, params)
        if after is not None and after["seen_at"] > before["seen_at"]:
            raise self._in_use()
        return after

    def _in_use(self) -> ReplicaIdInUse:
        return ReplicaIdInUse(
            f"REPLICA_ID {self.replica_id!r} is in use: another process beats under it now."
            " Give each replica an id of its own (or leave REPLICA_ID unset), or stop the"
            " other process first.")

    def beat(self) -> AbstractAsyncContextManager[Connection]:
        """The heartbeat's transaction (PostgreSQL: one that waits for no writer)."""
        return self.transaction()

    async def heartbeat(self) -> None:
        # on PostgreSQL, behind no one's transaction: one that runs longer than DEAD_AFTER (a
        # reindex) must not make every other replica look dead
        if self.retired is not None:
            return
        async with self.beat() as db:
            # a beat after a gap (the database was away, or this process stalled) starts its
            # steady time again (see bot.store.queue: who counts a takeover)
            beaten = await db.execute(
                "UPDATE replicas SET steady_since=CASE WHEN seen_at<vm_now()-? THEN vm_now()"
                " ELSE steady_since END, seen_at=vm_now() WHERE id=? AND incarnation=?",
                (STEADY_GAP, self.replica_id, self.incarnation))
            if beaten == 0:
                taken = await db.fetchone("SELECT incarnation FROM replicas WHERE id=?",
                                          (self.replica_id,))
                if taken is None:  # declared dead meanwhile (a long pause): alive again
                    await db.execute("INSERT INTO replicas(id, url, started_at, seen_at,"
                                     " steady_since, incarnation, named_locks, numbering)"
                                     " VALUES (?,?,vm_now(),vm_now(),vm_now(),?,?,?)",
                                     (self.replica_id, None, self.incarnation,
                                      NAMED_LOCKS_KIND, NUMBERING))
        if beaten == 0 and taken is not None:
            raise ReplicaIdTaken(self.retire())

    def retire(self) -> str:
        """Another process joined under this replica's id: this one works no more."""
        self.retired = (f"another process joined as replica {self.replica_id!r} while this"
                        " one was silent: this one claims no more work; stop it")
        return self.retired

    async def leave(self) -> None:
        """On a clean stop: what this replica held is free at once."""
        if self.retired is not None:
            return  # (its id, and what is held under it, are another process's now)
        async with self.transaction() as db:
            await db.execute(LET_GO_FREE, (self.replica_id,))
            await db.execute("DELETE FROM replicas WHERE id=?", (self.replica_id,))

    async def live_replicas(self) -> list[Row]:
        return await self.fetchall(
            "SELECT id, url, started_at, seen_at FROM replicas WHERE seen_at>vm_now()-?"
            " ORDER BY started_at, id", (DEAD_AFTER,))

    async def is_leader(self) -> bool:
        """Whether this replica leads (the oldest live one): who runs the reconciler and the
        outbound triggers, one replica at a time, taken over when it dies."""
        row = await self.fetchone(
            "SELECT id FROM replicas WHERE seen_at>vm_now()-? ORDER BY started_at, id LIMIT 1",
            (DEAD_AFTER,))
        return row is not None and row["id"] == self.replica_id and self.retired is None


__all__ = ["HEARTBEAT", "Connection", "Params", "QueueItem", "ReplicaIdInUse", "ReplicaIdTaken",
           "Row", "Store", "hold", "keyed", "register_columns", "register_schema"]
