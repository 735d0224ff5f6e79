"""`Store.run_transaction`: a write transaction whose body awaits only the store. SQLite runs
it whole in its connection's thread, in one hop (issue 22: "each in one trip to the database
where the engine allows"); PostgreSQL as `transaction()`. The same promises on both engines."""

from __future__ import annotations

import asyncio
import contextvars
import threading
import time
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


async def test_sqlite_a_cancel_waits_for_the_trip_and_its_commit_stands(
        tmp_path: Path) -> None:
    """Once handed to the thread, the body runs to its end: a cancel is seen by the caller
    only after that, and the one writer is not let go of while the body still runs (the next
    transaction finds it committed, not half done)."""
    store = await open_store(tmp_path / "index.sqlite3")
    try:
        started = threading.Event()

        async def body(db: Connection) -> None:
            await db.execute("INSERT INTO forge_writes(who, endpoint, content, at)"
                             " VALUES (?,?,?,?)", ("cancel", "first", 0, 1.0))
            started.set()
            # (in the store's thread, not the loop's: the caller is cancelled meanwhile)
            time.sleep(0.2)  # noqa: ASYNC251
            await db.execute("INSERT INTO forge_writes(who, endpoint, content, at)"
                             " VALUES (?,?,?,?)", ("cancel", "second", 0, 2.0))

        task = asyncio.create_task(store.run_transaction(body))
        await asyncio.to_thread(started.wait, 5)
        task.cancel()
        async with store.transaction() as db:  # waits for the writer the body holds
            row = await db.fetchone("SELECT count(*) FROM forge_writes WHERE who=?",
                                    ("cancel",))
        assert row is not None and row[0] == 2
        with pytest.raises(asyncio.CancelledError):
            await task
        assert await _writes(store, "cancel") == ["first", "second"]
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
