"""Each office's append-only, hash-chained ledger (DESIGN §3.7).

Every office (org) has a chain of its own: each entry's hash covers the previous entry of that
office's chain, the office, and the entry's canonical JSON, so any edit, deletion or move of an
entry to another office breaks every hash after it (`verify_chain`). Entries written before
there was a chain per office (`chain` NULL) form the old single chain and verify as written.
Reads take the office whose entries they want; `org=None` is the operator's view of all.
"""

from __future__ import annotations

import hashlib
import json
import time
from dataclasses import dataclass
from typing import Any

from bot.store.db import Connection, Row, Store, hold, register_schema
from bot.store.offices import next_number, number_as_was, numbered_per_office
from bot.store.sql import Params, Sql, Statement, json_at

register_schema("""
CREATE TABLE IF NOT EXISTS ledger (
    seq {id},
    time {real} NOT NULL,
    event {text} NOT NULL,
    actor {text} NOT NULL,
    subject {text} NOT NULL,
    data {text} NOT NULL,
    prev_hash {text} NOT NULL,
    hash {text} NOT NULL
);
CREATE INDEX IF NOT EXISTS ledger_event ON ledger(event);
""")

# where an entry stands in its office's ledger, the number the office is shown (not `seq`,
# which numbers every office's entries)
numbered_per_office("ledger", "pos", "seq", unique=False)

GENESIS = "0" * 64
EVENTS = frozenset({
    "mail.sent", "mail.opened", "mail.replied", "mail.closed", "mail.loop_guard",
    "mail.bounced",  # mail to an agent that left, or to a vault gone or archived
    "mail.restored",  # a delivered mail's issue vanished and was opened again (the doctor)
    "mail.tampered", "run.queued", "run.refused", "run.denied", "run.finished", "comment.added",
    # a repository_dispatch the forge may or may not have taken: not sent again (bot.app.runs)
    "run.dispatch_unknown",
    "comment.answered", "comment.resolved", "comment.deleted",
    "comment.loop_guard",  # an agent's comment on an item past the loop guard: woke no agent
    "office.config_refused",
    "office.webhook_secret_rotated",  # an org's own webhook secret (Gitea), by the operator
    # real mailboxes (bot/email): a message accepted, held, released by hand, sent, first
    # deferred, bounced
    "email.received", "email.held", "email.released", "email.sent", "email.deferred",
    "email.bounced",
    # a person let a remote MCP client act as them (bot.tools.oauth_server)
    "mcp.client_allowed",
})


@dataclass(frozen=True)
class Entry:
    seq: int
    time: float
    event: str
    actor: str
    subject: str
    data: dict[str, Any]
    hash: str
    org: str | None = None
    prev_hash: str = GENESIS  # the office chain's entry before it (GENESIS: its first)
    pos: int | None = None  # its place in its office's ledger (None: an entry of no office)
    chain: str | None = None  # the chain it was hashed on (None: the old single chain)

    @property
    def number(self) -> int:
        """The number its office is shown (and pages by): its place in the office's ledger."""
        return self.pos if self.pos is not None else self.seq

    def as_json(self) -> dict[str, Any]:
        # `timestamp` is the time as hashed: with it a receiver checks each entry's hash, and
        # the chain, by itself (docs/using.md, "The ledger")
        return {"seq": self.number, "time": _iso(self.time), "timestamp": round(self.time, 6),
                "event": self.event, "actor": self.actor, "subject": self.subject,
                "data": self.data, "hash": self.hash, "prev_hash": self.prev_hash,
                "office": self.org, "chain": self.chain}


def _iso(t: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t))


def _digest(prev: str, t: float, event: str, actor: str, subject: str, data: str,
            chain: str | None = None) -> str:
    fields: list[Any] = [prev, round(t, 6), event, actor, subject, data]
    if chain is not None:  # an office's chain: the office is part of what is hashed
        fields.append(chain)
    canon = json.dumps(fields, separators=(",", ":"))
    return hashlib.sha256(canon.encode()).hexdigest()


def key(org: str) -> str:
    """The key an office's chain is appended under (`Store.transaction(key(org), ...)`: a
    transaction that appends names it at its start, so its writers queue before they take a
    connection)."""
    return f"ledger:{org.lower()}"


_HEAD = "SELECT hash FROM ledger WHERE chain=? ORDER BY seq DESC LIMIT 1"


async def append(db: Connection, event: str, actor: str, subject: str,
                 data: dict[str, Any] | None = None, *, org: str) -> int:
    """Append to `org`'s chain inside the caller's transaction (so the entry commits with
    what it records)."""
    if event not in EVENTS:
        raise ValueError(f"unknown ledger event {event!r}")
    if not org:
        raise ValueError("a ledger entry belongs to an office: org is required")
    org = org.lower()
    # the office's chain is appended to one entry at a time; other offices' chains go on
    # meanwhile (held to the caller's commit: append last, after the rows it records)
    await hold(db, key(org))
    # the chain's head: the entry this transaction appended last (the key kept others out
    # since), else the newest's (PostgreSQL: read by the first number's statement, once the
    # office's key is held; the office's counter moved by this entry's own INSERT: one round
    # trip each, not three)
    prev = db.memo.get(("ledger head", org))
    counted: list[tuple[str, Params]] = []
    pos = await next_number(db, "ledger", "pos", "seq", org, counted=counted,
                            head=None if prev is not None else _HEAD)
    if prev is None:
        if ("head", org, "ledger.pos") in db.memo:
            prev = db.memo.pop(("head", org, "ledger.pos")) or GENESIS
        else:
            row = await db.fetchone(_HEAD, (org,))
            prev = row[0] if row else GENESIS
    t = time.time()
    blob = json.dumps(data or {}, sort_keys=True, separators=(",", ":"))
    digest = _digest(prev, t, event, actor, subject, blob, org)
    seq = await db.insert(
        ("WITH " + ", ".join(f"counted{n} AS ({sql})" for n, (sql, _) in enumerate(counted))
         + " " if counted else "")
        + "INSERT INTO ledger(time, event, actor, subject, data, prev_hash, hash, org, chain,"
        " pos) VALUES (?,?,?,?,?,?,?,?,?,?) RETURNING seq",
        (*(p for _, params in counted for p in params),
         t, event, actor, subject, blob, prev, digest, org, org, pos),
    )
    db.memo["ledger head", org] = digest
    if pos is None:  # (a rolling deploy: numbered as the release before numbers)
        await number_as_was(db, "ledger", "pos", "seq", seq)
    return seq


async def record(store: Store, event: str, actor: str, subject: str,
                 data: dict[str, Any] | None = None, *, org: str) -> int:
    async with store.transaction(key(org)) as db:
        return await append(db, event, actor, subject, data, org=org)


async def entries_since(store: Store, org: str, event: str, since: float) -> list[Row]:
    """`org`'s `event` entries (actor, data) ledgered after `since`, oldest first."""
    return await store.fetchall(
        "SELECT actor, data FROM ledger WHERE org=? AND event=? AND time>? ORDER BY seq",
        (org.lower(), event, since))


async def record_once(store: Store, event: str, actor: str, subject: str,
                      data: dict[str, Any], *, org: str, by: tuple[str, ...],
                      renamed: dict[str, str] | None = None) -> int | None:
    """`record`, unless an `event` about `subject` (or a name it had: `renamed`, see
    `_about`) whose data agrees on the fields `by` is in `org`'s chain already (a delivery
    run again after a crash says what it said once); the new entry's seq, or None. Looked at
    under the chain's key, so two tries never both write."""
    async with store.transaction(key(org)) as db:
        about, subjects = _about(subject, renamed)
        query: Statement = "SELECT 1 FROM ledger WHERE chain=? AND event=? AND " + about
        for _ in by:
            query = query + " AND " + json_at("data") + "=?"
        params = [p for f in by for p in (f"$.{f}", str(data[f]))]
        if await db.fetchone(query + " LIMIT 1",
                             (org.lower(), event, *subjects, *params)) is not None:
            return None
        return await append(db, event, actor, subject, data, org=org)


def _about(subject: str, renamed: dict[str, str] | None) -> tuple[str, tuple[str, ...]]:
    """A lookup's condition on the subject, and its parameters: `subject`, or a name it had
    by its office's names before (`renamed`: `Keyring.renamed`). An entry keeps the name it
    was hashed under, so a step done before its org or repository was renamed is found by a
    retry after it; a name it had is looked at in its office's rows only (`org`, the name
    the subject's owner has now), never in another's that took the name since. Every lookup
    also asks for its office's chain (`chain=?`): `subject` itself may be a name another
    office's entries were hashed under before it was renamed or moved aside."""
    from bot.mail.signing import names_before  # (here: opening the index loads no cryptography)

    before = names_before(renamed or {}, subject)
    if not before:
        return "subject=?", (subject,)
    marks = ",".join("?" for _ in before)
    return (f"(subject=? OR (org=? AND subject IN ({marks})))",
            (subject, subject.partition("/")[0].lower(), *before))


async def recorded(store: Store, event: str, subject: str, field: str, value: str, *,
                   org: str, renamed: dict[str, str] | None = None) -> bool:
    """Whether an `event` about `subject` (or a name it had: `_about`) with
    `data[field] == value` is in `org`'s chain: what a retry asks to learn if an earlier
    try already did its part."""
    about, subjects = _about(subject, renamed)
    row = await store.fetchone(
        "SELECT 1 FROM ledger WHERE chain=? AND event=? AND " + about + " AND "
        + json_at("data") + "=? LIMIT 1",
        (org.lower(), event, *subjects, f"$.{field}", value))
    return row is not None


async def first_recorded(store: Store, event: str, subject: str, field: str, value: str, *,
                         org: str, renamed: dict[str, str] | None = None) -> float | None:
    """When the first `event` about `subject` (or a name it had: `_about`) with
    `data[field] == value` was recorded in `org`'s chain."""
    about, subjects = _about(subject, renamed)
    row = await store.fetchone(
        "SELECT MIN(time) AS first FROM ledger WHERE chain=? AND event=? AND " + about
        + " AND " + json_at("data") + "=?",
        (org.lower(), event, *subjects, f"$.{field}", value))
    return float(row["first"]) if row is not None and row["first"] is not None else None


async def recorded_with(store: Store, events: tuple[str, ...], subject: str, field: str,
                        value: str, *, org: str,
                        renamed: dict[str, str] | None = None) -> list[Row]:
    """Every entry of one of `events` about `subject` (or a name it had: `_about`) with
    `data[field] == value` in `org`'s chain, oldest first (`event` and `data`): what
    earlier tries of a retried step did, part by part."""
    if not events:
        return []
    marks = ",".join("?" for _ in events)
    about, subjects = _about(subject, renamed)
    return await store.fetchall(
        f"SELECT event, data FROM ledger WHERE chain=? AND event IN ({marks}) AND " + about
        + " AND " + json_at("data") + "=? ORDER BY seq",
        (org.lower(), *events, *subjects, f"$.{field}", value))


async def values_recorded(store: Store, event: str, subject: str, field: str, *, org: str,
                          renamed: dict[str, str] | None = None) -> list[str]:
    """`data[field]` of every `event` entry about `subject` (or a name it had) in `org`'s
    chain that has one, oldest first."""
    about, subjects = _about(subject, renamed)
    rows = await store.fetchall(
        "SELECT " + json_at("data") + " AS v FROM ledger WHERE chain=? AND event=? AND "
        + about + " ORDER BY seq", (f"$.{field}", org.lower(), event, *subjects))
    return [str(r["v"]) for r in rows if r["v"] is not None]


def _hashed_as(r: Any) -> str | None:
    """The chain name an entry was hashed with: the name its office had then, where it was
    renamed since (bot.store.offices.rename_in); a chain moved aside, `org~account`, was
    hashed under the office's name (bot.store.offices.retire_in)."""
    if r["hashed_as"] is not None:
        return str(r["hashed_as"])
    return str(r["chain"]).partition("~")[0] if r["chain"] is not None else None


def _entry(r: Any) -> Entry:
    return Entry(r["seq"], r["time"], r["event"], r["actor"], r["subject"],
                 json.loads(r["data"]), r["hash"], r["org"], r["prev_hash"], r["pos"],
                 _hashed_as(r))


def _of(org: str | None, sql: str, params: list[Any]) -> tuple[str, list[Any]]:
    if org is None:
        return sql, params
    return sql + " AND org=?", [*params, org.lower()]


async def entries(store: Store, *, since: int = 0, limit: int = 1000,
                  event: str | None = None, org: str | None = None,
                  shown: bool = False) -> list[Entry]:
    """Entries after `since` in order: `org`'s (None: every office's, for the operator).
    `shown`: `since` is the number the office is shown (`Entry.number`), not `seq`."""
    column = "pos" if shown and org is not None else "seq"
    sql, params = _of(org, f"SELECT * FROM ledger WHERE {column}>?", [since])
    if event:
        sql += " AND event=?"
        params.append(event)
    rows = await store.fetchall(sql + f" ORDER BY {column} LIMIT ?", (*params, limit))
    return [_entry(r) for r in rows]


async def chains(store: Store) -> list[str | None]:
    """The chains in the ledger: each office's, and None for the old single chain."""
    rows = await store.fetchall("SELECT DISTINCT chain FROM ledger")
    return sorted((r["chain"] for r in rows), key=lambda c: (c is not None, c or ""))


async def verify_chain(store: Store, org: str | None = None) -> int | None:
    """The first sequence number whose hash does not hold, or None when intact: `org`'s chain
    (None: every chain, the old single one included)."""
    for chain in [org.lower()] if org is not None else await chains(store):
        prev = GENESIS
        where = "chain IS NULL" if chain is None else "chain=?"
        for r in await store.fetchall(f"SELECT * FROM ledger WHERE {where} ORDER BY seq",
                                      () if chain is None else (chain,)):
            hashed = _hashed_as(r)
            if r["prev_hash"] != prev or r["hash"] != _digest(
                    prev, r["time"], r["event"], r["actor"], r["subject"], r["data"], hashed):
                return int(r["seq"])
            prev = r["hash"]
    return None


async def scan_newest(store: Store, *, event: str | None, actor: str | None,
                      since: float | None, until: float | None, before: int | None,
                      about: str | None, scanned: int, org: str | None) -> list[Entry]:
    """Up to `scanned` of `org`'s entries newest first, filtered; `about` keeps an agent's
    own."""
    sql, params = _of(org, "SELECT * FROM ledger WHERE 1=1", list[Any]())
    for clause, value in (("event=?", event), ("actor=?", actor), ("time>=?", since),
                          ("time<?", until),
                          ("pos<?" if org is not None else "seq<?", before)):
        if value is not None:
            sql += f" AND {clause}"
            params.append(value)
    query: Statement = sql
    if about is not None:
        query = sql + Sql(" AND (actor=? OR json_extract(data, '$.agent')=?)",
                          " AND (actor=? OR data::jsonb #>> '{agent}'=?)")
        params += [about, about]
    rows = await store.fetchall(query + " ORDER BY seq DESC LIMIT ?", (*params, scanned))
    return [_entry(r) for r in rows]


async def length(store: Store, org: str) -> int:
    """How many entries `org`'s chain holds (its own: `seq` numbers every office's)."""
    row = await store.fetchone("SELECT COUNT(*) AS n FROM ledger WHERE chain=?", (org.lower(),))
    return int(row["n"]) if row else 0


async def head(store: Store, org: str) -> Row | None:
    """The (seq, hash) of `org`'s chain's last entry, or None when it is empty."""
    return await store.fetchone("SELECT seq, hash FROM ledger WHERE chain=? ORDER BY seq DESC"
                                " LIMIT 1", (org.lower(),))
