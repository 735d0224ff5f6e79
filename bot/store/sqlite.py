"""The SQLite engine: the embedded default, one process, one file (WAL)."""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import logging
import os
import sqlite3
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Iterable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any, TypeVar, cast

import aiosqlite

from bot.private_files import narrow, private_dir, private_file
from bot.store.db import Store
from bot.store.migrations import MIGRATIONS_TABLE, column, migrations
from bot.store.sql import Connection as StoreConnection
from bot.store.sql import Engine, Params, Row, Statement, ddl, for_sqlite

log = logging.getLogger("vaultmail.store")

# SQLite's own checkpoints run inside whichever commit crosses the WAL's size, on the one
# connection every write waits for, and fsync the database file: a 20-70 ms stall for the
# webhook answers queued behind it (bench.intake). The Checkpointer does them from a
# connection of its own instead; SQLite's remains only as a backstop, at 10x the default.
AUTOCHECKPOINT_PAGES = 1000
CHECKPOINT_EVERY = 0.05  # seconds between background checkpoints while writes come in
# The connection's page cache, in KiB (SQLite's default is 2 MiB). With 2 MiB the pages a
# delivery's writes touch (a dozen tables and their indexes) were read back from the file
# again and again: bench.probot_compare's cell of 400 deliveries made 10,000 preads, 4,500
# (the checkpointer's own) with 16 MiB. Pages are taken as the index is read, up to this.
CACHE_KIB = 16 * 1024


def _statements(script: str) -> list[str]:
    """A script's statements (triggers whole), for running them inside one transaction."""
    out, buf = [], ""
    for line in script.splitlines(keepends=True):
        buf += line
        if sqlite3.complete_statement(buf):
            out.append(buf.strip())
            buf = ""
    if buf.strip():
        out.append(buf.strip())
    return out


class IndexInUse(RuntimeError):
    """Another process serves this SQLite index: two would each run the queue alone (the
    engine's one writer is per process), doubling what they handle."""


_OWNED: dict[str, int] = {}  # index path -> the open lock file this process holds


def own_index(path: Path) -> None:
    """Hold `path` for this process, for as long as it lives: an exclusive lock on
    `<index>.lock` (the kernel lets it go when the process ends, however it ends). Raises
    IndexInUse, naming the holder, when another process holds it. Commands that only read or
    write a row (`vaultmail token`, `ledger`, `reindex`) do not take it."""
    import fcntl

    key = str(path.resolve())
    if key in _OWNED:
        return
    if not path.parent.exists():
        private_dir(path.parent)
    lock = path.with_name(path.name + ".lock")
    fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "unknown"
        os.close(fd)
        raise IndexInUse(
            f"the index {path} is served by another process (pid {holder}): stop it first "
            "(a deploy starts the new one after the old has exited), or give this one "
            "another --data; several replicas share PostgreSQL (DATABASE_URL)") from None
    os.ftruncate(fd, 0)
    os.pwrite(fd, str(os.getpid()).encode(), 0)
    _OWNED[key] = fd


def _private_index(path: Path) -> None:
    """The index is the app's alone: its directory made 0700 when it is made here, the file
    made 0600 before SQLite opens it (SQLite gives its -wal and -shm the file's mode), and
    those of an older release narrowed to 0600."""
    if not path.parent.exists():
        private_dir(path.parent)
    private_file(path)
    for suffix in ("-wal", "-shm", "-journal"):
        narrow(path.with_name(path.name + suffix))


OPEN_WAIT = 30.0  # seconds an opening waits for another process's lock (sqlite3's 5 s ran out)


async def _write_ahead_log(db: aiosqlite.Connection) -> None:
    """The index in WAL mode. Turning a rollback-journal index (the first release's) to WAL
    needs it alone, and SQLite answers "database is locked" at once, not after the
    connection's wait, while another connection holds a write open on it (another replica or
    command migrating it as it opens): asked again until that write ends, as long as a lock
    is waited for."""
    deadline = time.monotonic() + OPEN_WAIT
    pause = 0.01
    while True:
        try:
            await db.execute("PRAGMA journal_mode=WAL")
            return
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) or time.monotonic() + pause > deadline:
                raise
        await asyncio.sleep(pause)
        pause = min(0.5, pause * 2)


def _migrate_file(path: str, upto: int | None = None) -> None:
    conn = sqlite3.connect(path, timeout=OPEN_WAIT, isolation_level=None)
    try:
        _migrate(conn, upto)
    finally:
        conn.close()


def _migrate(conn: sqlite3.Connection, upto: int | None = None) -> None:
    """Every version not yet recorded (up to `upto`: an older release's index, for tests),
    in order, in one transaction under the write lock."""
    conn.execute("BEGIN IMMEDIATE")
    try:
        conn.execute(ddl(MIGRATIONS_TABLE, "sqlite"))
        done = {row[0] for row in conn.execute("SELECT version FROM schema_migrations")}
        for m in migrations():
            if m.version in done or (upto is not None and m.version > upto):
                continue
            for script in m.sqlite:
                for statement in _statements(script):
                    conn.execute(statement)
            for table, columns in m.columns.items():
                have = {row[1] for row in conn.execute(f"PRAGMA table_info({table})")}
                for name, decl in columns.items():
                    if name not in have:
                        conn.execute(f"ALTER TABLE {table} ADD COLUMN {name}"
                                     f" {column(decl, 'sqlite')}")
            for script in m.sqlite_after:
                for statement in _statements(script):
                    conn.execute(statement)
            conn.execute("INSERT INTO schema_migrations(version, name, applied_at)"
                         " VALUES (?,?,?)", (m.version, m.name, time.time()))
            log.info("index schema now at version %d: %s", m.version, m.name)
    except BaseException:
        conn.execute("ROLLBACK")
        raise
    conn.execute("COMMIT")


class Checkpointer:
    """PASSIVE WAL checkpoints on a second connection, in a thread: they never take the write
    lock, so the app's connection keeps committing while pages are copied and synced."""

    def __init__(self, path: str) -> None:
        self._path = path
        self._conn: sqlite3.Connection | None = None
        self._guard = threading.Lock()  # one checkpoint or close at a time, whichever thread
        self._dirty = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self.checkpoints = 0
        self.checkpointed = asyncio.Event()  # set after each round (tests wait on it)

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name="wal-checkpoint")

    def wrote(self) -> None:
        self._dirty.set()

    async def _run(self) -> None:
        while True:
            await self._dirty.wait()
            self._dirty.clear()
            try:
                await asyncio.to_thread(self._checkpoint)
            except sqlite3.Error as exc:  # busy or locked now: the next round tries again
                log.debug("background checkpoint skipped: %s", exc)
            else:
                self.checkpointed.set()
            await asyncio.sleep(CHECKPOINT_EVERY)

    def _checkpoint(self) -> None:
        with self._guard:
            if self._conn is None:
                self._conn = sqlite3.connect(self._path, timeout=1.0, check_same_thread=False)
            self._conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchall()
            self.checkpoints += 1

    def _close(self) -> None:
        with self._guard:
            if self._conn is not None:
                self._conn.close()
                self._conn = None

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        await asyncio.to_thread(self._close)


T = TypeVar("T")


class Connection:
    """The store's connection (bot.store.sql.Connection) over aiosqlite's: each call one hop to
    the connection's thread, which runs the statement, reads what it answers and closes its
    cursor there (aiosqlite's cursor takes a hop for each)."""

    engine: Engine = "sqlite"
    keyed = False  # one writer at a time: it holds every key
    older_keys = False

    def __init__(self, db: aiosqlite.Connection) -> None:
        self._db = db
        self.memo: dict[Any, Any] = {}

    async def _hop(self, fn: Callable[..., T], sql: Statement, params: Any) -> T:
        """`fn(connection, sql, params)` in the connection's thread: one hop."""
        done = self._db._execute(fn, self._db._conn, for_sqlite(sql), params)  # type: ignore[no-untyped-call]
        return cast("T", await done)

    async def execute(self, sql: Statement, params: Params = ()) -> int:
        return await self._hop(_changes, sql, params)

    async def fetchone(self, sql: Statement, params: Params = ()) -> Row | None:
        return await self._hop(_one, sql, params)

    async def fetchall(self, sql: Statement, params: Params = ()) -> list[Row]:
        return await self._hop(_all, sql, params)

    async def insert(self, sql: Statement, params: Params = ()) -> int:
        row = await self.fetchone(sql, params)
        return int(row[0]) if row is not None else 0

    async def executemany(self, sql: Statement, rows: Iterable[Params]) -> None:
        await self._hop(_many, sql, rows)

    async def hold(self, key: str) -> None:
        return None


class _InThread(Connection):
    """The store's connection inside the connection's thread (`run_transaction`): each call
    runs its statement at once, so a body that awaits only these never suspends."""

    def __init__(self, conn: sqlite3.Connection) -> None:  # (no aiosqlite: its thread's own)
        self._conn = conn
        self.memo = {}

    async def _hop(self, fn: Callable[..., T], sql: Statement, params: Any) -> T:
        return fn(self._conn, for_sqlite(sql), params)


class AwaitedOutsideTheStore(RuntimeError):
    """A `run_transaction` body awaited something other than the store's connection."""


class _Abandoned(Exception):
    """A body whose caller was cancelled before it was kept: its writes were undone."""


@dataclass(eq=False)
class _Trip:
    """A `run_transaction` body waiting for, or in, the one writer's next trip. `taken`,
    `abandon` and `keep` are the handshake with the connection's thread: a caller cancelled
    before its body is kept has it undone, as a cancel before COMMIT undoes a transaction."""

    body: Callable[[StoreConnection], Awaitable[Any]]
    context: contextvars.Context  # the caller's (its log fields, the claim it runs under)
    done: asyncio.Future[Any]
    taken: bool = False  # handed to the connection's thread: it runs to its end
    _gate: threading.Lock = field(default_factory=threading.Lock)
    _fate: str = "open"  # then "abandoned" (by its caller) or "kept" (by the thread)

    def abandon(self) -> bool:
        """(Loop) The caller was cancelled: undo the body unless it was kept already."""
        with self._gate:
            if self._fate == "open":
                self._fate = "abandoned"
            return self._fate == "abandoned"

    @property
    def abandoned(self) -> bool:
        return self._fate == "abandoned"

    def keep(self) -> bool:
        """(Thread) The body ran: keep its writes unless its caller has gone."""
        with self._gate:
            if self._fate == "open":
                self._fate = "kept"
            return self._fate == "kept"


def _drive(body: Callable[[StoreConnection], Awaitable[T]], context: contextvars.Context,
           conn: sqlite3.Connection) -> T:
    """`body` run to its end at once: each statement it awaits runs as it is asked for."""
    coro = cast("Coroutine[Any, Any, T]", body(_InThread(conn)))
    try:
        context.run(coro.send, None)
    except StopIteration as done:
        return cast("T", done.value)
    coro.close()
    raise AwaitedOutsideTheStore(
        "a transaction run in the store's thread awaited something other than the store: "
        "run it with transaction() instead")


def _trip(conn: sqlite3.Connection, trips: list[_Trip]) -> tuple[list[tuple[bool, Any]], bool]:
    """In the connection's thread: BEGIN, each body in a savepoint of its own, COMMIT. Each
    body's outcome (True and what it returned, or False and what it raised: its writes undone,
    the others' kept), and whether a kept body changed anything. Nothing here touches the
    event loop's objects: a trip's future is the loop's to set."""
    conn.execute("BEGIN IMMEDIATE")
    out: list[tuple[bool, Any]] = []
    changed = False
    try:
        for trip in trips:
            if trip.abandoned:  # its caller has gone: not even begun (intake's pops nothing)
                out.append((False, _Abandoned()))
                continue
            conn.execute("SAVEPOINT trip")
            before = conn.total_changes
            try:
                value = _drive(trip.body, trip.context, conn)
                if not conn.in_transaction:  # the body swallowed an error SQLite ended it on
                    raise sqlite3.OperationalError(
                        "the transaction ended under a body of it (an error the body caught)")
                if not trip.keep():
                    raise _Abandoned
            except BaseException as exc:  # noqa: BLE001 - its caller's, not the trip's
                if not conn.in_transaction:  # SQLite undid it all (disk full, I/O): say why
                    raise
                conn.execute("ROLLBACK TO trip")
                out.append((False, exc))
            else:
                out.append((True, value))
                changed = changed or conn.total_changes != before
            conn.execute("RELEASE trip")
        conn.commit()
    except BaseException:
        if conn.in_transaction:
            conn.rollback()
        raise
    return out, changed


def _changes(conn: sqlite3.Connection, sql: str, params: Params) -> int:
    cur = conn.execute(sql, params)
    try:
        return cur.rowcount
    finally:
        cur.close()


def _one(conn: sqlite3.Connection, sql: str, params: Params) -> Row | None:
    cur = conn.execute(sql, params)
    try:
        return cur.fetchone()
    finally:
        cur.close()


def _all(conn: sqlite3.Connection, sql: str, params: Params) -> list[Row]:
    cur = conn.execute(sql, params)
    try:
        return cur.fetchall()
    finally:
        cur.close()


def _many(conn: sqlite3.Connection, sql: str, rows: Iterable[Params]) -> None:
    conn.executemany(sql, rows).close()


class SqliteStore(Store):
    """One aiosqlite connection; writes go through `transaction()` under one lock. One
    process owns the file: a replica of its own."""

    engine = "sqlite"

    def __init__(self, db: aiosqlite.Connection) -> None:
        super().__init__()
        self._db = db
        self._lock = asyncio.Lock()
        self._checkpointer: Checkpointer | None = None
        self._reads: list[tuple[str, Params, bool, asyncio.Future[Any]]] = []
        self._reads_queued = False
        self._trips: list[_Trip] = []  # run_transaction bodies waiting for the writer
        self._trip_writer: asyncio.Task[None] | None = None

    @classmethod
    async def open(cls, path: str | Path, *, synchronous: str = "normal") -> SqliteStore:
        if str(path) == ":memory:":  # (no second connection reaches a memory database)
            raise ValueError("the index needs a file: give a path, not :memory:")
        _private_index(Path(path))
        if synchronous.upper() not in ("NORMAL", "FULL"):
            raise ValueError(f"synchronous: {synchronous!r} is not normal or full")
        # as long as the migration's own wait: processes opening one index at once wait for
        # whichever migrates it
        db = await aiosqlite.connect(str(path), timeout=OPEN_WAIT)
        try:  # (a connection left open keeps its thread, and the process, from ending)
            db.row_factory = aiosqlite.Row
            await db.create_function("vm_now", 0, time.time)  # the store's clock
            await _write_ahead_log(db)
            await db.execute(f"PRAGMA synchronous={synchronous.upper()}")
            await db.execute("PRAGMA foreign_keys=ON")
            await db.commit()
            await asyncio.to_thread(_migrate_file, str(path))
            await db.execute(f"PRAGMA wal_autocheckpoint={AUTOCHECKPOINT_PAGES}")
            await db.execute(f"PRAGMA cache_size=-{CACHE_KIB}")
        except BaseException:
            await db.close()
            raise
        store = cls(db)
        store._checkpointer = Checkpointer(str(path))
        store._checkpointer.start()
        return store

    async def is_leader(self) -> bool:
        return True  # one process owns a SQLite index: it alone runs everything

    async def close(self) -> None:
        if self._checkpointer is not None:
            await self._checkpointer.close()
        await self._db.close()

    async def check_writable(self) -> None:
        """Raises when the index cannot take a write (readiness): takes the write lock, then
        lets it go without changing anything."""
        async with self.transaction() as db:
            await db.execute("SELECT 1")

    @asynccontextmanager
    async def transaction(self, *keys: str) -> AsyncIterator[Connection]:
        """Serialised write transaction: commit on success, roll back on error. (`keys` need
        no lock of their own: one writer at a time holds every key.)"""
        async with self._lock:
            # the BEGIN runs to its end in the connection's thread even if this task is
            # cancelled meanwhile: then undo it before the lock goes, or the next writer finds
            # a transaction already open
            begin = asyncio.ensure_future(self._db.execute("BEGIN IMMEDIATE"))
            try:
                await asyncio.shield(begin)
            except asyncio.CancelledError:
                await _unbegin(self._db, begin)
                raise
            before = self._db.total_changes
            try:
                yield Connection(self._db)  # (its own: what one transaction learns is its)
                await self._db.commit()
            except BaseException as exc:
                self._note_failure(exc)
                await self._db.rollback()
                raise
            if self._db.total_changes != before:  # a write that landed
                self.write_failure = None
            self.write_transactions += 1
            if self._checkpointer is not None:
                self._checkpointer.wrote()

    async def run_transaction(self, body: Callable[[StoreConnection], Awaitable[T]],
                              *keys: str) -> T:
        """(Store.run_transaction) In the connection's thread, in one hop. Bodies handed in
        while the one writer is busy go together in its next trip: one BEGIN and COMMIT, and
        one turn of the writer, for all of them (`_trip`: each in a savepoint of its own)."""
        trip = _Trip(body, contextvars.copy_context(),
                     asyncio.get_running_loop().create_future())
        self._trips.append(trip)
        if self._trip_writer is None:  # its own context: nothing of this caller's is others'
            self._trip_writer = asyncio.get_running_loop().create_task(
                self._write_trips(), context=contextvars.Context())
        try:
            return cast("T", await asyncio.shield(trip.done))
        except asyncio.CancelledError:
            if not trip.taken:  # not begun: nothing made, as a transaction not begun
                with contextlib.suppress(ValueError):
                    self._trips.remove(trip)
                raise
            # handed to the thread: undone unless kept already (its body ran: it stands, as
            # one a cancel during COMMIT leaves); either way the cancel lands once it is over
            trip.abandon()
            while not trip.done.done():
                with contextlib.suppress(asyncio.CancelledError):
                    await asyncio.wait([trip.done])
            if not trip.done.cancelled():
                trip.done.exception()  # (retrieved: the cancel is what the caller sees)
            raise

    async def _write_trips(self) -> None:
        stopped = False  # cancelled during a trip: it runs to its end, then the writer stops
        batch: list[_Trip] = []
        try:
            while self._trips and not stopped:
                async with self._lock:
                    batch, self._trips = self._trips[:TRIP_BATCH], self._trips[TRIP_BATCH:]
                    if not batch:  # their callers were cancelled while the writer waited
                        continue
                    for trip in batch:
                        trip.taken = True
                    try:
                        running = self._in_thread(_trip, batch)
                        while not running.done():  # (a stop waits for the thread's work)
                            try:
                                await asyncio.wait([running])
                            except asyncio.CancelledError:
                                stopped = True
                        outcomes, changed = running.result()
                    except Exception as exc:  # the trip itself failed (or never began): all
                        self._note_failure(exc)
                        for trip in batch:
                            if not trip.done.done():
                                trip.done.set_exception(exc)
                        continue
                    failed = [v for ok, v in outcomes if not ok and isinstance(v, sqlite3.Error)]
                    if failed:  # as transaction(): the file refused a body's statement
                        self._note_failure(failed[-1])
                    elif changed:  # a write that landed
                        self.write_failure = None
                    if any(ok for ok, _ in outcomes):  # (as transaction(): one that committed)
                        self.write_transactions += 1
                    if self._checkpointer is not None:
                        self._checkpointer.wrote()
                for trip, (ok, value) in zip(batch, outcomes, strict=True):
                    if trip.done.done():
                        continue
                    if ok:
                        trip.done.set_result(value)
                    else:
                        trip.done.set_exception(value)
            if stopped:
                raise asyncio.CancelledError
        finally:
            self._trip_writer = None
            for trip in [*batch, *self._trips]:  # (stopped: whoever still waits is told so)
                if not trip.done.done():
                    trip.done.cancel()
            self._trips.clear()

    def _in_thread(self, fn: Callable[..., T], *args: Any) -> asyncio.Future[T]:
        """`fn(connection, *args)` queued for the connection's thread, answered on a plain
        future: not a task, so a shutdown cancelling every task cannot let the writer go while
        the thread still runs its trip. (aiosqlite's own `_execute`, without its task.)"""
        conn = self._db._conn  # (raises once the connection is closed)
        done: asyncio.Future[T] = asyncio.get_running_loop().create_future()
        self._db._tx.put_nowait((done, partial(fn, conn, *args)))
        return done

    def _note_failure(self, exc: BaseException) -> None:
        if isinstance(exc, sqlite3.Error):  # the file refused it: the store is at fault
            self.write_failure = f"{type(exc).__name__}: {exc}"

    # Reads go to the connection's thread in batches: every read asked for in one turn of the
    # event loop (up to READ_BATCH) is executed, fetched and closed there in one hop, and
    # answered by one wake-up of the loop, instead of the three hops of aiosqlite's cursor
    # each (execute, fetch, close). When a thousand long polls wake at once, each reading its
    # inbox, those hops were most of the event loop's time (bench.inbox, profiled).
    async def fetchall(self, sql: Statement, params: Params = ()) -> list[Row]:
        rows: list[Row] = await self._read(for_sqlite(sql), params, True)
        return rows

    async def fetchone(self, sql: Statement, params: Params = ()) -> Row | None:
        row: Row | None = await self._read(for_sqlite(sql), params, False)
        return row

    def _read(self, sql: str, params: Params, every: bool) -> asyncio.Future[Any]:
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Any] = loop.create_future()
        self._reads.append((sql, params, every, future))
        if not self._reads_queued:
            self._reads_queued = True
            loop.call_soon(self._send_reads)
        return future

    def _send_reads(self) -> None:
        self._reads_queued = False
        while self._reads:
            batch, self._reads = self._reads[:READ_BATCH], self._reads[READ_BATCH:]
            done: asyncio.Future[list[tuple[bool, Any]]] = (
                asyncio.get_running_loop().create_future())
            done.add_done_callback(partial(_answer, batch))
            queries = [(sql, params, every) for sql, params, every, _ in batch]
            if not self._db._running or self._db._connection is None:  # as aiosqlite says
                done.set_exception(ValueError("Connection closed"))
            else:
                self._db._tx.put_nowait((done, partial(_fetch_all, self._db, queries)))

    @staticmethod
    def now() -> float:
        return time.time()


async def _unbegin(db: aiosqlite.Connection, begin: asyncio.Future[Any]) -> None:
    """Undo a BEGIN its task was cancelled during: wait for it to end in the connection's
    thread and roll back, whatever further cancels arrive meanwhile (the caller re-raises)."""
    while not begin.done():
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.wait([begin])
    if begin.cancelled() or begin.exception() is not None:
        return  # no transaction began
    undo = asyncio.ensure_future(db.rollback())
    while not undo.done():
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.wait([undo])
    if not undo.cancelled():
        undo.exception()  # (retrieved: a failed rollback has no one else to tell)


TRIP_BATCH = 64  # bodies in one trip at most: readers and other writers wait for no more
READ_BATCH = 256  # reads in one hop at most: a write queued behind waits for no more


def _fetch_all(db: aiosqlite.Connection,
               queries: list[tuple[str, Params, bool]]) -> list[tuple[bool, Any]]:
    """In the connection's thread: each query's rows (all, or the first), or its error."""
    out: list[tuple[bool, Any]] = []
    for sql, params, every in queries:
        try:
            cur = db._conn.execute(sql, params)
            try:
                out.append((True, cur.fetchall() if every else cur.fetchone()))
            finally:
                cur.close()
        except Exception as exc:  # noqa: BLE001 - handed to the read that made it
            out.append((False, exc))
    return out


def _answer(batch: list[tuple[str, Params, bool, asyncio.Future[Any]]],
            done: asyncio.Future[list[tuple[bool, Any]]]) -> None:
    if done.cancelled() or done.exception() is not None:
        exc = None if done.cancelled() else done.exception()
        for *_, future in batch:
            if not future.done():
                future.set_exception(exc or asyncio.CancelledError())
        return
    for (*_, future), (ok, value) in zip(batch, done.result(), strict=True):
        if future.done():  # the reader was cancelled meanwhile
            continue
        if ok:
            future.set_result(value)
        else:
            future.set_exception(value)


