"""The forge write budget, kept in the index: shared by all replicas, remembered across
restarts.

Each process's own `WritePacer` keeps its writes within one App's limits, but forgets them when
it restarts (a crash loop under load would spend the hour's budget again), and with several
replicas each would allow the whole budget. Here every write takes its place in one table
before it goes: under its installation's key (other installations place theirs meanwhile),
the earliest moment at which it keeps every
replica's writes together within GitHub's secondary limits (80 creations a minute, 500 an
hour, 900 points a minute per endpoint) is found, recorded, and the caller waits until then.
Times are the database's clock (vm_now()), so the replicas' own clocks need not agree.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from bot.store.db import Store, register_schema
from bot.store.group import GroupCommit
from bot.store.sql import Connection

register_schema("""
CREATE TABLE IF NOT EXISTS forge_writes (
    id {id},
    who {text} NOT NULL,              -- the installation whose budget it draws on
    endpoint {text} NOT NULL,         -- "METHOD /route/{template}"
    content {int} NOT NULL,       -- a content creation (issue, comment)
    at {real} NOT NULL                -- when it may go (wall clock)
);
CREATE INDEX IF NOT EXISTS forge_writes_who_at ON forge_writes(who, at);
""", version=2)
# A place reads the last minute's writes and the hour's creations, not the hour's writes: an
# installation may make 10,800 label moves an hour (180 a minute), each of which read them all.
register_schema("""
CREATE INDEX IF NOT EXISTS forge_writes_creations ON forge_writes(who, at) WHERE content=1;
""", version=16)
PURGE_EVERY = 100  # an installation's places between two deletions of what no window holds

WRITE_POINTS = 5  # what GitHub counts a write on its endpoint's budget


@dataclass
class Limits:
    per_minute: int = 80
    per_hour: int = 500
    endpoint_points_per_minute: int = 900
    min_interval: float = 0.0
    slack: float = 1.0  # as the pacer: the forge counts a write when it lands


def place(times: list[tuple[float, bool, str]], at: float, content: bool, endpoint: str,
          limits: Limits) -> float:
    """The earliest moment from `at` when one more write keeps every window within its
    limit, given the writes already placed (`times`: (at, content, endpoint)). Sans-I/O."""
    windows: list[tuple[list[float], int, float]] = []
    if content:
        creations = sorted(t for t, c, _ in times if c)
        windows += [(creations, limits.per_minute, 60.0), (creations, limits.per_hour, 3600.0)]
    budget = limits.endpoint_points_per_minute // WRITE_POINTS
    if budget > 0:
        windows.append((sorted(t for t, _, e in times if e == endpoint), budget, 60.0))
    # writes spaced by min_interval: from the writes placed near this one only (a creation
    # placed in the next hour keeps no label move waiting for it)
    spaced = sorted(t for t, _, _ in times) if limits.min_interval > 0 else []
    moved = True
    while moved:  # a later moment may bring other writes into a window: look again
        moved = False
        near = [t for t in spaced if abs(t - at) < limits.min_interval]
        # moved only forward: at a large t, (t + interval) - t can round below the interval,
        # and the moment just placed would look near t again for ever
        if near and max(near) + limits.min_interval > at:
            at, moved = max(near) + limits.min_interval, True
        for placed, limit, span in windows:
            if limit <= 0:
                continue
            inside = [t for t in placed if at - span - limits.slack < t]
            if len(inside) >= limit:
                later = inside[-limit] + span + limits.slack
                if later > at:
                    at, moved = later, True
    return at


# PostgreSQL: the store's clock and the writes placed since a span before it (`recent`,
# reckoned as place_all does: now - span - slack), in one statement; the clock is read once
# (a volatile function's CTE is never inlined), and a row without a write (`at` NULL) comes
# back when there is none
_NOW_AND_RECENT = ("WITH n(t) AS (SELECT vm_now()) SELECT n.t, w.at, w.content, w.endpoint"
                   " FROM n LEFT JOIN forge_writes w ON w.who=? AND w.at>n.t-?-?")

_Write = tuple[str, str, bool, float | None]  # (who, endpoint, content, at most this wait)
_Placed = tuple[float, bool, str]  # (at, content, endpoint)


@dataclass
class _Window:
    """One installation's writes placed, as one placing transaction knows them: the last
    minute's (`recent`), and the hour's creations before that once a creation needed them."""

    recent: list[_Placed]
    creations: list[_Placed] | None = None


class SharedWriteBudget:
    """`bot.forge.caller.SharedBudget` on the store.

    Writes asked for while one placing transaction waits for its turn or commits are placed
    together in the next (`bot.store.group`), one after the other, each by the same
    statements as alone, under their installations' keys: one write transaction for several
    writes' places instead of one each (PostgreSQL: one installation's writes only). A write
    waits, as before, until its place is committed."""

    def __init__(self, store: Store, limits: Limits) -> None:
        self.store = store
        self.limits = limits
        # SQLite (one writer, holding every key): one group; PostgreSQL (writers side by
        # side): a group per installation, so that no installation's writes wait for another's
        self._groups: dict[str, GroupCommit[_Write, float]] = {}
        self._placed: Counter[str] = Counter()  # places per installation, in this process

    async def reserve(self, who: str, endpoint: str, content: bool,
                      at_most: float | None = None) -> float:
        """Place one write; returns the seconds to wait before sending it. With `at_most`, a
        place further off than that is not taken: the wait it would have is returned, and
        nothing is recorded (a write put off takes no place another one could have)."""
        whose = "" if self.store.engine == "sqlite" else who
        group = self._groups.get(whose)
        if group is None:
            group = self._groups[whose] = GroupCommit(self._place)
        return await group((who, endpoint, content, at_most))

    async def _place(self, writes: list[_Write]) -> list[float]:
        # one installation's writes are placed one at a time; other installations' meanwhile
        keys = sorted({f"budget:{who}" for who, _, _, _ in writes})

        async def place_all(db: Connection) -> list[float]:
            waits: list[float] = []
            # the writes placed so far, per installation, as this transaction reads them: read
            # once (its key is held to the end), then each place taken here added (a group of
            # one installation's writes read its window once, not once a write)
            placed: dict[str, _Window] = {}
            now = 0.0
            # every window but the hour's creations looks a minute back at most (and the
            # spacing, min_interval): what was placed since, whatever it was, and before
            # that, for a creation, the hour's creations
            back = max(60.0, self.limits.min_interval)
            for who, endpoint, content, at_most in writes:
                window = placed.get(who)
                if window is None and not placed and db.engine == "postgresql":
                    # (the group's writes are placed at one moment of the store's: read with
                    # the first one's window, in one round trip)
                    rows = await db.fetchall(_NOW_AND_RECENT,
                                             (who, back, float(self.limits.slack)))
                    now = float(rows[0][0])
                    window = placed[who] = _Window([(float(r[1]), bool(r[2]), str(r[3]))
                                                    for r in rows if r[1] is not None])
                elif not placed:  # (SQLite: each its own statement, in the trip's one hop)
                    row = await db.fetchone("SELECT vm_now() AS t")
                    assert row is not None
                    now = float(row[0])
                horizon = now - 3600.0 - self.limits.slack
                recent = now - back - self.limits.slack
                if window is None:
                    rows = await db.fetchall("SELECT at, content, endpoint FROM forge_writes"
                                             " WHERE who=? AND at>?", (who, recent))
                    window = placed[who] = _Window(
                        [(float(r[0]), bool(r[1]), str(r[2])) for r in rows])
                if content and window.creations is None:
                    rows = await db.fetchall(
                        "SELECT at, content, endpoint FROM forge_writes WHERE who=?"
                        " AND content=1 AND at>? AND at<=?", (who, horizon, recent))
                    window.creations = [(float(r[0]), bool(r[1]), str(r[2])) for r in rows]
                at = place(window.recent + (window.creations or []) if content
                           else window.recent, now, content, endpoint, self.limits)
                if at_most is not None and at - now > at_most:
                    waits.append(at - now)  # put off by its caller: no place taken
                    continue
                await db.execute("INSERT INTO forge_writes(who, endpoint, content, at)"
                                 " VALUES (?,?,?,?)", (who, endpoint, int(content), at))
                window.recent.append((at, content, endpoint))
                self._placed[who] += 1  # now and then (its first place, then every 100th),
                if self._placed[who] % PURGE_EVERY == 1:  # forget what no window holds
                    await db.execute("DELETE FROM forge_writes WHERE who=? AND at<?",
                                     (who, horizon))
                waits.append(at - now)
            return waits

        return await self.store.run_transaction(place_all, *keys)  # (SQLite: one trip)
