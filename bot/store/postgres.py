"""The PostgreSQL engine (asyncpg): one database shared by several replicas of the app.

The store modules' statements run here as each is written for PostgreSQL (`bot.store.sql`:
most are one text for both engines, a few said for each), straight through asyncpg. There is no
global write lock: writes run side by side, each correct by the database's own means, and a
read-then-write names the key it reads under (`Store.transaction(key)`, `bot.store.db.hold`),
an advisory lock of its transaction, so only writers of one key (an office's ledger chain, an
installation's write budget, an idempotency key) ever wait for each other. No transaction
waits unboundedly: a statement waits at most LOCK_WAIT for a lock, and the server ends a
session left idle inside a transaction (a stalled replica) after IDLE_IN_TRANSACTION, letting go
of what it held. (Named locks, a mail's or an agent's runs', are held on a few sessions of
their own across forge calls, for as long as their holder works, who is stopped should one be
cut: a stalled holder keeps them until its host stops answering keepalives.) Wake-ups for long
polls cross replicas by LISTEN/NOTIFY.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import asyncpg

from bot.store import lease
from bot.store.db import Store
from bot.store.locks import (
    MIGRATE_LOCK,
    OLD_NAMED_CLASS,
    RELEASE_1_WRITE_LOCK,
    RESERVED,
    lock_pair,
    named_lock_pair,
    named_lock_second_pair,
)
from bot.store.migrations import MIGRATIONS_TABLE, column, migrations
from bot.store.queue import DEAD_AFTER
from bot.store.sql import Engine, Params, Row, Statement, ddl, for_postgres

log = logging.getLogger("vaultmail.store")

# Lock numbers come from bot.store.locks: 64 bits of a name's SHA-256, which no tenant can
# steer (PostgreSQL's hashtextextended, which releases before schema 17's numbering used, can
# be run backwards), in the two-key space: a transaction's keys (Store.transaction(key), hold)
# are locks of the transaction, `lock_pair`; named locks (Store.named_lock, held across
# transactions on sessions of their own) are session locks, `named_lock_pair`, never the
# same lock as a transaction's key, so a session holding named locks never waits on its
# replica's transactions.
#
# Rolling deploys. Each replica's `replicas` row says how it numbers locks (`named_locks`:
# NULL before schema 16, 2 for schema 16's release, NAMED_LOCKS_KIND now):
# - the first release (schema 7) took RELEASE_1_WRITE_LOCK in every write transaction: while
#   a replica that may be of it lives (any from before schema 16: its row names no
#   `named_locks`), each transaction here takes it shared, so one of its writes excludes every
#   new one (and the reverse) while new ones never wait for each other. Else none takes it: one
#   lock every office's writes touched. (Left open: a first-release replica that joins, or
#   beats again after DEAD_AFTER, is excluded by the transactions begun once its row is seen,
#   not by one already in flight then.)
# - releases before this one numbered a transaction's key hashtextextended(key, 0), and named
#   locks (NAMED_LOCKS, hashtext(key)) before schema 16, then hashtextextended(key,
#   NAMED_SEED). A transaction's keys are tried that way too, in order, up to the first
#   refused, and a named lock the 32-bit way, each held where free, so an older replica, live
#   or starting later, is excluded (never as one of the fixed numbers, RESERVED: an older key
#   could have been chosen to be one). None of those numbers can be a lock of this release
#   (bot.store.locks). Held by someone else, an older way is waited for only while a replica
#   of that release lives, and then as that release takes it (in order: no cycle with it);
#   else the holder is of this release, holding another name of that old number. Two ways are
#   taken only while a replica that takes them lives, as they are held longer than a
#   transaction or taken by many at once: schema 16's named locks (a session lock, where
#   another office's older key number could be chosen) and intake's older issue key.
# (Drop the older ways once no replica of those releases can be left.)
RELEASE_1_MAY_LIVE = ("EXISTS (SELECT 1 FROM replicas WHERE named_locks IS NULL"
                      " AND seen_at>vm_now()-$2)")
NAMED_LOCKS = OLD_NAMED_CLASS  # (before schema 16)
NAMED_SEED = 0x766D_0003  # (schema 16's)
OLDER_KEYS = ("EXISTS (SELECT 1 FROM replicas WHERE (named_locks IS NULL OR named_locks<3)"
              " AND seen_at>vm_now()-$2)")
OLDER_WAY = ("SELECT pg_advisory_xact_lock(h) FROM (SELECT hashtextextended(k, 0) AS h FROM"
             " unnest($1::text[]) WITH ORDINALITY AS u(k, n) ORDER BY n) s"
             " WHERE h <> ALL($2::bigint[])")
OLDER_TRY = ("SELECT pg_try_advisory_xact_lock(h) FROM (SELECT hashtextextended(k, 0) AS h"
             " FROM unnest($1::text[]) k) s WHERE h <> ALL($2::bigint[])")
NAMED_TRY = (
    "SELECT t.got, t.before16, t.schema16,"
    " CASE WHEN t.got THEN pg_try_advisory_lock($5, hashtext($3)) END AS way1,"
    " CASE WHEN t.got AND t.schema16 AND NOT (hashtextextended($3, $4) = ANY($6::bigint[]))"
    " THEN pg_try_advisory_lock(hashtextextended($3, $4)) END AS way2"
    " FROM (SELECT pg_try_advisory_lock($1::int, $2::int) AS got,"
    " EXISTS (SELECT 1 FROM replicas WHERE named_locks IS NULL AND seen_at>vm_now()-$7)"
    " AS before16,"
    " EXISTS (SELECT 1 FROM replicas WHERE named_locks=2 AND seen_at>vm_now()-$7)"
    " AS schema16) t")
# The second hold, and with it (no trip of its own) how long the lease of a session the server
# ended is still to run, of those that held locks on the first hold's lane ($3): one may have
# held this lock, its holder not told yet and writing until that lease ends. (Looked at here,
# a trip after the first hold was got: a backend lets its locks go a moment before it leaves
# pg_stat_activity.)
NAMED_TRY_SECOND = (
    "SELECT t.got, CASE WHEN t.got THEN (SELECT max(l.until)-vm_now() FROM lane_leases l"
    " WHERE l.lane=$3 AND l.until>vm_now() AND NOT EXISTS (SELECT 1 FROM pg_stat_activity a"
    " WHERE a.pid=l.pid AND extract(epoch FROM a.backend_start)::float8=l.started))"
    " END AS dead_lease FROM (SELECT pg_try_advisory_lock($1::int, $2::int) AS got) t")
# A lane's lease, taken on the lane's own session as it opens (the leases of dead sessions run
# out by themselves: those long over are cleared here), then renewed by RENEW_LEASES, on a
# connection of its own (never behind a lane's statements), for this replica's lanes the
# server shows alive (by backend pid and start: a pid can be used again), which it returns.
LANE_LEASE = (
    "WITH over AS (DELETE FROM lane_leases WHERE until<vm_now()-60)"
    " INSERT INTO lane_leases(pid, started, replica, lane, until)"
    " SELECT pid, extract(epoch FROM backend_start)::float8, $1, $2, vm_now()+$3"
    " FROM pg_stat_activity WHERE pid=pg_backend_pid() RETURNING pid, started")
RENEW_LEASES = (
    "INSERT INTO lane_leases(pid, started, replica, lane, until)"
    " SELECT s.pid, s.started, $1, s.lane, vm_now()+$5"
    " FROM unnest($2::bigint[], $3::float8[], $4::bigint[]) AS s(pid, started, lane)"
    " WHERE EXISTS (SELECT 1 FROM pg_stat_activity a WHERE a.pid=s.pid"
    " AND extract(epoch FROM a.backend_start)::float8=s.started)"
    " ON CONFLICT (pid, started) DO UPDATE SET until=excluded.until RETURNING pid, started")
# A lease runs LEASE seconds (the database's clock) from its renewal. Its holders write
# without asking while the renewal last confirmed was sent under LEASE - LEASE_MARGIN ago
# (their own clock; the margin for a write that follows the fence and for clocks that run
# apart), and otherwise wait for the next renewal's answer. Renewals go every RENEW; one
# unanswered for RENEW_WAIT is sent again on a fresh connection (never given up on).
LEASE = 6.0
LEASE_MARGIN = 2.0
RENEW = 1.5
RENEW_WAIT = LEASE
# which of a lane's waited-for locks are free now, none of them held (one trip for them all)
NAMED_LOOK = ("SELECT n FROM unnest($1::int[], $2::int[]) WITH ORDINALITY AS u(h, l, n)"
              " WHERE CASE WHEN pg_try_advisory_lock(h, l) THEN pg_advisory_unlock(h, l) END")
NAMED_LOCK_POLL = 0.05  # seconds between looks while another replica holds a named lock
NAMED_LOCK_LANES = 4  # sessions a replica holds named locks on, however many (2 at least)
CHANNEL = "vaultmail"  # LISTEN/NOTIFY: wake-ups for long polls on every replica
STATEMENTS_KEPT = 2000  # statements prepared per connection (and known to the engine) at most


def _text(v: Any) -> Any:
    return v if v is None or isinstance(v, str) else str(v)


def _integer(v: Any) -> Any:
    if isinstance(v, float) and v.is_integer():
        return int(v)
    if isinstance(v, str) and v.lstrip("-").isdigit():
        return int(v)
    return v


def _same(v: Any) -> Any:
    return v


def _real(v: Any) -> Any:
    return float(v) if isinstance(v, int) else v


# asyncpg wants each parameter of its own type, where SQLite takes any value in any column.
# The store passes the types its columns hold; a value of another type (an id as text, a
# whole float for an integer) is converted to the type PostgreSQL inferred for the parameter,
# on the rare call asyncpg refuses (`_coerced`): the common one pays nothing for it (an
# `executemany` converts every row first).
_COERCE: dict[str, Callable[[Any], Any]] = {
    "text": _text, "varchar": _text, "bpchar": _text,
    "int2": _integer, "int4": _integer, "int8": _integer,
    "float4": _real, "float8": _real, "numeric": _real,
}
# statement text -> a converter per parameter (each statement prepared once to learn them)
_CONVERTERS: dict[str, list[Callable[[Any], Any]]] = {}


def _count(status: str | None) -> int:
    """The rows a command's status says it changed ("UPDATE 3", "INSERT 0 1"), else 0."""
    tail = (status or "").rpartition(" ")[2]
    return int(tail) if tail.isdigit() else 0


def _refused(exc: BaseException) -> bool:
    """asyncpg refused a parameter's value before sending anything (its own DataError, not
    the server's, which is a subclass): the statement can be tried again, converted."""
    return type(exc) is asyncpg.DataError


class Connection:
    """The store's connection (bot.store.sql.Connection) over one pooled asyncpg connection:
    each call one statement, prepared once per connection (asyncpg's statement cache)."""

    engine: Engine = "postgresql"
    keyed = True  # writers run side by side: `hold` takes an advisory lock

    def __init__(self, conn: asyncpg.Connection) -> None:
        self._conn = conn
        self._held: set[str] = set()  # the transaction's keys taken so far
        # whether a replica of a release that numbered keys by hashtextextended lives (read
        # as the transaction began): its keys are then taken its way too (OLDER_KEYS)
        self.older_keys = False
        self.memo: dict[Any, Any] = {}

    async def _coerced(self, sql: str, params: Sequence[Any]) -> list[Any]:
        convert = _CONVERTERS.get(sql)
        if convert is None:
            prepared = await self._conn.prepare(sql)
            convert = [_COERCE.get(p.name, _same) for p in prepared.get_parameters()]
            if len(_CONVERTERS) >= STATEMENTS_KEPT:
                _CONVERTERS.clear()
            _CONVERTERS[sql] = convert
        return [f(v) for f, v in zip(convert, params, strict=True)]

    async def execute(self, sql: Statement, params: Params = ()) -> int:
        text = for_postgres(sql)
        try:
            status = await self._conn.execute(text, *params)
        except asyncpg.DataError as exc:
            if not _refused(exc):
                raise
            status = await self._conn.execute(text, *await self._coerced(text, params))
        return _count(status)

    async def fetchall(self, sql: Statement, params: Params = ()) -> list[Row]:
        text = for_postgres(sql)
        try:
            rows: list[Row] = await self._conn.fetch(text, *params)
        except asyncpg.DataError as exc:
            if not _refused(exc):
                raise
            rows = await self._conn.fetch(text, *await self._coerced(text, params))
        return rows

    async def fetchone(self, sql: Statement, params: Params = ()) -> Row | None:
        text = for_postgres(sql)
        try:
            return await self._conn.fetchrow(text, *params)
        except asyncpg.DataError as exc:
            if not _refused(exc):
                raise
            return await self._conn.fetchrow(text, *await self._coerced(text, params))

    async def insert(self, sql: Statement, params: Params = ()) -> int:
        row = await self.fetchone(sql, params)
        return int(row[0]) if row is not None else 0

    async def executemany(self, sql: Statement, rows: Iterable[Params]) -> None:
        rows = list(rows)
        if not rows:
            return
        # converted first, always: a row refused partway would leave the rows before it sent
        text = for_postgres(sql)
        await self._conn.executemany(text, [await self._coerced(text, r) for r in rows])

    async def hold(self, key: str) -> None:
        """Wait for, then hold to the transaction's end, the key `key` (bot.store.db.hold); a
        key already held costs no trip to the database."""
        if key in self._held:
            return
        got = await self._conn.fetchval(
            "SELECT t.old FROM (SELECT pg_advisory_xact_lock($1::int, $2::int) AS new, "
            + _older_try(4) + " AS old) t", *lock_pair(key), RESERVED, key)
        if not got and self.older_keys:
            await self._conn.execute(OLDER_WAY, [key], RESERVED)
        self._held.add(key)

    async def begin(self, keys: list[str]) -> None:
        """A transaction's first statement, in one trip: its turn beside the first release's
        writers (while one may live), its keys (in the order given), and each tried the older
        releases' way too (held if free, so that an older replica starting meanwhile is
        excluded) up to the
        first refused, and whether an older replica lives. Only while one does, the refused
        key and those after it are waited for that way, in order, as the older release takes
        them (never holding a later one while waiting for an earlier: no cycle with it); else
        the refused key's holder is of this release, holding another key of that number, and
        the rest are tried where free."""
        params: list[Any] = [RELEASE_1_WRITE_LOCK, DEAD_AFTER] + ([RESERVED] if keys else [])
        holds, tried = "", ""
        for i, key in enumerate(keys):
            n = len(params)
            params += [*lock_pair(key), key]
            holds += f", pg_advisory_xact_lock(${n + 1}::int, ${n + 2}::int)"
            tried += f" WHEN NOT {_older_try(n + 3)} THEN {i}"
        got = f"CASE{tried} ELSE {len(keys)} END" if keys else "0"
        row = await self._conn.fetchrow(
            f"SELECT {OLDER_KEYS} AS older, t.got FROM (SELECT CASE WHEN {RELEASE_1_MAY_LIVE}"
            f" THEN pg_advisory_xact_lock_shared($1) END{holds}, {got} AS got) t", *params)
        assert row is not None
        self.older_keys = bool(row["older"])
        rest = keys[int(row["got"]):]
        if rest and self.older_keys:
            await self._conn.execute(OLDER_WAY, rest, RESERVED)
        elif len(rest) > 1:
            await self._conn.execute(OLDER_TRY, rest[1:], RESERVED)
        self._held.update(keys)


def _older_try(at: int) -> str:
    """SQL: the key in parameter `at` tried the older releases' way (the fixed numbers, in
    parameter 3, count as got: never taken so)."""
    old = f"hashtextextended(${at}, 0)"
    return f"({old} = ANY($3::bigint[]) OR pg_try_advisory_xact_lock({old}))"


NamedLockLost = lease.NamedLockLost


def named_lock_lane(key: str) -> int:
    """The lane (of NAMED_LOCK_LANES) the named lock `key` is taken on; its second hold is on
    the next lane. Stable: a key meets itself on one session of a replica."""
    return named_lock_pair(key)[1] % NAMED_LOCK_LANES


@dataclass(eq=False)
class _Lease:
    """A lane session's lease: `fresh_until` (this side's monotonic clock) the time up to
    which its holders write without asking; `gone` once the server said the session ended."""

    pid: int
    started: float
    fresh_until: float
    gone: bool = False


@dataclass(eq=False)
class _Hold:
    """A named lock this replica holds: on lane `first` its own lock (`ways`: the older
    releases' ways too, on the same session), on lane `second` its second hold; and the task
    that holds it, stopped should either session be cut."""

    key: str
    first: int
    session: asyncpg.Connection
    ways: list[int]
    second: int = 0
    second_session: asyncpg.Connection | None = None
    holder: asyncio.Task[Any] | None = None
    lost: bool = False  # a session of it was cut
    cancelled: bool = False  # its holder cancelled for it, not yet told why
    # the first session's lease, and how to renew it now (the fence, `check`)
    lease: _Lease | None = None
    renew: Callable[[], Awaitable[None]] | None = None
    released: bool = False  # let go: out of every fence (a task it started may outlive it)

    async def check(self) -> None:
        """The fence (bot.store.lease): passes while the first session's lease is fresh or
        once the lock was let go; else waits for a renewal; raises once the session is gone
        (a taker elsewhere waits out the lease before it goes on)."""
        while not self.released and self.lease is not None and self.renew is not None:
            if self.lease.gone:
                raise NamedLockLost(f"named lock {self.key!r}: the server ended its session;"
                                    " another replica may hold it now")
            if time.monotonic() < self.lease.fresh_until:
                return
            await self.renew()

    def cut_told(self) -> bool:
        """Whether the CancelledError its holder meets is the cut's alone (then told)."""
        if not self.cancelled:
            return False
        self.cancelled = False
        assert self.holder is not None
        return self.holder.uncancel() == 0


@dataclass(eq=False)
class _Lane:
    """One of a replica's NAMED_LOCK_LANES sessions for named locks: one short statement at
    a time (`turn`), so keys of other lanes never queue behind its keys."""

    session: asyncpg.Connection | None = None
    turn: asyncio.Lock = field(default_factory=asyncio.Lock)
    holds: set[_Hold] = field(default_factory=set)  # holding a lock on the session
    # holds whose lock on this lane's lost session is gone, their holders not stopped yet: the
    # lane takes no lock again until they have (`PostgresStore._turn`)
    stopping: set[_Hold] = field(default_factory=set)
    stopped: asyncio.Event = field(default_factory=asyncio.Event)
    waiting: dict[asyncio.Future[None], tuple[int, int]] = field(default_factory=dict)
    looker: asyncio.Task[None] | None = None  # looks for `waiting`'s locks, while any
    lease: _Lease | None = None  # `session`'s


# A replica's host that vanishes (powered off, cut off) closes none of its sessions: the server
# would keep them, and the locks they hold (a transaction's keys and rows, named locks), for
# as long as the kernel's TCP keepalive (2 hours by default). Asked of the server for each
# session: probe an idle peer after 5 s, give up after 3 unanswered probes or 8 s of
# unacknowledged data. (Unix-socket sessions ignore them: their peer cannot vanish.)
VANISHED_PEER = {"tcp_keepalives_idle": "5", "tcp_keepalives_interval": "1",
                 "tcp_keepalives_count": "3", "tcp_user_timeout": "8000"}
# A replica that stalls (SIGSTOP, a frozen VM, swapping) inside a transaction holds its keys
# and rows while its host still answers keepalives. No transaction of the store awaits
# anything but the database, so one idle inside a transaction this long has stalled: the
# server ends its session, and what it held goes. And no statement waits longer than
# LOCK_WAIT for a lock: it fails, and the work it was part of is retried.
IDLE_IN_TRANSACTION = 4.0  # under DEAD_AFTER: what it held goes before it is taken for dead
LOCK_WAIT = 15.0
# JIT off: no statement of the store runs long enough to gain from compiling it, and one whose
# estimated cost crosses jit_above_cost (a large table, a catalog query such as asyncpg's type
# introspection) would spend milliseconds compiling first.
SESSION = {**VANISHED_PEER,
           "idle_in_transaction_session_timeout": str(int(IDLE_IN_TRANSACTION * 1000)),
           "lock_timeout": str(int(LOCK_WAIT * 1000)), "jit": "off"}
# A delivery's payload (a GitHub event, 5-25 KB of JSON), a mail's body, a ledger entry's data:
# values over 2 KB are compressed as they are stored. PostgreSQL's own compression (pglz)
# cost the server about 230 us a 12 KB issues.opened payload queued, lz4 75 (2,000 rows, one
# executemany, PostgreSQL 15), and lz4 reads back faster too. Asked of each session where
# the server has lz4 (PostgreSQL 14 and later, built with it, as Debian's and the wheels' are);
# values already stored are read either way.
FAST_COMPRESSION = {"default_toast_compression": "lz4"}
# readiness: the tables every delivery writes, and how long the probe waits to write them
HOT_TABLES = ("deliveries", "queue", "mails", "ledger")
PROBE_WAIT = 1.0
# connections of the pool kept for reads outside transactions: a transaction that reads
# through the store (not its own connection) must find one free, however many are writing
READS_KEPT = 4


# The array types the store's statements pass. asyncpg knows no codec for an array type until it
# has asked the server (its type introspection: a catalog query a new session plans cold, about
# 10-17 ms of the server's time, then the statement prepared again) and asks once per type set a
# statement brings, per connection: bench.replicas' 1-replica cell made 44 such asks, 0.86 s of
# the server's time (pg_stat_statements with track_planning). A new pooled connection asks for
# all of them at once, before it serves anything (`_knows_the_arrays`).
ARRAYS_PASSED = "SELECT $1::bigint[], $2::float8[], $3::int[], $4::text[]"


async def _knows_the_arrays(conn: asyncpg.Connection) -> None:
    await conn.fetchrow(ARRAYS_PASSED, None, None, None, None)


# PostgreSQL's first OID for what is made after initdb: below it the built-in types, the same
# on every server and in every database
FIRST_NORMAL_OID = 16384
# asyncpg's look-ups of built-in types (the rows, and the statement that read them), once a
# process for every session of the store (_Session)
_BUILT_IN_TYPES: dict[frozenset[int], Any] = {}


class _Session(asyncpg.Connection):  # type: ignore[misc]
    """A session of the store. asyncpg looks up, on each new session, every type a statement
    uses that it has no codec for: the store's int[], bigint[] and float8[] parameters among
    them, as asyncpg knows only text[] and oid[] of the arrays by heart (MagicStack/asyncpg
    #1272). Each look-up is a catalog query and three round trips around it, ~10 ms of the
    server's CPU on a fresh session, and a replica opens sessions as its load grows and after
    every outage (the tests: about six a test, 100 ms of each PostgreSQL test; a pooled one
    asks once, `_knows_the_arrays`). Built-in types are the same everywhere: what one session
    of the process learnt of them, every later one takes as it is, asking the server nothing.
    (`_introspect_types` is asyncpg's own, 0.30-0.32: the rows it registers, and the statement
    that read them, whose name alone it reads. tests/test_store_pool.py holds it to that.)"""

    async def _introspect_types(self, typeoids: Any, timeout: Any) -> Any:
        key = frozenset(typeoids)
        if not key or max(key) >= FIRST_NORMAL_OID:
            return await super()._introspect_types(typeoids, timeout)
        known = _BUILT_IN_TYPES.get(key)
        if known is None:
            known = _BUILT_IN_TYPES[key] = await super()._introspect_types(typeoids, timeout)
        return known


class _Pooled(_Session):
    """A connection of the store's pool, handed back with nothing to undo. The store keeps no
    session state on these: its advisory locks are its transactions' and `SET LOCAL` ends with
    them, while LISTEN and the session's named locks have connections of their own. So asyncpg's
    reset query (unlock every advisory lock, CLOSE ALL, UNLISTEN *, RESET ALL), one more round
    trip each time a connection goes back, about nine an event, is not sent. A transaction left
    open is still rolled back (asyncpg does that before the reset query)."""

    def get_reset_query(self) -> str:
        return ""


class PostgresStore(Store):
    engine = "postgresql"

    def __init__(self, url: str, pool: asyncpg.Pool, max_size: int = 20) -> None:
        super().__init__()
        self._url = url
        self._pool = pool
        self._writers = asyncio.Semaphore(max(1, max_size - READS_KEPT))
        self._listener: asyncpg.Connection | None = None
        # the sessions holding this replica's named locks: they end with the replica (a
        # SIGKILL too), and so do its named locks
        self._lanes = [_Lane() for _ in range(NAMED_LOCK_LANES)]
        self._letting_go: set[asyncio.Future[None]] = set()  # unlocks after a cancelled try
        self._on_broadcast: Callable[[list[str]], None] | None = None
        self._on_gap: Callable[[], None] | None = None
        self._relisten: asyncio.Future[None] | None = None  # while the listener reconnects
        self._closing = False
        self._renewer: asyncpg.Connection | None = None  # renews the lanes' leases
        self._renewing: asyncio.Task[None] | None = None  # every RENEW, once a lane opened
        self._renewal: asyncio.Future[None] | None = None  # the one under way

    @classmethod
    async def open(cls, url: str, min_size: int = 2, max_size: int = 20) -> PostgresStore:
        lz4 = await _migrate(url)
        pool = await asyncpg.create_pool(url, min_size=min_size, max_size=max_size,
                                         server_settings=SESSION | (FAST_COMPRESSION if lz4
                                                                    else {}),
                                         connection_class=_Pooled, init=_knows_the_arrays,
                                         statement_cache_size=STATEMENTS_KEPT)
        return cls(url, pool, max_size)

    async def close(self) -> None:
        self._closing = True
        if self._relisten is not None:
            self._relisten.cancel()
            await asyncio.gather(self._relisten, return_exceptions=True)
        for lane in self._lanes:
            if lane.looker is not None:
                lane.looker.cancel()
        for task in (self._renewing, self._renewal):
            if task is not None:
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
        await self._end_leases()
        for conn in (self._listener, self._renewer, *(lane.session for lane in self._lanes)):
            if conn is not None:
                with contextlib.suppress(Exception):
                    await conn.close()
        await self._pool.close()

    @asynccontextmanager
    async def transaction(self, *keys: str) -> AsyncIterator[Connection]:
        """A write transaction, side by side with every other replica's: commit on success,
        roll back on error. With `keys`, it first takes each: this process's turn at it, then
        the database's advisory lock (each in `key_order`, so two transactions taking the
        same keys never wait for each other in a circle)."""
        async with self._turns(keys) as ordered, self._writers, self._pool.acquire() as conn, \
                conn.transaction():
            db = Connection(conn)
            await db.begin(ordered)
            yield db
        self.write_transactions += 1  # (its body ran to the end: it commits)

    @asynccontextmanager
    async def beat(self) -> AsyncIterator[Connection]:
        """The heartbeat's transaction: waits for no writer's turn or key (writers held up by
        a stalled replica's keys must not make this one look dead)."""
        async with self._pool.acquire() as conn, conn.transaction():
            yield Connection(conn)

    async def check_writable(self) -> None:
        """Raises when no write could be made now: the database is a standby (read-only), or
        another session has held, for longer than a probe waits, a lock that keeps every
        write out of the tables the hot path writes (a CREATE INDEX, ALTER TABLE, VACUUM FULL
        or LOCK TABLE). The probe takes the lock a write takes, and writes nothing."""
        async with self._pool.acquire() as conn, conn.transaction():
            if await conn.fetchval("SELECT pg_is_in_recovery()"):
                raise RuntimeError("read-only: the database is a standby (point DATABASE_URL "
                                   "at the primary)")
            await conn.execute(f"SET LOCAL lock_timeout = '{int(PROBE_WAIT * 1000)}ms'")
            try:
                await conn.execute(f"LOCK TABLE {', '.join(HOT_TABLES)} IN ROW EXCLUSIVE MODE")
            except asyncpg.LockNotAvailableError:
                raise RuntimeError(
                    f"database is locked: another session has kept writes out of the index's "
                    f"tables ({', '.join(HOT_TABLES)}) for over {PROBE_WAIT:.0f} s (a CREATE "
                    "INDEX, ALTER TABLE, VACUUM FULL or LOCK TABLE?)") from None

    async def fetchall(self, sql: Statement, params: Params = ()) -> list[Row]:
        async with self._pool.acquire() as conn:
            return await Connection(conn).fetchall(sql, params)

    async def fetchone(self, sql: Statement, params: Params = ()) -> Row | None:
        async with self._pool.acquire() as conn:
            return await Connection(conn).fetchone(sql, params)

    # -- named locks across replicas ---------------------------------------------------------
    # A replica takes its named locks on NAMED_LOCK_LANES sessions of its own ("lanes"), each
    # one statement at a time: a key's lock on its lane (`named_lock_lane`, the older
    # releases' ways beside it), then its second hold on the next lane, each a try. Waits for
    # locks another replica holds are one look a lane every NAMED_LOCK_POLL for all of that
    # lane's waiters. Should a lane's session be cut (a killed backend; a database restart
    # cuts them all), every holder of a lock on it is stopped where it awaits (NamedLockLost)
    # before its other hold is let go and before the lane takes any lock again: another
    # replica, which takes both in order, gets the lock only once the holder has stopped.

    @asynccontextmanager
    async def named_lock(self, key: str) -> AsyncIterator[None]:
        """One holder of `key` among every replica: this process's tasks queue in memory, and
        the one at the front tries the database's advisory locks until no other replica holds
        them. Raises NamedLockLost in the holder should a session holding them be cut."""
        async with self._local_lock(key):
            while True:
                attempt = asyncio.ensure_future(self._try_named(key))
                try:
                    hold = await asyncio.shield(attempt)
                except asyncio.CancelledError:
                    # the database may grant it after all: let it go then, or it stays held
                    attempt.add_done_callback(self._let_go_late)
                    raise
                if hold is not None:
                    break
                await self._until_looked_free(named_lock_lane(key), named_lock_pair(key))
            holder = asyncio.current_task()
            assert holder is not None
            hold.holder = holder
            try:
                sessions = ((hold.first, hold.session), (hold.second, hold.second_session))
                if any(self._lanes[n].session is not s for n, s in sessions):
                    raise NamedLockLost(f"named lock {key!r}: its session was cut as it was"
                                        " taken")
                for n, _ in sessions:
                    self._lanes[n].holds.add(hold)
                with lease.holding(hold):
                    yield
            except asyncio.CancelledError:
                if hold.cut_told():  # (cancelled by `_lane_cut` alone)
                    raise NamedLockLost(f"named lock {key!r}: its session was cut while held;"
                                        " another replica may take it now") from None
                raise
            finally:
                await self._leave(hold)

    async def _leave(self, hold: _Hold) -> None:
        """Let go of `hold` as its holder leaves. A cut heard once its work was done (after
        its last await) stops nothing: its holder is not cancelled for it."""
        hold.released = True
        for n in (hold.first, hold.second):  # (at once: no cut cancels its holder from here)
            self._lanes[n].holds.discard(hold)
        letting_go = asyncio.ensure_future(self._let_go(hold))
        while True:
            try:
                await asyncio.shield(letting_go)
                return
            except asyncio.CancelledError:
                if not hold.cut_told():
                    raise

    @asynccontextmanager
    async def _turn(self, n: int) -> AsyncIterator[asyncpg.Connection]:
        """Lane `n`'s session, one statement at a time; opened again once every holder of a
        lock on the one cut has stopped."""
        lane = self._lanes[n]
        while True:
            while lane.stopping:
                lane.stopped.clear()
                await lane.stopped.wait()
            async with lane.turn:
                if lane.session is not None and lane.session.is_closed():
                    self._lane_cut(n, lane.session)  # (before its listener was called)
                if lane.stopping:
                    continue
                if lane.session is None:
                    session = await asyncpg.connect(self._url, server_settings={
                        **SESSION, "application_name": f"vaultmail locks {self.replica_id}"},
                        connection_class=_Session)
                    try:
                        sent = time.monotonic()
                        row = await session.fetchrow(LANE_LEASE, self.replica_id, n, LEASE)
                    except BaseException:
                        session.terminate()
                        raise
                    assert row is not None
                    session.add_termination_listener(functools.partial(self._lane_cut, n))
                    lane.session = session
                    lane.lease = _Lease(row["pid"], row["started"], sent + LEASE - LEASE_MARGIN)
                    if self._renewing is None and not self._closing:
                        self._renewing = asyncio.ensure_future(self._renew_every())
                yield lane.session
                return

    def _lane_cut(self, n: int, session: object) -> None:
        """Lane `n`'s session `session` is gone, and the locks it held: stop their holders."""
        lane = self._lanes[n]
        if session is not lane.session:
            return  # (one of its earlier sessions: done with)
        lane.session = None
        if lane.lease is not None:
            lane.lease.gone = True  # (its lock's other tasks are refused at their fence)
        for hold in lane.holds:
            lane.stopping.add(hold)
            if not hold.lost and hold.holder is not None:
                hold.lost = hold.cancelled = True
                hold.holder.cancel()
        lane.holds.clear()

    async def _try_named(self, key: str) -> _Hold | None:
        """`key` now held by this replica, or None if another holds it (either hold, or an
        older release's way while a replica of that release lives)."""
        first = named_lock_lane(key)
        async with self._turn(first) as session:
            # (the subquery, volatile, runs first and once: the older ways are tried only
            # once this way is got; all in one trip)
            row = await session.fetchrow(NAMED_TRY, *named_lock_pair(key), key, NAMED_SEED,
                                         NAMED_LOCKS, RESERVED, DEAD_AFTER)
            if row is None or not row["got"]:
                return None
            way1, way2 = row["way1"], row["way2"]
            ways = [way for way, got in ((1, way1), (2, way2)) if got]
            if (not way1 and row["before16"]) or (way2 is False and row["schema16"]):
                # a live replica of an older release may hold it its way
                await self._unlock_ways(session, key, ways)
                return None
            hold = _Hold(key, first, session, ways, second=(first + 1) % NAMED_LOCK_LANES,
                         lease=self._lanes[first].lease, renew=self._renew)  # (`session`'s)
        try:
            async with self._turn(hold.second) as second:
                row = await second.fetchrow(NAMED_TRY_SECOND, *named_lock_second_pair(key),
                                            first)
            if row is not None and row["got"] and row["dead_lease"] is not None:
                # a holder elsewhere, cut off, may write until its lease ends: wait it out
                log.warning("named lock %r: waiting %.1fs for the lease of a session the server"
                            " ended to run out", key, row["dead_lease"])
                await asyncio.sleep(row["dead_lease"])
        except BaseException:
            await asyncio.shield(self._let_go(hold))
            raise
        if row is None or not row["got"]:  # (its holder elsewhere is being stopped)
            await self._let_go(hold)
            return None
        hold.second_session = second
        return hold

    async def _until_looked_free(self, n: int, pair: tuple[int, int]) -> None:
        """Returns once lane `n`'s look finds the lock `pair` free (or cannot look)."""
        lane = self._lanes[n]
        free = asyncio.get_running_loop().create_future()
        lane.waiting[free] = pair
        if lane.looker is None:
            lane.looker = asyncio.ensure_future(self._look(n))
        try:
            await free
        finally:
            lane.waiting.pop(free, None)

    async def _look(self, n: int) -> None:
        """Every NAMED_LOCK_POLL while any waits on lane `n`: one look for all its waiters."""
        lane = self._lanes[n]
        try:
            while lane.waiting:
                await asyncio.sleep(NAMED_LOCK_POLL)
                waiting = list(lane.waiting.items())
                try:
                    async with self._turn(n) as session:
                        free = {r["n"] - 1 for r in await session.fetch(
                            NAMED_LOOK, [h for _, (h, _) in waiting],
                            [low for _, (_, low) in waiting])}
                except Exception:  # noqa: BLE001 - cut, away: each waiter tries and is told
                    free = set(range(len(waiting)))
                for i, (waiter, _) in enumerate(waiting):
                    if i in free and not waiter.done():
                        waiter.set_result(None)
        finally:
            lane.looker = None

    def _let_go_late(self, attempt: asyncio.Future[_Hold | None]) -> None:
        """A cancelled try's hold, let go of once it is known."""
        if attempt.cancelled() or attempt.exception() is not None:
            return
        hold = attempt.result()
        if hold is not None:
            task = asyncio.ensure_future(self._let_go(hold))
            self._letting_go.add(task)
            task.add_done_callback(self._letting_go.discard)

    async def _let_go(self, hold: _Hold) -> None:
        """Let go of each hold of `hold` on a session not cut (a cut one's went with it), then
        let its lanes take locks again."""
        async def unlock(n: int, session: asyncpg.Connection | None, second: bool) -> None:
            lane = self._lanes[n]
            if session is None or session is not lane.session:
                return
            async with lane.turn:
                if session is not lane.session:
                    return
                with contextlib.suppress(Exception):  # (cut meanwhile: its locks went too)
                    if second:
                        await session.fetchval("SELECT pg_advisory_unlock($1::int, $2::int)",
                                               *named_lock_second_pair(hold.key))
                    else:
                        await self._unlock_ways(session, hold.key, hold.ways)

        try:
            for n in (hold.first, hold.second):
                self._lanes[n].holds.discard(hold)
            await asyncio.gather(unlock(hold.first, hold.session, False),
                                 unlock(hold.second, hold.second_session, True))
        finally:
            for n in (hold.first, hold.second):
                lane = self._lanes[n]
                lane.stopping.discard(hold)
                if not lane.stopping:
                    lane.stopped.set()

    # -- the lanes' leases -------------------------------------------------------------------
    # Each lane session has a lease row (LANE_LEASE), renewed every RENEW on a connection of
    # its own for as long as the server shows the session alive. A holder's fence passes
    # without asking while the lease is fresh (`_Hold.check`), else waits for a renewal; a
    # renewal that finds a session gone ends it here as cut (`_lane_cut`: its holders are
    # stopped). A replica that gets a lock a dead session held waits that session's lease out
    # first (NAMED_TRY_SECOND): the holder, never told, writes no more by then.

    async def _renew_every(self) -> None:
        while True:
            await asyncio.sleep(RENEW)
            await self._renew()

    async def _renew(self) -> None:
        """One renewal of every lane's lease, shared by all who ask while it is under way."""
        if self._renewal is None or self._renewal.done():
            self._renewal = asyncio.ensure_future(self._renew_leases())
        await asyncio.shield(self._renewal)

    async def _renew_leases(self) -> None:
        pause = 0.2
        while True:
            leases = [(n, lane.lease) for n, lane in enumerate(self._lanes)
                      if lane.lease is not None and not lane.lease.gone]
            if not leases:
                return
            sent = time.monotonic()
            try:
                if self._renewer is None or self._renewer.is_closed():
                    self._renewer = await asyncpg.connect(
                        self._url, server_settings=VANISHED_PEER, timeout=RENEW_WAIT,
                        connection_class=_Session)
                rows = await asyncio.wait_for(self._renewer.fetch(
                    RENEW_LEASES, self.replica_id, [x.pid for _, x in leases],
                    [x.started for _, x in leases], [n for n, _ in leases], LEASE), RENEW_WAIT)
            except Exception as exc:  # noqa: BLE001 - away, slow, cut: asked again, never given up
                log.warning("cannot renew the named locks' leases; trying again: %r", exc)
                if self._renewer is not None:
                    self._renewer.terminate()
                    self._renewer = None
                await asyncio.sleep(pause)
                pause = min(5.0, pause * 2)
                continue
            alive = {(r["pid"], r["started"]) for r in rows}
            for n, x in leases:
                lane = self._lanes[n]
                if (x.pid, x.started) in alive:
                    x.fresh_until = max(x.fresh_until, sent + LEASE - LEASE_MARGIN)
                elif lane.lease is x and lane.session is not None:
                    session = lane.session
                    log.warning("named locks: the server ended lane %d's session", n)
                    self._lane_cut(n, session)  # (marks the lease gone)
                    session.terminate()
                else:
                    x.gone = True
            return

    async def _end_leases(self) -> None:
        """At close: the leases of lanes that hold nothing are let go at once (a replica
        taking a lock they held waits for none of them)."""
        idle = [lane.lease for lane in self._lanes
                if lane.lease is not None and not lane.lease.gone and not lane.holds
                and not lane.stopping]
        if not idle:
            return
        with contextlib.suppress(Exception):
            async with asyncio.timeout(PROBE_WAIT):
                async with self._pool.acquire() as conn:
                    await conn.execute("DELETE FROM lane_leases WHERE (pid, started) IN"
                                       " (SELECT * FROM unnest($1::bigint[], $2::float8[]))",
                                       [x.pid for x in idle], [x.started for x in idle])

    @staticmethod
    async def _unlock_ways(session: asyncpg.Connection, key: str, ways: list[int]) -> None:
        """Let go of the named lock `key` this way, and the older `ways` it was taken."""
        await session.fetchval("SELECT pg_advisory_unlock($1::int, $2::int)",
                               *named_lock_pair(key))
        if 1 in ways:
            await session.fetchval("SELECT pg_advisory_unlock($1, hashtext($2))",
                                   NAMED_LOCKS, key)
        if 2 in ways:
            await session.fetchval("SELECT pg_advisory_unlock(hashtextextended($1, $2))",
                                   key, NAMED_SEED)

    # -- wake-ups across replicas ----------------------------------------------------------

    async def broadcast(self, keys: Iterable[str]) -> None:
        """Tell every other replica that something is new under `keys` (NOTIFY's payload is
        at most 8000 bytes: long lists go in several)."""
        keys = sorted(set(keys))
        chunks: list[list[str]] = [[]]
        for key in keys:
            if sum(len(k) + 4 for k in chunks[-1]) + len(key) > 6000:
                chunks.append([])
            chunks[-1].append(key)
        async with self._pool.acquire() as conn:
            for chunk in chunks:
                if chunk:
                    payload = json.dumps({"from": self.replica_id, "keys": chunk})
                    await conn.execute("SELECT pg_notify($1, $2)", CHANNEL, payload)

    async def listen(self, on_keys: Callable[[list[str]], None],
                     on_gap: Callable[[], None] | None = None) -> None:
        """Call `on_keys` with what other replicas broadcast, from now on. Should the session
        that listens be cut (a database restart), it is opened again, and `on_gap` is called
        once it is: what was broadcast meanwhile was not heard."""
        self._on_broadcast = on_keys
        self._on_gap = on_gap
        await self._open_listener()

    async def _open_listener(self) -> None:
        conn = await asyncpg.connect(self._url, server_settings=VANISHED_PEER,
                                     connection_class=_Session)
        try:
            await conn.add_listener(CHANNEL, self._heard)
        except BaseException:
            conn.terminate()  # (cut again before it listened: the next try opens another)
            raise
        conn.add_termination_listener(self._listener_cut)
        self._listener = conn

    def _listener_cut(self, _conn: object) -> None:
        if not self._closing and self._relisten is None:
            self._relisten = asyncio.ensure_future(self._listen_again())

    async def _listen_again(self) -> None:
        pause = 0.2
        try:
            while not self._closing:
                try:
                    await self._open_listener()
                except Exception as exc:  # noqa: BLE001 - down, refused, cut: all retried
                    log.warning("cannot listen for other replicas' wake-ups; trying again in"
                                " %.1fs: %r", pause, exc)
                    await asyncio.sleep(pause)
                    pause = min(5.0, pause * 2)
                    continue
                if self._on_gap is not None:
                    self._on_gap()
                return
        finally:
            self._relisten = None

    def _heard(self, _conn: object, _pid: int, _channel: str, payload: str) -> None:
        try:
            message = json.loads(payload)
        except ValueError:
            return
        if message.get("from") != self.replica_id and self._on_broadcast is not None:
            self._on_broadcast([str(k) for k in message.get("keys", [])])


async def _migrate(url: str, upto: int | None = None) -> bool:
    """Every version not yet recorded (up to `upto`: an older release's index, for tests), in
    order, each in a transaction, under an advisory lock (replicas starting together: one
    applies, the others find it done). Returns whether the server compresses with lz4
    (FAST_COMPRESSION)."""
    conn = await asyncpg.connect(url)
    try:
        lz4 = bool(await conn.fetchval(
            "SELECT 'lz4'=ANY(enumvals) FROM pg_settings WHERE name='default_toast_compression'"))
        await conn.execute("SELECT pg_advisory_lock($1)", MIGRATE_LOCK)
        await conn.execute(ddl(MIGRATIONS_TABLE, "postgresql"))
        done = {r["version"] for r in await conn.fetch("SELECT version FROM schema_migrations")}
        for m in migrations():
            if m.version in done or (upto is not None and m.version > upto):
                continue
            async with conn.transaction():
                for script in m.postgres:
                    if script.strip():
                        await conn.execute(script)
                for table, columns in m.columns.items():
                    for name, decl in columns.items():
                        await conn.execute(f"ALTER TABLE {table} ADD COLUMN IF NOT EXISTS"
                                           f" {name} {column(decl, 'postgresql')}")
                for script in m.postgres_after:
                    await conn.execute(script)
                await conn.execute("INSERT INTO schema_migrations(version, name, applied_at)"
                                   " VALUES ($1, $2, $3)", m.version, m.name, time.time())
            log.info("index schema now at version %d: %s", m.version, m.name)
        return lz4
    finally:
        with contextlib.suppress(Exception):
            await conn.execute("SELECT pg_advisory_unlock($1)", MIGRATE_LOCK)
        await conn.close()

