"""The webhook deliveries the queue recorded (the `deliveries` table of `bot.store.db`), and the
reconciler's own record of the forge's failed deliveries (`bot.app.reconcile`).

`missed_deliveries` holds, per delivery guid (the `X-GitHub-Delivery` every attempt of one event
shares), the failed deliveries the app had not recorded when a round listed them: the oldest
and newest failed attempt seen, and which attempt was last asked for again. A guid is asked for
again only when a newer attempt of it failed too: one whose redelivery was answered without
being recorded (the app's own events no handler reads) is not asked for again and again. Rows
go once recorded, or once older than the forge's redelivery window. `reconcile_marks` holds how
far the last complete listing reached, so a round lists only what came since.

`org_signed_rows` holds each timeline row (event) of an issue that a delivery signed by an
org's own webhook was taken on (`bot.app.org_signed`), and that delivery's id: a row is taken
once, whatever order the deliveries come in. `org_signed_taken` (schema 25, no longer written)
holds, per issue, the newest row taken before: it and every row before it were taken then.
`org_signed_comments`, per comment, the one such delivery its `created` was taken from. Each
row notes when (`taken_at`): an event or comment older than the retention is taken by no such
delivery, so a row that old guards nothing and is pruned (`bot.store.prune`).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

from bot.store.db import Store, register_columns, register_schema
from bot.store.migrations import register_backfill
from bot.store.sql import greatest, upsert

register_schema("""
CREATE TABLE IF NOT EXISTS missed_deliveries (
    guid {text} PRIMARY KEY,
    first_id {int} NOT NULL,     -- the forge's id of its oldest failed attempt seen
    failed_id {int} NOT NULL,    -- its newest failed attempt seen: the one asked for
    failed_at {real} NOT NULL,       -- when that attempt was made (the forge's time)
    event {text},
    installation_id {int},
    asked_id {int},              -- the attempt last asked for again (NULL: not yet)
    asked_at {real},
    asks {int} NOT NULL DEFAULT 0,
    next_at {real} NOT NULL DEFAULT 0  -- asked again (if that failed too) not before then
);
CREATE INDEX IF NOT EXISTS missed_deliveries_order ON missed_deliveries(first_id);
CREATE TABLE IF NOT EXISTS reconcile_marks (
    name {text} PRIMARY KEY,
    delivery_id {int} NOT NULL,  -- the newest failed delivery a complete listing saw
    delivered_at {real} NOT NULL
);
""", version=5)
register_schema("""
CREATE TABLE IF NOT EXISTS org_signed_taken (
    issue {text} PRIMARY KEY,    -- owner/repo#N
    org {text} NOT NULL,
    event_id {int} NOT NULL,     -- the forge's id of the timeline event taken
    guid {text} NOT NULL         -- the delivery that took it
);
""", version=25)
register_schema("""
CREATE TABLE IF NOT EXISTS org_signed_comments (
    comment_id {int} PRIMARY KEY,  -- the forge's id of the comment
    org {text} NOT NULL,
    guid {text} NOT NULL           -- the delivery its `created` was taken from
);
""", version=28)
# when each was taken (rows before: when the index was upgraded, a whole retention from then)
register_columns("org_signed_taken", {"taken_at": "{real}"}, version=31)
register_columns("org_signed_comments", {"taken_at": "{real}"}, version=31)
_TAKEN_AT = """
UPDATE org_signed_taken SET taken_at={now};
UPDATE org_signed_comments SET taken_at={now};
CREATE INDEX IF NOT EXISTS org_signed_taken_at ON org_signed_taken(taken_at);
CREATE INDEX IF NOT EXISTS org_signed_comments_at ON org_signed_comments(taken_at);
"""
register_backfill(_TAKEN_AT.format(now="CAST(strftime('%s', 'now') AS REAL)"),
                  postgres=_TAKEN_AT.format(now="extract(epoch FROM now())"), version=31)
register_schema("""
CREATE TABLE IF NOT EXISTS org_signed_rows (
    issue {text} NOT NULL,       -- owner/repo#N
    event_id {int} NOT NULL,     -- the forge's id of the timeline row taken
    org {text} NOT NULL,
    guid {text} NOT NULL,        -- the delivery that took it
    taken_at {real} NOT NULL,    -- when (pruned a retention after: bot.store.prune)
    PRIMARY KEY (issue, event_id)
);
CREATE INDEX IF NOT EXISTS org_signed_rows_at ON org_signed_rows(taken_at);
""", version=33)


@dataclass(frozen=True)
class Failed:
    """One failed attempt, as the forge listed it."""

    guid: str
    delivery_id: int
    delivered_at: float
    event: str | None = None
    installation_id: int | None = None


@dataclass(frozen=True)
class Missed:
    """A guid to ask for again: `delivery_id` is its newest failed attempt."""

    guid: str
    first_id: int
    delivery_id: int
    asks: int
    event: str | None
    installation_id: int | None


async def delivery_recorded(store: Store, guid: str) -> bool:
    """Whether a delivery with this id reached the queue."""
    row = await store.fetchone(
        "SELECT 1 FROM deliveries WHERE guid=?", (guid,))
    return row is not None


async def note_failed(store: Store, failed: Sequence[Failed]) -> int:
    """Record failed attempts whose guid the app has not recorded; returns how many were."""
    noted = 0
    if not failed:
        return noted
    async with store.transaction() as db:
        for f in failed:
            if await db.fetchone("SELECT 1 FROM deliveries WHERE guid=?", (f.guid,)) is not None:
                continue
            # listed newest first, so a guid's attempts come newest to oldest: keep both ends
            await db.execute(
                "INSERT INTO missed_deliveries AS m(guid, first_id, failed_id, failed_at, event,"
                " installation_id) VALUES (?,?,?,?,?,?) ON CONFLICT(guid) DO UPDATE SET"
                " first_id=CASE WHEN excluded.first_id<m.first_id THEN excluded.first_id"
                " ELSE m.first_id END,"
                " failed_at=CASE WHEN excluded.failed_id>m.failed_id THEN excluded.failed_at"
                " ELSE m.failed_at END,"
                " failed_id=" + greatest("m.failed_id", "excluded.failed_id"),
                (f.guid, f.delivery_id, f.delivery_id, f.delivered_at, f.event,
                 f.installation_id))
            noted += 1
    return noted


async def due_missed(store: Store, now: float, limit: int,
                     upto: int | None = None) -> list[Missed]:
    """Guids to ask for again, oldest first: never asked, or whose last redelivery failed too
    and waited its turn; with `upto`, only those first seen at or below that delivery id."""
    below, params = ("", (now, limit)) if upto is None else (" AND first_id<=?",
                                                             (now, upto, limit))
    rows = await store.fetchall(
        "SELECT guid, first_id, failed_id, asks, event, installation_id"
        " FROM missed_deliveries WHERE (asked_id IS NULL OR (failed_id>asked_id AND next_at<=?))"
        + below + " ORDER BY first_id, guid LIMIT ?", params)
    return [Missed(r["guid"], int(r["first_id"]), int(r["failed_id"]), int(r["asks"]),
                   r["event"], r["installation_id"]) for r in rows]


async def asked(store: Store, guid: str, delivery_id: int, now: float, next_at: float) -> None:
    """The forge was asked to deliver `guid` again (its attempt `delivery_id`)."""
    async with store.transaction() as db:
        await db.execute(
            "UPDATE missed_deliveries SET asked_id=?, asked_at=?, asks=asks+1, next_at=?"
            " WHERE guid=?", (delivery_id, now, next_at, guid))


async def forget_missed(store: Store, older_than: float) -> int:
    """Drop rows the app has since recorded, or whose newest failure is older than
    `older_than` (the forge no longer redelivers it); returns how many went."""
    async with store.transaction() as db:
        changed = await db.execute(
            "DELETE FROM missed_deliveries WHERE failed_at<? OR EXISTS"
            " (SELECT 1 FROM deliveries d WHERE d.guid=missed_deliveries.guid)", (older_than,))
        return changed


async def reconcile_mark(store: Store, name: str = "github") -> tuple[int, float] | None:
    """The newest failed delivery (id, time) the last complete listing saw, if any."""
    row = await store.fetchone(
        "SELECT delivery_id, delivered_at FROM reconcile_marks WHERE name=?", (name,))
    return None if row is None else (int(row["delivery_id"]), float(row["delivered_at"]))


async def save_reconcile_mark(store: Store, delivery_id: int, delivered_at: float,
                              name: str = "github") -> None:
    async with store.transaction() as db:
        await db.execute(upsert("reconcile_marks", ["name", "delivery_id", "delivered_at"],
                         ["name"]), (name, delivery_id, delivered_at))


async def missed_held(store: Store) -> dict[str, int]:
    """The guids held as missed, each with how often it was asked for again."""
    rows = await store.fetchall("SELECT guid, asks FROM missed_deliveries")
    return {r["guid"]: int(r["asks"]) for r in rows}


@dataclass(frozen=True)
class TakenRows:
    """The timeline rows of one issue that org-signed deliveries other than one were taken
    on: `row in taken` says whether it was."""

    rows: frozenset[int]
    upto: int = 0  # it and every row before it, taken under schema 25's newest-only record

    def __contains__(self, event_id: object) -> bool:
        return isinstance(event_id, int) and (event_id <= self.upto or event_id in self.rows)


async def org_signed_taken(store: Store, issue: str, guid: str) -> TakenRows:
    """The rows of `issue` (`owner/repo#N`) taken by deliveries other than `guid` (a retry of
    the delivery that took a row may take it again)."""
    rows = await store.fetchall("SELECT event_id FROM org_signed_rows WHERE issue=? AND guid<>?",
                                (issue.lower(), guid))
    old = await store.fetchone("SELECT event_id, guid FROM org_signed_taken WHERE issue=?",
                               (issue.lower(),))
    upto = 0 if old is None else int(old["event_id"]) - (1 if old["guid"] == guid else 0)
    return TakenRows(frozenset(int(r["event_id"]) for r in rows), upto)


async def org_signed_took(store: Store, issue: str, event_ids: Sequence[int],
                          guid: str) -> bool:
    """Whether delivery `guid` may take timeline rows `event_ids` (the newest last) of
    `issue`: it is the first to take the newest, or a retry of the one that was. Those it
    may take are recorded as its own (none another delivery took before)."""
    issue, org = issue.lower(), issue.split("/", 1)[0].lower()
    add = ("INSERT INTO org_signed_rows(issue, event_id, org, guid, taken_at)"
           " VALUES (?,?,?,?,?) ON CONFLICT DO NOTHING")
    now = time.time()
    async with store.transaction() as db:
        await db.execute(add, (issue, event_ids[-1], org, guid, now))
        row = await db.fetchone("SELECT guid FROM org_signed_rows WHERE issue=? AND event_id=?",
                                (issue, event_ids[-1]))
        if row is None or row["guid"] != guid:
            return False
        for event_id in event_ids[:-1]:
            await db.execute(add, (issue, event_id, org, guid, now))
    return True


async def org_signed_comment(store: Store, org: str, comment_id: int, guid: str) -> bool:
    """Whether delivery `guid` may take the `created` of comment `comment_id`: it is the first
    to (recorded now), or a retry of the one that was."""
    async with store.transaction() as db:
        await db.execute("INSERT INTO org_signed_comments(comment_id, org, guid, taken_at)"
                         " VALUES (?,?,?,?) ON CONFLICT DO NOTHING",
                         (comment_id, org.lower(), guid, time.time()))
        row = await db.fetchone("SELECT guid FROM org_signed_comments WHERE comment_id=?",
                                (comment_id,))
    return row is not None and row["guid"] == guid
