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

On PostgreSQL a place takes two round trips and no transaction of its own: the window is read
(`_PLACED`), the places are found here, and `vm_budget_place` writes them under the
installation's key only if no write of that installation was placed since the read (else it
is read and found again). The transaction that read and wrote under the key (BEGIN, the key,
the read, the insert, COMMIT: five round trips, one place a mail on the hot path) is kept for
where that cannot be: a replica of a release that numbers its keys another way lives, or the
installation's places keep moving under the reads.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from bot.store.db import NAMED_LOCKS_KIND, Store, register_schema
from bot.store.group import GroupCommit
from bot.store.locks import RESERVED, lock_pair
from bot.store.queue import DEAD_AFTER
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

# PostgreSQL (schema 46): a group of one installation's places written only if none was placed
# since they were found (`p_seen`: the newest id of its writes then, 0 for none), under the key
# every placing takes (`Store.transaction("budget:<who>")`'s, `bot.store.locks.lock_pair`), so
# a transaction of a release before placing meanwhile is waited for. Its statements run one
# after the other, each seeing what committed before it began (a VOLATILE function's, in READ
# COMMITTED): the look at the newest id sees a place committed while the key was waited for,
# which the calling statement's own snapshot would not. Called alone, its transaction ends
# with it, and so does the key. As `Connection.begin` does, the key is then tried the older
# releases' way too (hashtextextended of `p_key`, held if free) before it looks whether a
# replica numbering keys that way lives ('older': the transaction's way, at once): one that
# starts after the read's look is excluded or seen, never placing beside it unseen (its write
# not committed, the newest id unchanged). And the places were found from the read's clock
# (`p_now`): written more than `p_lag` after it (the key or a pooled connection waited for),
# the caller would send later than its place by more than the slack allows ('late': read
# and found again, as when one was placed meanwhile, 'moved').
register_schema("", postgres="""
CREATE INDEX IF NOT EXISTS forge_writes_who_id ON forge_writes(who, id);
CREATE OR REPLACE FUNCTION vm_budget_place(p_who text, p_high int, p_low int, p_key text,
        p_reserved bigint[], p_kind int, p_dead_after double precision, p_seen bigint,
        p_now double precision, p_lag double precision, p_endpoints text[],
        p_contents bigint[], p_ats double precision[], p_forget_before double precision)
    RETURNS text LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    old bigint := hashtextextended(p_key, 0);
BEGIN
    PERFORM pg_advisory_xact_lock(p_high, p_low);
    PERFORM old = ANY(p_reserved) OR pg_try_advisory_xact_lock(old);
    IF EXISTS (SELECT 1 FROM replicas WHERE (named_locks IS NULL OR named_locks < p_kind)
               AND seen_at > vm_now() - p_dead_after) THEN
        RETURN 'older';
    END IF;
    IF vm_now() - p_now > p_lag THEN
        RETURN 'late';
    END IF;
    IF coalesce((SELECT max(id) FROM forge_writes WHERE who = p_who), 0) <> p_seen THEN
        RETURN 'moved';
    END IF;
    INSERT INTO forge_writes(who, endpoint, content, at)
        SELECT p_who, e, c, a FROM unnest(p_endpoints, p_contents, p_ats) AS p(e, c, a);
    IF p_forget_before IS NOT NULL THEN
        DELETE FROM forge_writes WHERE who = p_who AND at < p_forget_before;
    END IF;
    RETURN 'placed';
END $$;
""", version=46)
# a place found again this many times (another replica's places of the installation moving
# under each read, or each written too late) is then taken under the installation's key, read
# and written in one transaction: it waits its turn instead of reading again
UNLOCKED_TRIES = 3
# the part of the slack that a place without a transaction may be written after its clock was
# read (the transaction's way reads the clock under the key: a few round trips)
LAG_OF_SLACK = 0.25

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

# PostgreSQL: what `vm_budget_place` is written against, in one statement: the store's clock,
# the newest id of the installation's writes, whether a replica numbering its keys another
# way lives (its placing takes another lock: then the transaction's way, whose keys are taken
# its way too), and the writes placed since a span before the clock (`part` 0), with, when
# `creations` is asked, the hour's creations before that (`part` 1); a row without a write
# (`at` NULL) comes back when there is none
_PLACED = (
    "WITH n(t) AS (SELECT vm_now())"
    " SELECT n.t, (SELECT max(id) FROM forge_writes WHERE who=?) AS newest,"
    " EXISTS (SELECT 1 FROM replicas WHERE (named_locks IS NULL OR named_locks<?)"
    " AND seen_at>n.t-?) AS older, w.part, w.at, w.content, w.endpoint"
    " FROM n LEFT JOIN LATERAL (SELECT 0 AS part, at, content, endpoint FROM forge_writes"
    " WHERE who=? AND at>n.t-?-? UNION ALL SELECT 1, at, content, endpoint FROM forge_writes"
    " WHERE ?::boolean AND who=? AND content=1 AND at>n.t-3600.0-? AND at<=n.t-?-?) w ON true")

# `_place_unlocked`'s answer while a replica numbering keys another way lives (this list, by
# identity: no group's waits are it)
_OLDER: list[float] = []

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
        if self.store.engine == "postgresql":  # (a group of one installation's writes)
            for _ in range(UNLOCKED_TRIES):
                waits = await self._place_unlocked(writes[0][0], writes)
                if waits is _OLDER:
                    break
                if waits is not None:
                    return waits
        return await self._place_locked(writes)

    async def _place_unlocked(self, who: str, writes: list[_Write]) -> list[float] | None:
        """PostgreSQL: `writes` placed in two round trips, without a transaction around them
        (see the module's docstring); None when that was not done: read and place again;
        `_OLDER` when a replica numbering keys another way lives: the transaction's way."""
        back = max(60.0, self.limits.min_interval)
        slack = float(self.limits.slack)
        creations = any(content for _, _, content, _ in writes)
        rows = await self.store.fetchall(_PLACED, (
            who, NAMED_LOCKS_KIND, DEAD_AFTER, who, back, slack, creations, who, slack, back,
            slack))
        head = rows[0]
        if head["older"]:
            return _OLDER
        now = float(head["t"])
        window = _Window([(float(r["at"]), bool(r["content"]), str(r["endpoint"]))
                          for r in rows if r["at"] is not None and r["part"] == 0],
                         [(float(r["at"]), bool(r["content"]), str(r["endpoint"]))
                          for r in rows if r["at"] is not None and r["part"] == 1]
                         if creations else None)
        waits: list[float] = []
        taken: list[tuple[str, int, float]] = []
        for _, endpoint, content, at_most in writes:
            wait, at = self._take(window, now, endpoint, content, at_most)
            waits.append(wait)
            if at is not None:
                taken.append((endpoint, int(content), at))
        if not taken:
            return waits
        # now and then (an installation's first place, then every PURGE_EVERY-th), what no
        # window holds is forgotten, under the key, with the places
        placed = self._placed[who]
        forget = any((placed + n) % PURGE_EVERY == 1 for n in range(1, len(taken) + 1))
        key = f"budget:{who}"
        row = await self.store.fetchone(
            "SELECT vm_budget_place(?, ?, ?, ?, ?::bigint[], ?, ?::float8, ?, ?::float8,"
            " ?::float8, ?::text[], ?::bigint[], ?::float8[], ?::float8) AS done",
            (who, *lock_pair(key), key, RESERVED, NAMED_LOCKS_KIND, DEAD_AFTER,
             int(head["newest"] or 0), now, slack * LAG_OF_SLACK,
             [e for e, _, _ in taken], [c for _, c, _ in taken], [a for _, _, a in taken],
             now - 3600.0 - slack if forget else None))
        done = None if row is None else row["done"]
        if done == "older":
            return _OLDER
        if done != "placed":  # 'moved' or 'late': read and found again
            return None
        self.store.write_transactions += 1
        self._placed[who] += len(taken)
        return waits

    def _take(self, window: _Window, now: float, endpoint: str, content: bool,
              at_most: float | None) -> tuple[float, float | None]:
        """One write's wait from `now` and its moment, placed among `window`'s (which takes
        it), or no moment when its caller puts it off (`at_most`): no place taken. Both ways
        of placing use it."""
        at = place(window.recent + (window.creations or []) if content else window.recent,
                   now, content, endpoint, self.limits)
        if at_most is not None and at - now > at_most:
            return at - now, None
        window.recent.append((at, content, endpoint))
        return at - now, at

    async def _place_locked(self, writes: list[_Write]) -> list[float]:
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
                wait, at = self._take(window, now, endpoint, content, at_most)
                waits.append(wait)
                if at is None:
                    continue
                await db.execute("INSERT INTO forge_writes(who, endpoint, content, at)"
                                 " VALUES (?,?,?,?)", (who, endpoint, int(content), at))
                self._placed[who] += 1  # now and then (its first place, then every 100th),
                if self._placed[who] % PURGE_EVERY == 1:  # forget what no window holds
                    await db.execute("DELETE FROM forge_writes WHERE who=? AND at<?",
                                     (who, horizon))
            return waits

        return await self.store.run_transaction(place_all, *keys)  # (SQLite: one trip)
