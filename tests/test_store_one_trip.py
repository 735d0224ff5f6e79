"""`Store.run_transaction`: a write transaction whose body awaits only the store. SQLite runs
it whole in its connection's thread, in one hop (issue 22: "each in one trip to the database
where the engine allows"); PostgreSQL as `transaction()`. The same promises on both engines."""

from __future__ import annotations

import asyncio
import contextvars
import sqlite3
import threading
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from bot.store import Store, open_store
from bot.store.sql import Connection
from bot.store.sqlite import AwaitedOutsideTheStore

CALLER: contextvars.ContextVar[str] = contextvars.ContextVar("caller", default="nobody")


@pytest.fixture
async def store(tmp_path: Path, database_url: str) -> AsyncIterator[Store]:
    opened = await open_store(database_url or tmp_path / "index.sqlite3")
    try:
        await opened.join()
        yield opened
    finally:
        await opened.close()


async def _writes(store: Store, who: str) -> list[str]:
    rows = await store.fetchall("SELECT endpoint FROM forge_writes WHERE who=? ORDER BY at",
                                (who,))
    return [str(r[0]) for r in rows]


async def test_a_body_commits_once_with_the_callers_context(store: Store) -> None:
    """What the body writes lands in one transaction; it reads the caller's context variables
    (its log fields, the idempotency claim it runs under), and its answer comes back."""
    CALLER.set("delivery-7")
    before = store.write_transactions

    async def body(db: Connection) -> str:
        for n in range(3):
            await db.execute("INSERT INTO forge_writes(who, endpoint, content, at)"
                             " VALUES (?,?,?,?)", ("one-trip", f"{CALLER.get()}/{n}", 0, n))
        row = await db.fetchone("SELECT count(*) FROM forge_writes WHERE who=?",
                                ("one-trip",))
        assert row is not None
        return f"{row[0]} rows"

    assert await store.run_transaction(body, "budget:one-trip") == "3 rows"
    assert await _writes(store, "one-trip") == ["delivery-7/0", "delivery-7/1", "delivery-7/2"]
    assert store.write_transactions == before + 1


async def test_a_body_that_raises_leaves_nothing_written(store: Store) -> None:
    async def body(db: Connection) -> None:
        await db.execute("INSERT INTO forge_writes(who, endpoint, content, at)"
                         " VALUES (?,?,?,?)", ("raises", "half", 0, 1.0))
        raise ValueError("the body's own error")

    with pytest.raises(ValueError, match="the body's own error"):
        await store.run_transaction(body)
    assert await _writes(store, "raises") == []
    # and the store goes on: the next transaction is not inside a left-open one
    async with store.transaction() as db:
        await db.execute("INSERT INTO forge_writes(who, endpoint, content, at)"
                         " VALUES (?,?,?,?)", ("raises", "after", 0, 2.0))
    assert await _writes(store, "raises") == ["after"]


async def test_sqlite_runs_the_body_in_one_hop_off_the_event_loop(tmp_path: Path) -> None:
    """On SQLite the whole body runs in the connection's thread: no statement of it waits for
    a turn of the event loop (which, busy, held the one writer between statements)."""
    store = await open_store(tmp_path / "index.sqlite3")
    try:
        loop_thread = threading.get_ident()
        seen: list[int] = []

        async def body(db: Connection) -> None:
            for n in range(5):
                await db.execute("INSERT INTO forge_writes(who, endpoint, content, at)"
                                 " VALUES (?,?,?,?)", ("hop", str(n), 0, n))
                seen.append(threading.get_ident())

        await store.run_transaction(body)
        assert len(set(seen)) == 1 and seen[0] != loop_thread
        assert len(await _writes(store, "hop")) == 5
    finally:
        await store.close()


async def test_sqlite_refuses_a_body_that_awaits_outside_the_store(tmp_path: Path) -> None:
    """A body that waits for anything else (a sleep, a forge call) cannot run in the thread:
    refused with an error that names the fix, and what it wrote is rolled back."""
    store = await open_store(tmp_path / "index.sqlite3")
    try:
        async def body(db: Connection) -> None:
            await db.execute("INSERT INTO forge_writes(who, endpoint, content, at)"
                             " VALUES (?,?,?,?)", ("outside", "x", 0, 1.0))
            await asyncio.sleep(0)

        with pytest.raises(AwaitedOutsideTheStore, match="run it with transaction"):
            await store.run_transaction(body)
        assert await _writes(store, "outside") == []
    finally:
        await store.close()


async def test_sqlite_a_cancel_before_the_body_is_kept_undoes_it(tmp_path: Path) -> None:
    """A caller cancelled while its body runs in the thread sees the cancel only once the body
    is over, and its writes are undone: a cancel means nothing was written, as a cancel before
    COMMIT undoes a transaction (the worker and the mailer put back what a cancelled write was
    to record). The one writer is not let go of while the body still runs."""
    store = await open_store(tmp_path / "index.sqlite3")
    try:
        started, go = threading.Event(), threading.Event()

        async def body(db: Connection) -> None:
            await db.execute("INSERT INTO forge_writes(who, endpoint, content, at)"
                             " VALUES (?,?,?,?)", ("cancel", "first", 0, 1.0))
            started.set()
            go.wait(5)  # (in the store's thread, not the loop's: the caller is cancelled)
            await db.execute("INSERT INTO forge_writes(who, endpoint, content, at)"
                             " VALUES (?,?,?,?)", ("cancel", "second", 0, 2.0))

        task = asyncio.create_task(store.run_transaction(body))
        await asyncio.to_thread(started.wait, 5)
        task.cancel()
        await asyncio.sleep(0)  # (the cancel reaches the caller, which abandons the body)
        go.set()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert await _writes(store, "cancel") == []
        assert store.write_failure is None
    finally:
        await store.close()


async def test_sqlite_a_cancel_while_others_bodies_run_undoes_its_own_alone(
        tmp_path: Path) -> None:
    """A body taken into the writer's trip but not yet run when its caller is cancelled is
    undone alone; the bodies beside it commit."""
    store = await open_store(tmp_path / "index.sqlite3")
    try:
        started, go = threading.Event(), threading.Event()

        def body(name: str, *, hold: bool = False) -> Any:
            async def write(db: Connection) -> str:
                if hold:
                    started.set()
                    go.wait(5)
                await db.execute("INSERT INTO forge_writes(who, endpoint, content, at)"
                                 " VALUES (?,?,?,?)", ("beside", name, 0, 1.0))
                return name
            return write

        async with store.transaction():  # the writer waits: the three go in one trip
            first = asyncio.create_task(store.run_transaction(body("first", hold=True)))
            victim = asyncio.create_task(store.run_transaction(body("victim")))
            last = asyncio.create_task(store.run_transaction(body("last")))
            await asyncio.sleep(0)  # (each hands its body in)
        await asyncio.to_thread(started.wait, 5)
        victim.cancel()
        await asyncio.sleep(0)
        go.set()
        assert await first == "first" and await last == "last"
        with pytest.raises(asyncio.CancelledError):
            await victim
        assert sorted(await _writes(store, "beside")) == ["first", "last"]
    finally:
        await store.close()


async def test_sqlite_a_body_raising_a_base_exception_fails_alone(tmp_path: Path) -> None:
    """Whatever one body raises is its caller's: the bodies beside it in the trip commit."""
    store = await open_store(tmp_path / "index.sqlite3")

    class Stopped(BaseException):
        pass

    try:
        def body(name: str) -> Any:
            async def write(db: Connection) -> str:
                await db.execute("INSERT INTO forge_writes(who, endpoint, content, at)"
                                 " VALUES (?,?,?,?)", ("base", name, 0, 1.0))
                if name == "stops":
                    raise Stopped
                return name
            return write

        async with store.transaction():
            tasks = [asyncio.create_task(store.run_transaction(body(name)))
                     for name in ("one", "stops", "two")]
            await asyncio.sleep(0)
        one, stops, two = await asyncio.gather(*tasks, return_exceptions=True)
        assert (one, two) == ("one", "two") and isinstance(stops, Stopped)
        assert sorted(await _writes(store, "base")) == ["one", "two"]
    finally:
        await store.close()


async def test_sqlite_a_transaction_sqlite_undid_fails_with_its_own_error(
        tmp_path: Path) -> None:
    """When SQLite itself ends the transaction under a body (a full disk, an I/O error: here
    the body's own ROLLBACK), every body of the trip is told that error, not a savepoint's."""
    store = await open_store(tmp_path / "index.sqlite3")
    try:
        async def undone(db: Connection) -> None:
            await db.execute("ROLLBACK")
            raise sqlite3.OperationalError("database or disk is full")

        async def fine(db: Connection) -> None:
            await db.execute("INSERT INTO forge_writes(who, endpoint, content, at)"
                             " VALUES (?,?,?,?)", ("undone", "fine", 0, 1.0))

        async with store.transaction():
            tasks = [asyncio.create_task(store.run_transaction(b)) for b in (fine, undone)]
            await asyncio.sleep(0)
        outcomes = await asyncio.gather(*tasks, return_exceptions=True)
        assert [str(o) for o in outcomes] == ["database or disk is full"] * 2
        assert store.write_failure == "OperationalError: database or disk is full"
        assert await _writes(store, "undone") == []
    finally:
        await store.close()


async def test_sqlite_a_writer_that_cannot_begin_tells_its_callers_why(tmp_path: Path) -> None:
    """A trip that cannot even begin (the connection closed under it) fails its callers with
    that error, not with a cancel they never asked for (intake's writer would hang on one)."""
    store = await open_store(tmp_path / "index.sqlite3")
    await store.close()

    async def body(db: Connection) -> None:
        await db.execute("SELECT 1")

    with pytest.raises(ValueError, match="no active connection"):
        await store.run_transaction(body)


async def test_sqlite_a_trip_left_empty_is_not_run(tmp_path: Path) -> None:
    """Every caller of a trip cancelled before the writer took it: no empty BEGIN and COMMIT."""
    store = await open_store(tmp_path / "index.sqlite3")
    try:
        async def body(db: Connection) -> None:
            await db.execute("SELECT 1")

        async with store.transaction():
            before = store.write_transactions
            task = asyncio.create_task(store.run_transaction(body))
            await asyncio.sleep(0)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
        await store.run_transaction(body)  # the writer's next turn, after the empty one
        assert store.write_transactions == before + 2  # the lock's own and this one's
    finally:
        await store.close()


async def test_bodies_handed_in_together_keep_their_own_outcomes(store: Store) -> None:
    """Bodies handed in while the writer is busy go together (SQLite: one trip, one commit);
    one that raises undoes its own writes alone and fails alone."""
    before = store.write_transactions

    def body(n: int) -> Any:
        async def write(db: Connection) -> int:
            await db.execute("INSERT INTO forge_writes(who, endpoint, content, at)"
                             " VALUES (?,?,?,?)", ("together", f"{CALLER.get()}", 0, n))
            if n == 3:
                raise ValueError("body 3 fails")
            return n
        return write

    async def call(n: int) -> int:
        CALLER.set(f"caller-{n}")  # (each caller's own context, in the shared trip too)
        return await store.run_transaction(body(n), f"budget:{n}")

    outcomes = await asyncio.gather(*(call(n) for n in range(8)), return_exceptions=True)
    assert [str(o) if isinstance(o, Exception) else o for o in outcomes] == [
        0, 1, 2, "body 3 fails", 4, 5, 6, 7]
    assert sorted(await _writes(store, "together")) == [
        f"caller-{n}" for n in range(8) if n != 3]
    committed = store.write_transactions - before
    if store.engine == "sqlite":
        assert committed < 7  # grouped: fewer commits than bodies
    else:
        assert committed == 7  # side by side, each its own (no office waits on another)


async def test_sqlite_a_trip_that_wrote_nothing_leaves_a_write_failure_standing(
        tmp_path: Path) -> None:
    """/readyz is failing until a write lands again: a body whose writes were undone (it
    raised) does not clear it, as with transaction()."""
    store = await open_store(tmp_path / "index.sqlite3")
    try:
        store.write_failure = "OperationalError: disk I/O error"
        before = store.write_transactions

        async def undone(db: Connection) -> None:
            await db.execute("INSERT INTO forge_writes(who, endpoint, content, at)"
                             " VALUES (?,?,?,?)", ("undone", "x", 0, 1.0))
            raise ValueError("the body changed its mind")

        with pytest.raises(ValueError, match="changed its mind"):
            await store.run_transaction(undone)
        assert store.write_failure == "OperationalError: disk I/O error"
        assert store.write_transactions == before  # (nothing committed)
        assert await _writes(store, "undone") == []
    finally:
        await store.close()


async def test_sqlite_a_body_that_swallows_the_end_of_its_transaction_fails_the_trip(
        tmp_path: Path) -> None:
    """A body that catches the error SQLite ended the transaction on (here: its own ROLLBACK)
    and returns: every caller of the trip is told the transaction ended, none is told it was
    cancelled, and nothing is written."""
    store = await open_store(tmp_path / "index.sqlite3")
    try:
        async def swallows(db: Connection) -> None:
            await db.execute("ROLLBACK")

        async def fine(db: Connection) -> None:
            await db.execute("INSERT INTO forge_writes(who, endpoint, content, at)"
                             " VALUES (?,?,?,?)", ("swallowed", "fine", 0, 1.0))

        async with store.transaction():
            tasks = [asyncio.create_task(store.run_transaction(b)) for b in (fine, swallows)]
            await asyncio.sleep(0)
        outcomes = await asyncio.gather(*tasks, return_exceptions=True)
        assert all(isinstance(o, sqlite3.OperationalError) and "ended under" in str(o)
                   for o in outcomes), outcomes
        assert await _writes(store, "swallowed") == []
    finally:
        await store.close()


async def test_sqlite_a_shutdown_cancelling_every_task_waits_for_the_trip(
        tmp_path: Path) -> None:
    """At shutdown asyncio cancels every task at once: the writer still holds the one write
    lock until the thread's trip is over (the next transaction must not find one open)."""
    store = await open_store(tmp_path / "index.sqlite3")
    try:
        started, go = threading.Event(), threading.Event()

        async def body(db: Connection) -> None:
            started.set()
            go.wait(5)

        caller = asyncio.create_task(store.run_transaction(body))
        await asyncio.to_thread(started.wait, 5)
        me = asyncio.current_task()
        for task in asyncio.all_tasks():
            if task is not me:
                task.cancel()
        for _ in range(20):  # (turns of the loop: what the cancels set going runs out)
            await asyncio.sleep(0)
        assert store._lock.locked() and store._trip_writer is not None  # noqa: SLF001
        go.set()
        with pytest.raises(asyncio.CancelledError):
            await caller
    finally:
        await store.close()
