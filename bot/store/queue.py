"""The durable work queue of webhook deliveries, with dedupe by delivery id and dead letters."""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import time
from collections import deque
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, TypeVar

from bot import jsontext
from bot.store.locks import RESERVED, lock_pair, lock_pair_sql
from bot.store.sql import Connection, Row, Sql, Statement

log = logging.getLogger("vaultmail.queue")
T = TypeVar("T")
HEARTBEAT = 1.0  # seconds between a replica's heartbeats (bot.app.replica)
DEAD_AFTER = 5.0  # seconds without a heartbeat after which a replica's claims are free
STEADY_GAP = 2.5 * HEARTBEAT  # a longer silence between two beats is a gap in them


class ReplicaIdInUse(RuntimeError):
    """Another live process beats under this REPLICA_ID: two processes under one id would
    share each other's claims (the same delivery run twice, one issue on two at once)."""


class ReplicaIdTaken(RuntimeError):
    """Another process joined under this replica's id while it was silent (it stalled past
    DEAD_AFTER, and was restarted): this one stops claiming work."""


async def id_taken(db: Connection, replica_id: str, incarnation: str) -> bool:
    """Whether another process has joined under `replica_id` (in a transaction)."""
    return await db.fetchone("SELECT 1 FROM replicas WHERE id=? AND incarnation<>?",
                             (replica_id, incarnation)) is not None

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable, Sequence
    from contextlib import AbstractAsyncContextManager



BATCH = 500  # deliveries written in one transaction at most
# seconds a parked issue's writer waits at most, outside any transaction, for the intake key
# another intake holds before it tries them all again (the server ends a stalled one's session
# after IDLE_IN_TRANSACTION, bot.store.postgres)
PARKED_POLL = 0.05
# payloads intake parsed, kept for the worker's first take of them (parsing a large payload
# again was a tenth of the event loop's time at 50 deliveries in flight); at most this many,
# and once that many are kept, those kept longer than HANDED_OVER_FOR seconds make room (with
# other replicas, most are another's to take: kept for ever, they filled it)
HANDED_OVER = 2048
HANDED_OVER_FOR = 30.0


def issue_key(payload: dict[str, Any]) -> str | None:
    """The issue a delivery is about (deliveries about one issue run in arrival order, retries
    included), or None. Never raises, whatever the payload holds. In lower case, the one form
    a key is stored, compared and locked in: a forge's names are case-insensitive, GitHub's
    payloads spell them as their owner does, and a rename rewrites keys in lower case."""
    issue = payload.get("issue")
    repo = payload.get("repository")
    if "sub_issue" in payload:  # sub_issues: about the sub-issue, whichever side it reached
        issue = payload.get("sub_issue")
        repo = payload.get("sub_issue_repo") or repo
    if isinstance(issue, dict) and isinstance(repo, dict):
        return f"{repo.get('full_name')}#{issue.get('number')}".lower()
    return None


def payload_org(payload: Mapping[str, Any]) -> str | None:
    """The org a delivery is about: the one its repository's owner, the owner in the
    repository's `full_name` (which the handlers read) and its organization all name. None
    when none names one or they disagree: an org's webhook, signed by that org, must not
    name itself in one field and another org in the next."""
    named: set[str] = set()
    repo, organization = payload.get("repository"), payload.get("organization")
    if isinstance(repo, dict):
        full_name, owner = repo.get("full_name"), repo.get("owner")
        if isinstance(full_name, str):
            named.add(full_name.partition("/")[0].lower())
        if isinstance(owner, dict) and isinstance(owner.get("login"), str):
            named.add(str(owner["login"]).lower())
    if isinstance(organization, dict) and isinstance(organization.get("login"), str):
        named.add(str(organization["login"]).lower())
    return next(iter(named)) if len(named) == 1 else None


def office_of_key(key: str) -> str:
    """The office (org) of an issue's key ("owner/repo#n")."""
    return key.partition("/")[0].lower()


def office_of(payload: Mapping[str, Any], key: str | None) -> str | None:
    """The one office a delivery is about: its issue's (`key`, "owner/repo#n"), else the org
    its payload names (an installation's account, for an installation's events); None when
    none. Kept on its queue row: claims share the worker between offices by it."""
    if key is not None:
        return office_of_key(key)
    org = payload_org(payload)
    if org is None:
        installation = payload.get("installation")
        account = installation.get("account") if isinstance(installation, dict) else None
        login = account.get("login") if isinstance(account, dict) else None
        org = login.lower() if isinstance(login, str) and login else None
    return org


def _payload_text(arrival: _Arrival) -> str:
    """The payload as stored: its raw bytes when they are UTF-8 (JSON may arrive as UTF-16)."""
    try:
        return arrival.raw.decode("utf-8")
    except UnicodeDecodeError:
        return json.dumps(arrival.payload)


@dataclass(eq=False)
class _Arrival:
    guid: str
    event: str
    payload: dict[str, Any]
    raw: bytes
    done: asyncio.Future[bool]
    run: bool = True  # False: its id recorded alone (see enqueue_delivery)
    named: str | None = None  # its issue's key under the names now (see enqueue_delivery)

    @functools.cached_property
    def key(self) -> str | None:
        """The issue it is about, when it is queued to run (see issue_key)."""
        return (self.named or issue_key(self.payload)) if self.run else None

    @functools.cached_property
    def office(self) -> str | None:
        """Whose it is (see office_of)."""
        return office_of(self.payload, self.key)

    @property
    def parked_as(self) -> str:
        """What it waits with when parked: its issue's arrivals (in order), else its own."""
        return self.key if self.key is not None else "\n" + self.guid

    @property
    def intake_keys(self) -> list[tuple[str, str | None]]:
        """The keys its intake holds from before its rows are written to commit (PostgreSQL),
        each with the issue it is of: its issue's (its issue's deliveries numbered in the
        order they commit) and its delivery id's (two replicas taking one redelivery in never
        wait on each other's uncommitted row of it)."""
        own: list[tuple[str, str | None]] = [("delivery:" + self.guid, None)]
        return own if self.key is None else [("intake:" + self.key, self.key), *own]

    @property
    def action(self) -> str | None:
        action = self.payload.get("action")
        return action if isinstance(action, str) else None

    @property
    def installation_id(self) -> int | None:
        return installation_of(self.payload)


def installation_of(payload: dict[str, Any]) -> int | None:
    """The installation id a delivery names, or None (also for a malformed `installation`)."""
    inst = payload.get("installation")
    ident = inst.get("id") if isinstance(inst, dict) else None
    return ident if isinstance(ident, int) and not isinstance(ident, bool) else None


@dataclass(frozen=True)
class QueueItem:
    id: int
    guid: str
    event: str
    installation_id: int | None
    payload: dict[str, Any]
    attempts: int
    state: str
    last_error: str | None
    takeovers: int = 0
    lease: int = 0  # the claim it was taken under (its fencing token)
    # the issue it is queued under (its payload's, under the names now: enqueue_delivery),
    # which a rename moves along with the rest (bot.store.offices); None: about no issue
    issue_key: str | None = None


def _item(row: Any, parsed: dict[str, Any] | None = None) -> QueueItem:
    return QueueItem(
        id=row["id"],
        guid=row["guid"],
        event=row["event"],
        installation_id=row["installation_id"],
        payload=jsontext.loads(row["payload"]) if parsed is None else parsed,
        attempts=row["attempts"],
        state=row["state"],
        last_error=row["last_error"],
        takeovers=row["takeovers"],
        lease=row["lease_seq"],
        issue_key=row["issue_key"],
    )


# A replica claims deliveries by writing its id in `lease_owner`; the claim holds while the
# replica's heartbeat is fresh (see bot.store.db), so a dead replica's deliveries are taken
# over by the others. A delivery is held back while an earlier one about its issue waits for
# its retry or is claimed by another live replica: one issue's deliveries run in order, never
# on two replicas at once.
# (liveness by the database's clock, vm_now(): the replicas' own clocks may disagree)
_LIVE = f"SELECT id FROM replicas WHERE seen_at>vm_now()-{DEAD_AFTER}"
# A claim costs what it takes, not the backlog (issue 29: the hold below scanned every pending
# row for each candidate, so one claim took 21.9 s with 6,560 pending, under the write lock).
# It reads pending rows through partial indexes of them (bot.store.db, version 6):
# `queue_claim_office` in arrival order, `queue_held` an issue's from its first, `queue_wake` by due
# time, each with what the claim filters on, so SQLite never reads a row's payload (it comes
# before those columns and spills onto overflow pages). And it looks at a window of WINDOW
# arrival ids at a time (due_items): PostgreSQL, sure from stale statistics that few rows are
# pending, would otherwise check and sort every one of them rather than stop after `limit`.
WINDOW = 256
NO_HOLD = 2**62  # (a claim holds no barrier back)
# A claim that leaves issues alone (deep lanes') takes no barrier after the first of their
# pending rows it leaves: a barrier runs after everything before it
FIRST_LEFT = Sql(
    "SELECT MIN(id) AS id FROM queue INDEXED BY queue_held WHERE state='pending'"
    " AND issue_key IN (SELECT value FROM json_each(?))"
    " AND id NOT IN (SELECT value FROM json_each(?))",
    "SELECT MIN(id) AS id FROM queue WHERE state='pending' AND issue_key = ANY(?::text[])"
    " AND NOT (id = ANY(?::bigint[]))")
# (SQLite is told which index to read; PostgreSQL's planner finds it)
_HELD_BEHIND = Sql("SELECT 1 FROM queue p INDEXED BY queue_held", "SELECT 1 FROM queue p") + (
    " WHERE p.state='pending' AND p.issue_key=q.issue_key AND p.id<q.id"
    " AND (p.next_at>coalesce(?, vm_now()) OR (p.lease_owner<>? AND p.lease_owner IN ("
    + _LIVE + ")))")
# Fencing: a delivery is finished or failed only under the claim it was run under: by the
# replica holding it, and by that claim (each claim numbers it anew, `lease_seq`). A replica
# taken for dead (stalled past DEAD_AFTER), or the old process of one restarted under its id,
# may not mark done, dead or due again what has been claimed since.
_OURS = "state='pending' AND lease_owner=? AND lease_seq=?"
# A dead replica's claims are taken over only by one that has itself beaten without a gap
# for DEAD_AFTER, and lately: after a database outage every replica looks dead to the first
# one back, but by the time that one is steady again the others have beaten too (and a
# replica just started waits as long before it takes anything over).
_STEADY_ME = ("EXISTS (SELECT 1 FROM replicas me WHERE me.id=?"
              f" AND me.steady_since<=vm_now()-{DEAD_AFTER}"
              f" AND me.seen_at>vm_now()-{STEADY_GAP})")
_MINE_TO_TAKE = ("(q.lease_owner IS NULL OR q.lease_owner=? OR (q.lease_owner NOT IN ("
                 + _LIVE + ") AND " + _STEADY_ME + ")) AND NOT EXISTS (" + _HELD_BEHIND + ")")
_CLAIMABLE = "q.state='pending' AND q.next_at<=coalesce(?, vm_now()) AND " + _MINE_TO_TAKE
# whether a delivery about an issue other than one (a guid) waits, pending or parked: each
# state the issue's own look-up in its partial index (`queue_held`, `queue_parked`), where a
# `state IN` read every pending and parked row, the backlog, through the state's index
# (parameters: the issue and the guid, twice)
OTHERS_ABOUT = Sql(
    "SELECT 1 FROM queue INDEXED BY queue_held WHERE issue_key=? AND state='pending'"
    " AND guid<>? UNION ALL SELECT 1 FROM queue INDEXED BY queue_parked WHERE issue_key=?"
    " AND state='parked' AND guid<>? LIMIT 1",
    "SELECT 1 FROM queue WHERE issue_key=? AND state='pending' AND guid<>?"
    " UNION ALL SELECT 1 FROM queue WHERE issue_key=? AND state='parked' AND guid<>? LIMIT 1")
# where the next window begins: the oldest pending delivery from an id on
NEXT_PENDING = Sql("SELECT MIN(id) AS id FROM queue INDEXED BY queue_claim_office"
                   " WHERE state='pending' AND id>=?",
                   "SELECT MIN(id) AS id FROM queue WHERE state='pending' AND id>=?")
# the same, of the offices not left alone (parameters: the id, twice, then the offices): the
# first pending row of each office with any, one hop through `queue_pending_office` an office
# (a recursive walk over its distinct offices), and the first of no office, rather than a
# look at every row of the backlogs left alone (the claim's first pass begins its windows
# there: an office's whole backlog would be read at every claim while it holds its share)
_FIRSTS = """
WITH RECURSIVE o(office) AS (
    SELECT MIN(office) FROM queue {hint} WHERE state='pending'
    UNION ALL
    SELECT (SELECT MIN(office) FROM queue {hint} WHERE state='pending' AND office>o.office)
    FROM o WHERE o.office IS NOT NULL
)
SELECT MIN(id) AS id FROM (
    SELECT (SELECT MIN(id) FROM queue {hint} WHERE state='pending' AND office IS NULL
            AND id>=?) AS id
    UNION ALL
    SELECT (SELECT MIN(p.id) FROM queue p {hint} WHERE p.state='pending'
            AND p.office=o.office AND p.id>=?) AS id
    FROM o WHERE o.office IS NOT NULL AND {kept}
) firsts"""
NEXT_PENDING_BUT = Sql(
    _FIRSTS.format(hint="INDEXED BY queue_pending_office",
                   kept="o.office NOT IN (SELECT value FROM json_each(?))"),
    _FIRSTS.format(hint="", kept="NOT (o.office = ANY(?::text[]))"))
# SQLite's claim (one writer, so nothing to skip): the oldest deliveries in a window this
# replica may take now (parameters: claim_params). PostgreSQL's is CANDIDATES, below.
# (JSON arrays of the ids, issues and offices it leaves alone: what this replica is running,
# the issues whose lanes are deep, see `excluding`, and the offices the worker holds back; a
# row of no known office, queued before rows had one, only while it holds none back)
CLAIM = ("SELECT q.id FROM queue q INDEXED BY queue_claim_office WHERE q.id>=? AND q.id<?"
         " AND q.id NOT IN (SELECT value FROM json_each(?)) AND (q.issue_key IS NULL AND q.id<?"
         " AND (q.office IS NOT NULL OR ?) OR q.issue_key IS NOT NULL AND q.issue_key NOT IN"
         " (SELECT value FROM json_each(?))) AND (q.office IS NULL OR q.office NOT IN"
         " (SELECT value FROM json_each(?))) AND " + _CLAIMABLE + " ORDER BY q.id LIMIT ?").sqlite
# when the next of them is due: the first by due time not held behind (next_wakeup)
WAKEUP = (Sql("SELECT q.next_at-vm_now() AS t FROM queue q INDEXED BY queue_wake",
              "SELECT q.next_at-vm_now() AS t FROM queue q")
          + " WHERE q.state='pending'"
          " AND " + _MINE_TO_TAKE + " ORDER BY q.next_at LIMIT 1")


# PostgreSQL claims side by side (no lock is shared by every claim). A claim first locks
# what it might take, skipping rows another claim holds, and the issue of each (skipping the
# issues another claim is deciding on: CANDIDATES); then, with a fresh look at the pending rows
# of those issues (EARLIER: any claim that decided on one has committed by now), takes a row
# only if each earlier one of its issue is this replica's, by this claim or an earlier one,
# and no other live replica holds any of the issue's (`in_order`). Intake commits side by side
# too: it holds an issue's intake key (`intake:`) from numbering its deliveries to commit, so
# two intakes number one issue's deliveries in the order they commit, and a claim skips an
# issue whose deliveries are being numbered (it looks whether the intake key is free, and holds
# it not: an intake never waits for a claim; one that numbers after that look numbers after
# every row the claim sees). So one issue's deliveries run in order, never on two replicas at
# once, with no claim ever waiting for another. (Keys are numbered as every key is,
# bot.store.locks; while a replica of an older release lives, its way is tried too: there,
# one key, `issue:`, which its intake took as ours does `intake:`.)
# (A row about an issue that a replica of the release before queued, during a rolling upgrade,
# has no office: its issue's owner is taken for it.)
CANDIDATES = ("SELECT q.id, q.issue_key FROM queue q WHERE q.id>=? AND q.id<?"
              " AND NOT (q.id = ANY(?::bigint[]))"
              " AND (q.issue_key IS NULL AND q.id<? AND (q.office IS NOT NULL OR ?::boolean)"
              " OR q.issue_key IS NOT NULL AND NOT (q.issue_key = ANY(?::text[])))"
              " AND NOT coalesce(coalesce(q.office, lower(split_part(q.issue_key, '/', 1)))"
              " = ANY(?::text[]), false)"
              " AND q.state='pending' AND q.next_at<=coalesce(?, vm_now())"
              " AND (q.lease_owner IS NULL"
              " OR q.lease_owner=? OR (q.lease_owner NOT IN (" + _LIVE + ") AND "
              + _STEADY_ME + ")) AND (q.issue_key IS NULL OR (pg_try_advisory_xact_lock("
              + lock_pair_sql("'issue:' || q.issue_key") + ") AND pg_try_advisory_lock_shared("
              + lock_pair_sql("'intake:' || q.issue_key") + ") AND pg_advisory_unlock_shared("
              + lock_pair_sql("'intake:' || q.issue_key") + ") AND (NOT ?::boolean OR"
              " hashtextextended('issue:' || q.issue_key, 0) = ANY(?::bigint[]) OR"
              " pg_try_advisory_xact_lock(hashtextextended('issue:' || q.issue_key, 0)))))"
              " ORDER BY q.id LIMIT ? FOR UPDATE OF q SKIP LOCKED")
# (the rows up to the last candidate, through `queue_held`; the claimed ones after it, which
# are few, through `queue_leased`: a claim reads what is in flight, not the issues' backlog)
_PENDING_ROW = ("SELECT id, issue_key, lease_owner, lease_owner IN (" + _LIVE + ") AS live"
                " FROM queue WHERE state='pending' AND issue_key = ANY(?::text[])")
EARLIER = (_PENDING_ROW + " AND id<=? UNION ALL " + _PENDING_ROW
           + " AND lease_owner IS NOT NULL AND id>? AND lease_owner<>? ORDER BY id")
TAKE = ("UPDATE queue SET takeovers=takeovers+(CASE WHEN " + "lease_owner IS NOT NULL AND"
        " lease_owner<>? THEN 1 ELSE 0 END), lease_owner=?, lease_seq=lease_seq+1"
        " WHERE id = ANY(?::bigint[]) RETURNING *")


def in_order(candidates: list[tuple[int, str | None]],
             pending: list[tuple[int, str, str | None, bool]], me: str) -> list[int]:
    """Of a claim's candidates (id, issue), the ids it may take: a row about an issue only if
    every pending row of that issue before it is taken by this claim or already this
    replica's, and no row of the issue is another live replica's (`pending`: id, issue, owner,
    whether the owner is live; in id order). Sans-I/O."""
    chosen = {i for i, _ in candidates}
    taken = [i for i, key in candidates if key is None]
    busy = {key for _, key, owner, live in pending if owner not in (None, me) and live}
    blocked: set[str] = set(busy)
    for ident, key, owner, _ in pending:
        if key in blocked:
            continue
        if ident in chosen:
            taken.append(ident)
        elif owner != me:
            blocked.add(key)
    return sorted(taken)


def claim_params(me: str, at: float | None, first: int, limit: int,
                 excluding: Collection[int] = (), excluding_issues: Collection[str] = (),
                 barriers_before: int = NO_HOLD,
                 excluding_offices: Collection[str] = ()) -> tuple[Any, ...]:
    """CLAIM's parameters for replica `me` at time `at` (None: now by the database's clock),
    the window from id `first` on, leaving the ids `excluding` and the deliveries about the
    issues `excluding_issues` alone, and the barriers from `barriers_before` on."""
    return (first, first + WINDOW, json.dumps(sorted(excluding)), barriers_before,
            not excluding_offices, json.dumps(sorted(excluding_issues)),
            json.dumps(sorted(excluding_offices)), at, me, me, at, me, limit)


def wakeup_params(me: str, at: float | None) -> tuple[Any, ...]:
    return (me, me, at, me)


# Suspects and poison. A delivery that a replica held when it stopped (killed, crashed, or
# taken for dead) may be what stopped it: an input that exhausts memory or crashes a parser
# would otherwise be taken over and stop replica after replica for ever. Such a suspect runs
# alone: a claim ends just before it, or holds it and nothing else, so the deliveries that
# merely shared its batch run on and only the culprit keeps being counted. A delivery held
# POISON_AFTER times by a replica that stopped becomes a dead letter instead of being run.
POISON_AFTER = 3
# Every takeover counts: only a steady replica takes a dead one's claims (see _STEADY_ME).
_STOPPED_HOLDER = "lease_owner IS NOT NULL AND lease_owner<>?"


async def _set_suspects_apart(db: Connection, rows: list[Any]) -> list[Any]:
    """Of a claim's rows (in order), what this replica may run now; dead-letters poison and
    lets go of the rest."""
    for row in [r for r in rows if r["takeovers"] >= POISON_AFTER]:
        await db.execute(
            "UPDATE queue SET state='dead', lease_owner=NULL, finished_at=vm_now(),"
            " last_error=? WHERE id=?",
            (f"a replica stopped {row['takeovers']} times while it held this delivery (one"
             " that crashes the app or exhausts its memory?): not run again; fix the cause,"
             " then `vaultmail dead-letters --replay`", row["id"]))
        log.error("dead letter: replicas stopped %d times holding it", row["takeovers"],
                  extra={"delivery_id": row["guid"]})
    rows = [r for r in rows if r["takeovers"] < POISON_AFTER]
    first = next((n for n, r in enumerate(rows) if r["takeovers"] > 0), None)
    if first is None:
        return rows
    keep, rest = (rows[:1], rows[1:]) if first == 0 else (rows[:first], rows[first:])
    if rest:
        marks = ",".join("?" for _ in rest)
        await db.execute(f"UPDATE queue SET lease_owner=NULL WHERE id IN ({marks})",
                         tuple(r["id"] for r in rest))
    return keep


async def _finish_in(db: Connection, item: QueueItem, state: str, me: str, at: float) -> bool:
    """Mark `item` finished (done, ignored) at `at` under the claim it ran under; False when
    that claim is no longer this replica's."""
    changed = await db.execute("UPDATE queue SET state=?, finished_at=?, lease_owner=NULL"
                               " WHERE id=? AND " + _OURS,
                               (state, at, item.id, me, item.lease))
    return changed == 1


FINISH_BATCH = 200  # finishes in one statement at most (two parameters each, twice)
# PostgreSQL's finishes, and let-gos (state NULL), take only the rows no other transaction
# holds now: one office's rows held by another replica's long transaction must not hold up
# every office's finishes until lock_timeout. Per row: recorded (`done`), held (`held`: to be
# tried again in the next write), or neither (its claim is no longer this replica's).
# (parameters: the ids, states and claims, the ids, when, the replica, the ids)
FINISH_FREE = (
    "WITH f(id, state, seq) AS (SELECT * FROM unnest(?::bigint[], ?::text[], ?::bigint[])),"
    " lockable AS (SELECT id FROM queue WHERE id = ANY(?::bigint[]) ORDER BY id"
    " FOR UPDATE SKIP LOCKED),"
    " held AS (SELECT l.id FROM queue l WHERE l.id IN (SELECT id FROM f) AND (l.id NOT IN"
    " (SELECT id FROM lockable) OR EXISTS (SELECT 1 FROM queue e WHERE e.id IN (SELECT id"
    " FROM f) AND e.id NOT IN (SELECT id FROM lockable) AND e.issue_key=l.issue_key"
    " AND e.id<l.id))),"
    " done AS (UPDATE queue q SET state=coalesce(f.state, q.state), finished_at=CASE WHEN"
    " f.state IS NULL THEN q.finished_at ELSE ?::float8 END, lease_owner=NULL FROM f"
    " WHERE q.id=f.id AND q.id IN (SELECT id FROM lockable) AND q.id NOT IN (SELECT id"
    " FROM held) AND q.state='pending'"
    " AND q.lease_owner=? AND q.lease_seq=f.seq RETURNING q.id)"
    " SELECT id, id IN (SELECT id FROM done) AS done, id IN (SELECT id FROM held)"
    " AS held FROM queue WHERE id = ANY(?::bigint[])")


# Letting go of every claim of this replica's (`release`, and `leave` at a clean stop): on
# PostgreSQL only the rows no other transaction holds now, as FINISH_FREE; one held by another
# replica's long transaction on one office's rows stays this replica's, claimed again by it
# (`release`) or, once it is gone (`leave`), taken over as a dead replica's (DEAD_AFTER), instead
# of holding up the let-go of every office's rows until lock_timeout. (parameter: the replica)
LET_GO_FREE = Sql(
    "UPDATE queue SET lease_owner=NULL WHERE lease_owner=? AND state='pending'",
    "UPDATE queue SET lease_owner=NULL WHERE id IN (SELECT id FROM queue WHERE lease_owner=$1"
    " AND state='pending' FOR UPDATE SKIP LOCKED) AND lease_owner=$1 AND state='pending'")


async def _finish_free_in(db: Connection, finished: Sequence[tuple[QueueItem, str | None]],
                          me: str, at: float) -> list[bool | None]:
    """PostgreSQL's `_finish_all_in`, a state of None letting go of the claim instead: for
    each, True (recorded), False (its claim is another's now) or None (another transaction
    holds its row: try again later). A delivery named twice is recorded once, its first
    time."""
    firsts: dict[int, tuple[QueueItem, str | None]] = {}
    for item, state in finished:
        firsts.setdefault(item.id, (item, state))
    if not firsts:
        return []
    ids = list(firsts)
    rows = await db.fetchall(FINISH_FREE, (
        ids, [state for _, state in firsts.values()], [item.lease for item, _ in
                                                       firsts.values()], ids, at, me, ids))
    outcome = {int(r["id"]): None if r["held"] else bool(r["done"]) for r in rows}
    recorded: list[bool | None] = []
    seen: set[int] = set()
    for item, _ in finished:
        recorded.append(False if item.id in seen else outcome.get(item.id, False))
        seen.add(item.id)
    return recorded


async def _finish_all_in(db: Connection, engine: str, finished: list[tuple[QueueItem, str]],
                         me: str, at: float) -> list[bool]:
    """`_finish_in` for each of `finished`, in order: whether each was recorded. On SQLite in
    one statement per FINISH_BATCH (one hop to the connection's thread instead of one each),
    each row under the claim it ran under, as one at a time would; a delivery named twice is
    recorded once, its first time."""
    if engine != "sqlite" or len(finished) < 2:
        return [await _finish_in(db, item, state, me, at) for item, state in finished]
    recorded: list[bool] = []
    for start in range(0, len(finished), FINISH_BATCH):
        chunk = finished[start:start + FINISH_BATCH]
        firsts: dict[int, tuple[QueueItem, str]] = {}
        for item, state in chunk:
            firsts.setdefault(item.id, (item, state))
        whens = " ".join("WHEN ? THEN ?" for _ in firsts)
        marks = ",".join("?" for _ in firsts)
        rows = await db.fetchall(
            f"UPDATE queue SET state=CASE id {whens} END, finished_at=?, lease_owner=NULL"
            f" WHERE id IN ({marks}) AND state='pending' AND lease_owner=?"
            f" AND lease_seq=CASE id {whens} END RETURNING id",
            (*(v for i, (_, st) in firsts.items() for v in (i, st)), at, *firsts, me,
             *(v for i, (it, _) in firsts.items() for v in (i, it.lease))))
        landed = {int(r[0]) for r in rows}
        seen: set[int] = set()
        for item, _ in chunk:
            recorded.append(item.id in landed and item.id not in seen)
            seen.add(item.id)
    return recorded


class QueueMixin:
    """The queue's half of Store (see bot.store.db)."""

    # deliveries waiting for the next group commit (taken from its left in the store's
    # thread on SQLite, added to on the event loop's: each is one step under the GIL)
    _arrivals: deque[_Arrival]
    _arrivals_writer: asyncio.Task[None] | None  # the one task committing them, while any wait
    # issue (or a lone delivery id) -> arrivals waiting for another intake (PostgreSQL; _park)
    _parked: dict[str, deque[_Arrival]]
    _parked_writer: asyncio.Task[None] | None  # the one task committing those, while any
    _finishes: list[tuple[QueueItem, str, asyncio.Future[bool]]]  # finished deliveries, too
    # finishes (a state) and let-gos (None) whose rows another transaction held: for the next
    # finish_and_claim (PostgreSQL)
    _carried: list[tuple[QueueItem, str | None]]
    _finishes_writer: asyncio.Task[None] | None
    # delivery id -> (when, by time.monotonic, the payload intake parsed)
    _handed_over: dict[str, tuple[float, dict[str, Any]]]
    replica_id: str
    incarnation: str
    retired: str | None
    engine: ClassVar[str]

    if TYPE_CHECKING:
        def transaction(self, *keys: str) -> AbstractAsyncContextManager[Connection]: ...
        async def run_transaction(self, body: Callable[[Connection], Awaitable[T]],
                                  *keys: str) -> T: ...
        def retire(self) -> str: ...
        async def fetchone(self, sql: Statement,
                           params: Sequence[Any] = ()) -> Row | None: ...
        async def fetchall(self, sql: Statement,
                           params: Sequence[Any] = ()) -> list[Row]: ...

    async def enqueue_delivery(
        self, guid: str, event: str, payload: dict[str, Any], raw: bytes, *, run: bool = True,
        key: str | None = None
    ) -> bool:
        """Record a delivery and queue it; False when this delivery id was seen before.
        `run=False`: its id recorded alone, nothing queued (one no handler acts on: the
        reconciler still knows it came, and asks for it no more). `key`: the issue it is
        about (`issue_key`) under the names now, where its payload names the issue as it was
        called before a rename (None: as its payload names it), so that it runs in order with
        the issue's deliveries under the new name.

        Deliveries arriving together are written in one transaction (group commit), and each
        caller is answered only once its delivery is committed: durable before the 2xx, with
        a handful of statements per batch instead of per delivery."""
        loop = asyncio.get_running_loop()
        arrival = _Arrival(guid, event, payload, raw, loop.create_future(), run, key)
        self._arrivals.append(arrival)
        if self._arrivals_writer is None:  # one writer drains them all, batch after batch
            self._arrivals_writer = loop.create_task(self._write_arrivals())
        return await arrival.done

    async def _write_arrivals(self) -> None:
        """The group-commit writer. A batch is taken only once its transaction has begun (on
        SQLite: once the one writer's turn came), so whatever arrived while the previous one
        ran joins one commit, instead of each arrival queueing a small transaction of its own
        behind it."""
        try:
            await asyncio.sleep(0)  # let deliveries that arrived together join the first batch
            while self._arrivals:
                await self._commit_arrivals()
        finally:
            self._arrivals_writer = None

    def _take_arrivals(self, into: list[_Arrival]) -> list[_Arrival]:
        """Up to BATCH of the arrivals waiting, appended to `into` as each is taken (those
        about an issue whose earlier arrivals wait for another intake join them, in order)."""
        parked = self._parked
        while len(into) < BATCH:
            try:
                arrival = self._arrivals.popleft()
            except IndexError:
                break
            if parked and (key := arrival.parked_as) in parked:
                self._park(key, arrival)
            else:
                into.append(arrival)
        return into

    async def _commit_arrivals(self) -> None:
        batch: list[_Arrival] = []

        async def insert(db: Connection) -> set[_Arrival]:
            return await self._insert_arrivals(db, self._take_arrivals(into=batch))

        try:  # (SQLite: one trip, with whatever other writes wait for the writer)
            fresh = await self.run_transaction(insert)
        except Exception:  # one arrival's fault must not fail the others: each on its own
            await self._commit_each(batch or self._take_arrivals(into=[]))
            return
        self._answer(batch, fresh)

    def _answer(self, batch: list[_Arrival], fresh: set[_Arrival]) -> None:
        """Committed: hand `fresh` over to the worker, and tell each caller of `batch`."""
        self._hand_over([a for a in batch if a in fresh and a.run])
        for a in batch:
            if not a.done.done():
                a.done.set_result(a in fresh)

    async def _commit_each(self, batch: list[_Arrival]) -> None:
        """Each arrival in a transaction of its own, waiting for its issue's intake key."""
        for a in batch:
            try:
                async with self.transaction() as db:
                    alone = await self._insert_arrivals(db, [a], wait=True)
            except Exception as exc:
                if not a.done.done():
                    a.done.set_exception(exc)
            else:
                self._answer([a], alone)

    def _park(self, key: str, arrival: _Arrival) -> None:
        """One of `arrival`'s intake keys is held by another intake (a replica may be paused
        inside it): it waits for that, with the later arrivals of its issue (`key`, its
        `parked_as`), and the batch it came in with goes on without it (PostgreSQL)."""
        self._parked.setdefault(key, deque()).append(arrival)
        if self._parked_writer is None:
            self._parked_writer = asyncio.get_running_loop().create_task(self._commit_parked())

    async def _commit_parked(self) -> None:
        """Commit what waits about each parked issue once its intake key is free, trying for
        them all in one transaction now and then (PARKED_POLL): never waiting for a key
        inside a transaction, which would hold a writer's turn and a pooled connection all the
        while (a paused intake holds up to BATCH issues' keys: parked arrivals each waiting
        would take every writer's turn, and every office's intake and claims would wait for
        the paused one after all). An issue stays parked until what waited is committed, so
        its later arrivals come after."""
        parked = self._parked
        waited = False
        held: set[str] = set()  # the intake keys refused in the last round
        try:
            while parked:
                groups = {key: list(waiting) for key, waiting in parked.items()}
                needs = {key: dict(k for a in group for k in a.intake_keys)
                         for key, group in groups.items()}

                async def insert(db: Connection, groups: dict[str, list[_Arrival]] = groups,
                                 needs: dict[str, dict[str, str | None]] = needs
                                 ) -> dict[str, set[_Arrival]]:
                    # (the free ones' keys are held now: taken again at once below)
                    held.clear()
                    held.update(await self._refused(db, sorted(
                        {k: i for keys in needs.values() for k, i in keys.items()}.items())))
                    return {key: await self._insert_arrivals(db, group, wait=True)
                            for key, group in groups.items() if not held & needs[key].keys()}

                try:
                    done = await self.run_transaction(insert)
                except Exception:  # one arrival's fault must not fail the others
                    for key, group in groups.items():
                        for _ in group:
                            parked[key].popleft()
                        await self._commit_each(group)
                    done = {}
                for key, fresh in done.items():
                    for _ in groups[key]:
                        parked[key].popleft()
                    self._answer(groups[key], fresh)
                for key in [key for key, waiting in parked.items() if not waiting]:
                    del parked[key]
                if not parked or len(done) == len(groups):
                    waited = False
                    continue  # (only what came meanwhile is left: at once)
                # (the oldest group a key refused in this round holds back)
                refused = next((sorted(held & needs[key].keys()) for key in parked
                                if key in needs and held & needs[key].keys()), [])
                if refused and (done or not waited):  # until the oldest one's key is free,
                    waited = await self._until_free(refused[0])  # or a moment
                else:  # (free to this release, still held the older releases' way)
                    waited = False
                    await asyncio.sleep(PARKED_POLL)
        finally:
            self._parked_writer = None

    async def _until_free(self, key: str) -> bool:
        """Until intake key `key` is free, PARKED_POLL at most: one statement on a
        pooled connection, outside any transaction (no writer's turn held, nothing held once
        it returns). True when it was free by then."""
        try:
            await self.fetchone(
                "SELECT set_config('lock_timeout', ?, true),"
                " pg_advisory_xact_lock_shared(?::int, ?::int)",
                (f"{int(PARKED_POLL * 1000)}ms", *lock_pair(key)))
        except Exception:  # still held (the wait ran out), or the database is away: the next
            return False  # round tries again, or answers with its error
        return True

    async def _refused(self, db: Connection, keys: list[tuple[str, str | None]]) -> set[str]:
        """Of intake keys `keys` (sorted; each with the issue it is of, if one), those another
        intake holds (or, for an issue's, while an older replica lives, the older releases'
        issue key); the others' are taken, without waiting for any."""
        pairs = [lock_pair(key) for key, _ in keys]
        return {row[0] for row in await db.fetchall(
            "SELECT k FROM unnest(?::text[], ?::int[], ?::int[], ?::text[]) AS p(k, h, l, i)"
            " WHERE NOT CASE WHEN NOT pg_try_advisory_xact_lock(h, l) THEN false"
            " WHEN i IS NULL OR NOT ?::boolean THEN true"
            " ELSE (SELECT CASE WHEN o = ANY(?::bigint[]) THEN true"
            " ELSE pg_try_advisory_xact_lock(o) END"
            " FROM (SELECT hashtextextended('issue:' || i, 0) AS o) x) END",
            ([k for k, _ in keys], [h for h, _ in pairs], [lo for _, lo in pairs],
             [i for _, i in keys], db.older_keys, RESERVED))}

    async def _park_held(self, db: Connection, batch: list[_Arrival]) -> None:
        """Take the intake keys of `batch` (each issue's and delivery id's) where they are free
        (and, while an older replica lives, the older releases' issue key too); take the
        arrivals one of whose keys another intake holds out of `batch`, with the later ones of
        their issues, to wait for it on their own: a batch, which mixes offices, never waits
        for another intake."""
        if not batch:
            return
        refused = await self._refused(db, sorted({k: i for a in batch
                                                  for k, i in a.intake_keys}.items()))
        if refused:
            kept, parking = [], set()
            for a in batch:
                if a.parked_as in parking or any(k in refused for k, _ in a.intake_keys):
                    parking.add(a.parked_as)
                    self._park(a.parked_as, a)
                else:
                    kept.append(a)
            batch[:] = kept

    async def _wait_for_intakes(self, db: Connection, batch: list[_Arrival]) -> None:
        """Take the intake keys of `batch` (each issue's and delivery id's), waiting for other
        intakes of them (before any row is written: nothing is held while waiting)."""
        issues = sorted({a.key for a in batch if a.key is not None})
        pairs = sorted({lock_pair(key) for a in batch for key, _ in a.intake_keys})
        await db.execute("SELECT pg_advisory_xact_lock(h, l) FROM unnest(?::int[], ?::int[])"
                         " AS p(h, l)", ([h for h, _ in pairs], [lo for _, lo in pairs]))
        # and while an older replica lives, the older releases' issue key, as they take it:
        # in its order (the database's), never as one of the fixed numbers
        if db.older_keys and issues:
            await db.execute("SELECT pg_advisory_xact_lock(h) FROM (SELECT"
                             " hashtextextended(k, 0) AS h FROM (SELECT 'issue:' || k AS k"
                             " FROM unnest(?::text[]) k ORDER BY 1) o) s"
                             " WHERE h <> ALL(?::bigint[])", (issues, RESERVED))

    async def _insert_arrivals(self, db: Connection, batch: list[_Arrival], *,
                               wait: bool = False) -> set[_Arrival]:
        """Record and queue `batch`, returning those not recorded before. On PostgreSQL each
        issue's intake key is `wait`ed for, else taken where free and the arrivals about the
        others taken out of `batch` (see _park_held)."""
        now = time.time()
        if self.engine == "postgresql":
            # each issue's deliveries are numbered in the order they commit: the issue's
            # intake key (which a claim looks at, skipping the issue) is held from before
            # numbering to commit; another intake's wait for it, never a claim's (and each
            # delivery id's, so no intake waits on another's uncommitted row of the id below)
            await (self._wait_for_intakes if wait else self._park_held)(db, batch)
        if not batch:
            return set()
        firsts: dict[str, _Arrival] = {}
        for a in batch:  # the first arrival of an id is the one queued
            firsts.setdefault(a.guid, a)
        if self.engine == "postgresql":
            # the delivery id's primary key decides, in one statement: of replicas recording
            # one id at once, the one whose row lands queues it (in order of id: two replicas
            # taking in the same redeliveries never wait for each other's rows in a circle)
            ordered = sorted(firsts.values(), key=lambda a: a.guid)
            rows = await db.fetchall(
                "INSERT INTO deliveries(guid, event, action, installation_id, received_at)"
                " SELECT * FROM unnest(?::text[], ?::text[], ?::text[], ?::bigint[],"
                " ?::float8[]) ON CONFLICT(guid) DO NOTHING RETURNING guid",
                ([a.guid for a in ordered], [a.event for a in ordered],
                 [a.action for a in ordered], [a.installation_id for a in ordered],
                 [now] * len(ordered)))
            landed = {row[0] for row in rows}
        else:  # one writer: what is not recorded yet is this transaction's to record
            marks = ",".join("?" for _ in firsts)
            seen = {row[0] for row in await db.fetchall(
                f"SELECT guid FROM deliveries WHERE guid IN ({marks})", tuple(firsts))}
            landed = set(firsts) - seen
            await db.executemany(
                "INSERT INTO deliveries(guid, event, action, installation_id, received_at)"
                " VALUES (?,?,?,?,?)",
                [(a.guid, a.event, a.action, a.installation_id, now)
                 for a in firsts.values() if a.guid in landed])
        fresh = {a for guid, a in firsts.items() if guid in landed}
        await db.executemany(
            "INSERT INTO queue(guid, event, installation_id, issue_key, office, payload,"
            " next_at, created_at) VALUES (?,?,?,?,?,?,vm_now(),?)",
            [(a.guid, a.event, a.installation_id, a.key, a.office, _payload_text(a),
              now) for a in batch if a in fresh and a.run])
        return fresh

    def _hand_over(self, arrivals: list[_Arrival]) -> None:
        """Once committed, keep the parsed payloads for the worker (it pops each on its first
        take; a retry parses the stored text again, so nothing a handler changed sticks)."""
        handed = self._handed_over
        now = time.monotonic()
        for a in arrivals:
            if len(handed) >= HANDED_OVER:
                oldest = next(iter(handed))  # (kept in the order they came)
                if handed[oldest][0] > now - HANDED_OVER_FOR:
                    return
                del handed[oldest]
            handed[a.guid] = (now, a.payload)

    async def next_due(self, now: float | None = None) -> QueueItem | None:
        row = await self.fetchone(
            Sql("SELECT * FROM queue INDEXED BY queue_claim_office", "SELECT * FROM queue")
            + " WHERE state='pending' AND next_at<=coalesce(?, vm_now()) ORDER BY id LIMIT 1",
            (now,),
        )
        return _item(row) if row else None

    async def due_items(self, limit: int, now: float | None = None) -> list[QueueItem]:
        """Claim the oldest due deliveries for this replica, in arrival order (see _CLAIMABLE).
        What the claim holds is let go by `finish`, `fail` or `release`."""
        claimed, _ = await self.finish_and_claim([], limit, now)
        return claimed

    async def finish_and_claim(self, finished: list[tuple[QueueItem, str]], limit: int,
                               now: float | None = None,
                               also: Callable[[Connection], Awaitable[None]] | None = None,
                               then: Callable[[Connection, list[QueueItem]], Awaitable[None]]
                               | None = None, excluding: Collection[int] = (),
                               excluding_issues: Collection[str] = (),
                               let_go: Sequence[QueueItem] = (),
                               excluding_offices: Collection[str] = (),
                               sharing: Collection[str] = (),
                               ) -> tuple[list[QueueItem], list[QueueItem]]:
        """Mark deliveries finished (as `finish` does, each under its claim), let go of the
        claims of `let_go` (claimed, not run: free again for any replica, this one included)
        and claim the next ones, leaving alone the ids `excluding` (what this replica is
        running), the issues `excluding_issues` (whole: their order holds) and the offices
        `excluding_offices`, and taking the offices `sharing` (each running its share of the
        worker) only once every other office's due deliveries are taken: one
        transaction, the worker's one write between two claims (`also` writes in it first:
        the results of what the deliveries ran once; `then` last, given what was claimed:
        their claims of what they will run once). Returns what it claimed, and which
        of `finished` were not recorded (taken over meanwhile)."""
        # what an earlier call could not record (its rows held by another transaction: see
        # FINISH_FREE) is tried first; it is not claimed again meanwhile, nor is anything
        # after it of its issue (which a stop before it is recorded would run after it)
        carried, self._carried = self._carried, []
        finished = [*((item, state) for item, state in carried if state is not None),
                    *finished]
        let_go = [*(item for item, state in carried if state is None), *let_go]
        if self.retired is not None:  # another process holds this replica's id now
            return [], [item for item, _ in finished]
        at = now  # None: the database's clock (bot.store.db, vm_now)
        me = self.replica_id
        handed = self._handed_over
        held: list[tuple[QueueItem, str | None]] = []  # rows held elsewhere: carried

        async def claim(db: Connection) -> tuple[list[QueueItem], list[QueueItem], bool]:
            """(claimed, superseded, whether another process holds this replica's id)"""
            if await id_taken(db, me, self.incarnation):
                return [], [item for item, _ in finished], True
            if also is not None:
                await also(db)
            now = time.time()
            held.clear()
            excluding_ids, issues_left = set(excluding), set(excluding_issues)
            if self.engine == "postgresql":
                ends = [*finished, *((item, None) for item in let_go)]
                outcomes = await _finish_free_in(db, ends, me, now)
                superseded = [item for (item, state), ok in zip(ends, outcomes, strict=True)
                              if ok is False and state is not None]
                held.extend(end for end, ok in zip(ends, outcomes, strict=True) if ok is None)
                excluding_ids.update(item.id for item, _ in held)
                issues_left.update(key for item, _ in held
                                   if (key := item.issue_key) is not None)
            else:
                superseded = [item for (item, _), ok in zip(
                    finished, await _finish_all_in(db, self.engine, finished, me, now),
                    strict=True) if not ok]
                for item in let_go:  # (under the claim it was taken with, as a finish)
                    await db.execute("UPDATE queue SET lease_owner=NULL WHERE id=? AND "
                                     + _OURS, (item.id, me, item.lease))
            # window after window, taking what one look at every pending row would: whether a
            # row may be taken depends on the rows before it, and one this claim took holds
            # nothing back now (it is this replica's) as it held nothing back before
            rows: list[Any] = []
            # SQLite: one now for the whole claim (its vm_now is read anew by each row and
            # statement, so a row about an issue falling due between two windows was neither
            # taken nor held back a later one about its issue, which then ran first)
            claim_at = at
            hold = NO_HOLD
            if issues_left and limit:
                left: tuple[Any, ...] = (sorted(issues_left), sorted(excluding_ids))
                if self.engine == "sqlite":
                    left = tuple(json.dumps(ids) for ids in left)
                found = next(iter(await db.fetchall(FIRST_LEFT, left)), None)
                if found is not None and found["id"] is not None:
                    hold = int(found["id"])
            if claim_at is None and self.engine == "sqlite" and limit:
                claim_at = float((await db.fetchall("SELECT vm_now() AS t"))[0]["t"])

            async def take(out: Collection[str], left: Collection[int]) -> None:
                """Window after window, up to `limit`, leaving the offices `out` alone."""
                start = 0
                while len(rows) < limit:
                    if out:
                        offices: Any = sorted(out)
                        if self.engine == "sqlite":
                            offices = json.dumps(offices)
                        look = await db.fetchall(NEXT_PENDING_BUT, (start, start, offices))
                    else:
                        look = await db.fetchall(NEXT_PENDING, (start,))
                    first = next(iter(look), None)
                    if first is None or first["id"] is None:
                        break
                    start = int(first["id"]) + WINDOW
                    if self.engine == "postgresql":
                        rows.extend(await self._claim_side_by_side(
                            db, at, int(first["id"]), limit - len(rows), left,
                            issues_left, hold, out))
                        continue
                    rows.extend(await db.fetchall(
                        "UPDATE queue SET takeovers=takeovers+(CASE WHEN " + _STOPPED_HOLDER
                        + " THEN 1 ELSE 0 END), lease_owner=?, lease_seq=lease_seq+1"
                        " WHERE id IN (" + CLAIM + ") RETURNING *",
                        (me, me, *claim_params(me, claim_at, int(first["id"]),
                                               limit - len(rows), left, issues_left,
                                               hold, out))))

            # the offices holding their share of the worker first wait for the others' due
            # deliveries, then take the room those leave (one office's backlog is not run
            # before everything another queued after it, and the room is never left idle)
            await take({*excluding_offices, *sharing}, excluding_ids)
            if sharing and len(rows) < limit:
                await take(excluding_offices, {*excluding_ids, *(int(r["id"]) for r in rows)})
            rows = await _set_suspects_apart(db, sorted(rows, key=lambda r: int(r["id"])))
            items = [_item(r, kept[1] if (kept := handed.get(r["guid"])) else None)
                     for r in rows]
            if then is not None and items:
                await then(db, items)
            return items, superseded, False

        # one trip (SQLite): the worker's one write between batches holds the one writer
        try:
            items, superseded, taken = await self.run_transaction(claim)
        except BaseException:
            self._carried[:0] = carried
            raise
        self._carried.extend(held)
        if taken:
            self.retire()
        for item in items:  # (kept until the claim is committed: else it is parsed again)
            handed.pop(item.guid, None)
        return items, superseded

    async def _claim_side_by_side(self, db: Connection, at: float | None, first: int,
                                  limit: int, excluding: Collection[int] = (),
                                  excluding_issues: Collection[str] = (),
                                  hold: int = NO_HOLD,
                                  excluding_offices: Collection[str] = ()) -> list[Any]:
        """PostgreSQL's claim of one window (see CANDIDATES): the rows it took."""
        me = self.replica_id
        candidates = [(int(r["id"]), r["issue_key"]) for r in await db.fetchall(
            CANDIDATES, (first, first + WINDOW, sorted(excluding), hold,
                         not excluding_offices, sorted(excluding_issues),
                         sorted(excluding_offices), at, me, me,
                         db.older_keys, RESERVED, limit))]
        if not candidates:
            return []
        keys = sorted({key for _, key in candidates if key is not None})
        pending: list[tuple[int, str, str | None, bool]] = []
        if keys:
            last = max(i for i, _ in candidates)
            pending = [(int(r["id"]), str(r["issue_key"]), r["lease_owner"], bool(r["live"]))
                       for r in await db.fetchall(EARLIER, (keys, last, keys, last, me))]
        taken = in_order(candidates, pending, me)
        if not taken:
            return []
        return list(await db.fetchall(TAKE, (me, me, taken)))

    def has_carried(self) -> bool:
        """Whether finishes or let-gos wait for the next `finish_and_claim` (their rows were
        held by another transaction)."""
        return bool(self._carried)

    async def release(self) -> None:
        """Let go of this replica's claims on what it did not get to (a batch cut short)."""
        async with self.transaction() as db:
            if await id_taken(db, self.replica_id, self.incarnation):
                self.retire()
                return  # (what is leased under the id is the other process's)
            await db.execute(LET_GO_FREE, (self.replica_id,))

    async def next_wakeup(self) -> float | None:
        """When the next delivery this replica could claim becomes due."""
        if self.retired is not None:
            return None
        row = await self.fetchone(WAKEUP, wakeup_params(self.replica_id, None))
        # due in t seconds by the database's clock: when that is by this host's
        return time.time() + float(row["t"]) if row and row["t"] is not None else None

    async def pending_about(self, issue: str) -> bool:
        """Whether a delivery about `issue` (owner/repo#N, any case) waits to be handled."""
        row = await self.fetchone("SELECT 1 FROM queue WHERE state='pending'"
                                  " AND issue_key=? LIMIT 1", (issue.lower(),))
        return row is not None

    async def others_about(self, issue: str, besides: str) -> bool:
        """Whether a delivery about `issue` (its `issue_key`) other than `besides` (a guid)
        waits, to be handled or parked: something more about the issue has arrived."""
        row = await self.fetchone(OTHERS_ABOUT, (issue.lower(), besides) * 2)
        return row is not None

    async def unpark(self, issue: str) -> int:
        """The deliveries about `issue` (its `issue_key`) parked until it became mail are due
        again, in their order (before any later one of the issue); returns how many.

        Every adoption asks, and almost never finds one: a read (through `queue_parked`)
        says so without a write transaction. (No park can land between the two: a
        delivery's park is recorded as soon as its handler is done, before a later delivery
        of its issue runs, and a park recorded by another replica meanwhile is missed by the
        update alone just the same.)"""
        issue = issue.lower()  # (keys are stored in lower case: issue_key)
        if await self.fetchone("SELECT 1 FROM queue WHERE state='parked' AND issue_key=?"
                               " LIMIT 1", (issue,)) is None:
            return 0
        async with self.transaction() as db:
            changed = await db.execute(
                "UPDATE queue SET state='pending', lease_owner=NULL, finished_at=NULL,"
                " next_at=vm_now() WHERE state='parked' AND issue_key=?", (issue,))
            return changed

    async def pending_count(self) -> int:
        row = await self.fetchone("SELECT COUNT(*) AS n FROM queue WHERE state='pending'")
        return int(row["n"]) if row else 0

    async def finish(self, item: QueueItem, state: str = "done") -> bool:
        """Mark a delivery finished; returns once that is committed, False when its claim was
        no longer this replica's (taken over meanwhile: the outcome here is not recorded).
        Finishes made together (the worker runs several deliveries side by side) share one
        transaction, one commit instead of one each."""
        loop = asyncio.get_running_loop()
        done: asyncio.Future[bool] = loop.create_future()
        self._finishes.append((item, state, done))
        if self._finishes_writer is None:
            self._finishes_writer = loop.create_task(self._write_finishes())
        return await done

    async def _write_finishes(self) -> None:
        try:
            await asyncio.sleep(0)  # let finishes made together join the first batch
            while self._finishes:
                batch: list[tuple[QueueItem, str, asyncio.Future[bool]]] = []
                recorded: list[bool | None] = []
                try:
                    async with self.transaction() as db:
                        batch, self._finishes[:] = self._finishes[:BATCH], self._finishes[BATCH:]
                        now = time.time()
                        if self.engine == "postgresql":  # (rows held elsewhere: next round)
                            recorded = await _finish_free_in(
                                db, [(item, state) for item, state, _ in batch],
                                self.replica_id, now)
                        for item, state, _ in batch[len(recorded):]:
                            recorded.append(await _finish_in(db, item, state,
                                                             self.replica_id, now))
                except Exception as exc:  # the worker retries its store calls
                    for _, _, done in batch or self._finishes[:]:
                        if not done.done():
                            done.set_exception(exc)
                    if not batch:
                        self._finishes.clear()
                    continue
                again = [finish for finish, ok in zip(batch, recorded, strict=True)
                         if ok is None]
                for (_, _, done), ok in zip(batch, recorded, strict=True):
                    if ok is not None and not done.done():
                        done.set_result(ok)
                if again:  # each waits alone, the others answered: a moment, then again
                    self._finishes[:0] = again
                    if len(again) == len(self._finishes):
                        await asyncio.sleep(PARKED_POLL)
        finally:
            self._finishes_writer = None

    async def fail(self, item: QueueItem, error: str, retry_at: float | None, *,
                   counted: bool = True) -> bool:
        """Count a failed attempt; with no retry time the item becomes a dead letter. False
        when its claim was no longer this replica's (nothing is recorded then). `retry_at` is
        by this host's clock; the row keeps it by the database's (as far ahead of its now), so
        replicas whose clocks disagree retry it when it is due. Not `counted`: put off until
        `retry_at` (it waits for the forge's budget, nothing failed)."""
        state = "pending" if retry_at is not None else "dead"
        async with self.transaction() as db:
            changed = await db.execute(
                "UPDATE queue SET attempts=attempts+?, last_error=?, state=?,"
                " next_at=vm_now()+?, finished_at=?, lease_owner=NULL WHERE id=? AND " + _OURS,
                (int(counted), error[:2000], state,
                 0.0 if retry_at is None else max(0.0, retry_at - time.time()),
                 None if retry_at is not None else time.time(), item.id, self.replica_id,
                 item.lease),
            )
            return changed == 1

    async def dead_letters(self) -> list[QueueItem]:
        rows = await self.fetchall("SELECT * FROM queue WHERE state='dead' ORDER BY id")
        return [_item(r) for r in rows]

    async def replay(self, item_id: int | None = None) -> int:
        """Put dead letters (one, or all) back in the queue; returns how many."""
        where, params = ("state='dead'", ()) if item_id is None else (
            "state='dead' AND id=?", (item_id,))
        async with self.transaction() as db:
            changed = await db.execute(
                "UPDATE queue SET state='pending', attempts=0, takeovers=0, next_at=vm_now()"
                f" WHERE {where}",
                params,
            )
            return changed

    async def queue_stats(self, now: float | None = None) -> dict[str, float]:
        """Pending and dead counts, and how long the oldest due delivery has waited (s). Read
        through the `queue_due` index, (state, next_at, id): the finished deliveries the queue
        keeps are not walked, so /healthz and /metrics cost the same with a long history."""
        now = time.time() if now is None else now
        counts = {str(r["state"]): int(r["n"]) for r in await self.fetchall(
            "SELECT state, COUNT(*) AS n FROM queue WHERE state IN ('pending','dead')"
            " GROUP BY state")}
        row = await self.fetchone("SELECT MIN(created_at) AS oldest FROM queue"
                                  " WHERE state='pending' AND next_at<=?", (now,))
        oldest = row["oldest"] if row is not None else None
        return {"pending": counts.get("pending", 0), "dead": counts.get("dead", 0),
                "oldest_due_age": max(0.0, now - float(oldest)) if oldest is not None else 0.0}

    async def processed_count(self, guid: str) -> int:
        row = await self.fetchone(
            "SELECT COUNT(*) AS n FROM queue WHERE guid=? AND state='done'", (guid,))
        return int(row["n"]) if row else 0
