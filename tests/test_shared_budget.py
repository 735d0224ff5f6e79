"""Several replicas, one forge budget: two stores on one PostgreSQL database (two replicas)
reserving writes side by side never place more creations in any minute than one App may make,
nor more writes to one endpoint than its points allow; alone, a write waits for nothing."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import asyncpg

from bot.store import open_store
from bot.store.budget import Limits, SharedWriteBudget, place
from bot.store.db import Store
from bot.store.locks import lock_pair
from tests import pg
from tests.support import until


def _most_in_window(times: list[float], span: float) -> int:
    times = sorted(times)
    return max((sum(1 for u in times if t <= u < t + span) for t in times), default=0)


async def test_two_replicas_together_stay_within_one_apps_creation_budget(
        two_replicas: tuple[Store, Store]) -> None:
    limits = Limits(per_minute=80, per_hour=500, endpoint_points_per_minute=0, slack=1.0)
    budgets = [SharedWriteBudget(store, limits) for store in two_replicas]
    waits = await asyncio.gather(*(
        budgets[i % 2].reserve("7", "POST /repos/{owner}/{repo}/issues", True)
        for i in range(200)))
    # 80 go at once, the next 80 a minute (and the slack) later, and so on (each wait counts
    # from its own reservation: on a loaded machine the 200 take seconds to place)
    assert sum(1 for w in waits if w < 30.0) == 80
    rows = await two_replicas[0].fetchall("SELECT at FROM forge_writes WHERE who='7'")
    placed = [float(r["at"]) for r in rows]
    assert len(placed) == 200
    assert _most_in_window(placed, 60.0) == 80


async def test_endpoint_points_are_shared_and_other_installations_are_not_held(
        two_replicas: tuple[Store, Store]) -> None:
    limits = Limits(per_minute=80, per_hour=500, endpoint_points_per_minute=900, slack=1.0)
    a, b = (SharedWriteBudget(store, limits) for store in two_replicas)
    edits = await asyncio.gather(*(
        (a if i % 2 else b).reserve("7", "PATCH /repos/{owner}/{repo}/issues/{n}", False)
        for i in range(200)))
    assert sum(1 for w in edits if w < 5.0) == 180  # 900 points, 5 a write
    assert await a.reserve("8", "PATCH /repos/{owner}/{repo}/issues/{n}", False) < 1.0


def test_a_write_is_placed_at_the_first_moment_every_window_allows() -> None:
    limits = Limits(per_minute=2, per_hour=3, endpoint_points_per_minute=0, slack=0.0)
    assert place([], 100.0, True, "e", limits) == 100.0
    assert place([(90.0, True, "e"), (95.0, True, "e")], 100.0, True, "e", limits) == 150.0
    # the hour's third creation was long ago placed: the fourth waits for the hour
    hour = [(10.0, True, "e"), (20.0, True, "e"), (30.0, True, "e")]
    assert place(hour, 100.0, True, "e", limits) == 3610.0
    assert place(hour, 100.0, False, "e", limits) == 100.0  # not a creation: no wait
    spaced = Limits(per_minute=80, per_hour=500, endpoint_points_per_minute=0,
                    min_interval=1.0, slack=0.0)
    assert place([(99.5, False, "e")], 100.0, False, "e", spaced) == 100.5


def test_spacing_ends_where_floating_point_cannot_reach_the_interval() -> None:
    # (t + 0.3) - t is a little under 0.3 at this t: the write spaced after t still looked
    # "near" it, and the placing looped for ever
    t = 1700000858.2809372
    assert (t + 0.3) - t < 0.3
    spaced = Limits(endpoint_points_per_minute=0, min_interval=0.3, slack=0.0)
    assert place([(t, False, "e")], t, False, "e", spaced) == t + 0.3


async def test_the_app_places_its_forge_writes_in_the_index_on_either_engine(
        embedded: Any, person: Any) -> None:
    """On SQLite too (issue 28: a restart forgot the budget, and a crash loop under load spent
    the hour's creations again): the app's write to the forge took its place in the index."""
    marco = person("marco")
    issue = await marco.open_issue("acme/scout-vault", "Prices", "EU prices please")
    await embedded.settle()
    labels = [x["name"] for x in (await marco.issue("acme/scout-vault", issue["number"]))["labels"]]
    assert labels == ["mail:new"]  # the app PATCHed the issue
    rows = await embedded.services.store.fetchall("SELECT endpoint FROM forge_writes")
    assert any(r["endpoint"].startswith("PATCH ") for r in rows), [dict(r) for r in rows]


async def test_a_restarted_sqlite_index_remembers_the_hours_creations(tmp_path: Path) -> None:
    limits = Limits(per_minute=80, per_hour=3, endpoint_points_per_minute=0, slack=0.0)
    store = await open_store(str(tmp_path / "index.sqlite3"))
    try:
        budget = SharedWriteBudget(store, limits)
        for _ in range(3):
            assert await budget.reserve("7", "POST /repos/{owner}/{repo}/issues", True) < 1.0
    finally:
        await store.close()
    store = await open_store(str(tmp_path / "index.sqlite3"))  # the process restarted
    try:
        wait = await SharedWriteBudget(store, limits).reserve(
            "7", "POST /repos/{owner}/{repo}/issues", True)
        assert wait > 3000.0, "the fourth creation of the hour waits for the hour"
    finally:
        await store.close()


async def test_a_write_put_off_takes_no_place(tmp_path: Path, database_url: str) -> None:
    """A write whose place is further off than its caller may wait (the worker puts such a
    delivery off) is told the wait and takes no place: the one after it is not pushed back."""
    limits = Limits(per_minute=80, per_hour=2, endpoint_points_per_minute=0, slack=0.0)
    store = await open_store(database_url or str(tmp_path / "index.sqlite3"))
    try:
        budget = SharedWriteBudget(store, limits)
        issues = "POST /repos/{owner}/{repo}/issues"
        for _ in range(2):
            assert await budget.reserve("7", issues, True, at_most=60.0) < 1.0
        assert await budget.reserve("7", issues, True, at_most=60.0) > 3000.0  # not placed
        assert await budget.reserve("7", issues, True, at_most=60.0) > 3000.0
        rows = await store.fetchall("SELECT at FROM forge_writes WHERE who='7'")
        assert len(rows) == 2
        assert await budget.reserve("7", issues, True) > 3000.0  # waiting: placed
        rows = await store.fetchall("SELECT at FROM forge_writes WHERE who='7'")
        assert len(rows) == 3
    finally:
        await store.close()


async def test_a_place_costs_the_same_with_a_quiet_or_a_busy_hour_behind_it(
        tmp_path: Path) -> None:
    """A write's place read every write of its installation in the last hour, and an
    installation may make 180 label moves a minute (10,800 an hour): each took longer than the
    one before. It reads the last minute's writes, and for a creation the hour's creations."""
    from tests.support import sqlite_steps

    store = await open_store(tmp_path / "index.sqlite3")
    try:
        limits = Limits(per_minute=80, per_hour=500, endpoint_points_per_minute=900)
        budget = SharedWriteBudget(store, limits)
        steps: dict[int, int] = {}
        patch = "PATCH /repos/{owner}/{repo}/issues/{issue_number}"
        for behind in (100, 3000):  # label moves earlier in the hour, more than a minute ago
            who = f"inst-{behind}"
            async with store.transaction() as db:
                for n in range(behind):
                    await db.execute(
                        "INSERT INTO forge_writes(who, endpoint, content, at)"
                        " VALUES (?, 'PATCH /repos/{owner}/{repo}/issues/{issue_number}', 0,"
                        " vm_now()-120-?)", (who, 3400.0 * n / behind))
            steps[behind], wait = await sqlite_steps(
                store, lambda who=who: budget.reserve(who, patch, False))  # type: ignore[misc]
            assert wait == 0.0
        assert steps[3000] <= 1.5 * steps[100], steps
    finally:
        await store.close()


async def test_every_installation_forgets_what_no_window_holds(
        tmp_path: Path, database_url: str) -> None:
    """What no window holds is deleted now and then for each installation: counted over the
    process, two installations placing in turn, the one on the odd places was never purged
    (found by review)."""
    store = await open_store(database_url or tmp_path / "index.sqlite3")
    try:
        async with store.transaction() as db:
            for who in ("A", "B"):
                for n in range(50):
                    await db.execute("INSERT INTO forge_writes(who, endpoint, content, at)"
                                     " VALUES (?, 'PATCH /x', 0, vm_now()-5000-?)", (who, n))
        budget = SharedWriteBudget(store, Limits(endpoint_points_per_minute=0))
        for _ in range(150):
            for who in ("A", "B"):
                await budget.reserve(who, "PATCH /x", False)
        rows = await store.fetchall("SELECT who, count(*) AS n FROM forge_writes"
                                    " WHERE at < vm_now()-4000 GROUP BY who ORDER BY who")
        assert {str(r["who"]): int(r["n"]) for r in rows} == {}
    finally:
        await store.close()


async def test_places_of_the_release_before_and_of_this_one_together_keep_the_budget(
        two_replicas: tuple[Store, Store]) -> None:
    """A rolling deploy: a replica of the release before places each write in a transaction
    that reads and writes under the installation's key (what `_place_locked` still runs), one
    of this release without a transaction (`vm_budget_place`: written only if nothing was
    placed since its read). Placing one installation's creations side by side, one at a time
    each, they never place more in a minute than the App may make."""
    limits = Limits(per_minute=30, per_hour=500, endpoint_points_per_minute=0, slack=1.0)
    this, before = (SharedWriteBudget(store, limits) for store in two_replicas)
    create = "POST /repos/{owner}/{repo}/issues"

    async def place_before(n: int) -> None:
        for _ in range(n):
            await before._place_locked([("7", create, True, None)])

    async def place_now(n: int) -> None:
        for _ in range(n):
            await this.reserve("7", create, True)

    await asyncio.gather(place_before(40), place_now(40))
    rows = await two_replicas[0].fetchall("SELECT at FROM forge_writes WHERE who='7'")
    placed = [float(r["at"]) for r in rows]
    assert len(placed) == 80
    assert _most_in_window(placed, 60.0) == 30


CREATE = "POST /repos/{owner}/{repo}/issues"
HANG_GUARD = 60.0


@contextlib.asynccontextmanager
async def _key_held(url: str, who: str) -> AsyncIterator[int]:
    """A placing of this release, held up under the installation's key (a paused replica, as
    in tests/test_store_lock_numbers.py): its session's pid; let go as the block ends."""
    conn = await asyncpg.connect(url)
    try:
        async with conn.transaction():
            await conn.execute("SELECT pg_advisory_xact_lock($1, $2)", *lock_pair(f"budget:{who}"))
            yield int(await conn.fetchval("SELECT pg_backend_pid()"))
    finally:
        await conn.close()


async def test_an_older_replica_starting_between_the_read_and_the_place_is_still_excluded(
        ) -> None:
    """A replica of a release that numbered keys by hashtextextended (schema 16's) starts after
    this release read the installation's window (no such replica lived then) and places its
    creation, its way, before this release's place is written: the transaction's way tries
    the key its way too and so excludes it (test_store_lock_numbers), and the place without a
    transaction must as well (found by review: `vm_budget_place` took the new number only, and
    its look at the newest id could not see the older replica's write, not committed yet)."""
    limits = Limits(per_minute=1, per_hour=500, endpoint_points_per_minute=0, slack=1.0)
    async with pg.replicas(1) as (url, (store,)):
        budget = SharedWriteBudget(store, limits)
        old = await asyncpg.connect(url)
        try:
            async with _key_held(url, "7") as holder:
                placing = asyncio.create_task(budget.reserve("7", CREATE, True))
                await until(lambda: pg.waiting_behind(url, holder), timeout=HANG_GUARD)
                # the older replica joins, and places a creation the way its release does
                await old.execute(
                    "INSERT INTO replicas(id, url, started_at, seen_at, steady_since,"
                    " incarnation, named_locks) VALUES ('older', NULL, vm_now(),"
                    " vm_now()+60, vm_now(), 'x', 2)")  # (live for a minute)
                older = old.transaction()
                await older.start()
                assert await old.fetchval(
                    "SELECT pg_try_advisory_xact_lock(hashtextextended($1, 0))", "budget:7")
                assert await old.fetchval("SELECT count(*) FROM forge_writes WHERE who='7'"
                                          " AND at>vm_now()-61") == 0
                await old.execute("INSERT INTO forge_writes(who, endpoint, content, at)"
                                  " VALUES ('7', $1, 1, vm_now())", CREATE)
                old_pid = int(await old.fetchval("SELECT pg_backend_pid()"))
            await until(lambda: placing.done() or pg.waiting_behind(url, old_pid),
                        timeout=HANG_GUARD)
            await older.commit()
            await asyncio.wait_for(placing, HANG_GUARD)
        finally:
            await old.close()
        rows = await store.fetchall("SELECT at FROM forge_writes WHERE who='7'")
        placed = [float(r["at"]) for r in rows]
        assert len(placed) == 2
        assert _most_in_window(placed, 60.0) == 1, "two creations in a minute of one"


async def test_a_place_is_sent_as_late_after_its_moment_as_the_slack_allows_at_most() -> None:
    """The moment a caller sends its write (the answer's arrival, then the wait) lands within
    the slack of the place recorded for it: the next write is placed a span and the slack
    after that place, so a write sent later than that shares a window of GitHub's with it.
    Found by review: the place without a transaction found its moment from the clock read
    before the installation's key was waited for (another placing held it, or the pool had no
    connection free), then recorded it as it was; the transaction read it under the key."""
    limits = Limits(per_minute=1, per_hour=500, endpoint_points_per_minute=0, slack=1.0)
    async with pg.replicas(1) as (url, (store,)):
        budget = SharedWriteBudget(store, limits)

        async def clock() -> float:
            row = await store.fetchone("SELECT vm_now() AS t")
            assert row is not None
            return float(row["t"])

        async with _key_held(url, "7") as holder:
            placing = asyncio.create_task(budget.reserve("7", CREATE, True))
            await until(lambda: pg.waiting_behind(url, holder), timeout=HANG_GUARD)
            held_since = await clock()

            async def held_past_the_slack() -> bool:
                return await clock() > held_since + 2 * limits.slack

            await until(held_past_the_slack, timeout=HANG_GUARD)
        wait = await asyncio.wait_for(placing, HANG_GUARD)
        sent = await clock() + wait
        rows = await store.fetchall("SELECT at FROM forge_writes WHERE who='7'")
        assert len(rows) == 1
        assert sent <= float(rows[0]["at"]) + limits.slack, (sent, float(rows[0]["at"]))
