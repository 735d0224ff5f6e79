"""The mail index: one row per mail (the signed values), plus the runs the office queued."""

from __future__ import annotations

import functools
import json
import time
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, replace
from typing import Any

from bot.store.db import Connection, Row, Store, hold, keyed, register_columns, register_schema
from bot.store.migrations import register_backfill
from bot.store.offices import next_number, number_as_was, numbered_per_office, org_of, scoped
from bot.store.sql import Sql, Statement, greatest, padded, upsert

register_schema("""
CREATE TABLE IF NOT EXISTS mails (
    mail_id {text} PRIMARY KEY,
    vault {text} NOT NULL,
    number {int} NOT NULL,
    subject {text} NOT NULL,
    body {text} NOT NULL,
    from_principal {text} NOT NULL,
    to_principal {text} NOT NULL,
    sent {text} NOT NULL,
    hops {int} NOT NULL,
    in_reply_to {text},
    thread_id {text} NOT NULL,
    key_id {text} NOT NULL,
    body_sha256 {text} NOT NULL,
    state {text} NOT NULL,
    tampered {int} NOT NULL DEFAULT 0,
    other_labels {text} NOT NULL DEFAULT '[]',
    agent_turns {int} NOT NULL DEFAULT 0,
    updated_at {real} NOT NULL,
    UNIQUE(vault, number)
);
CREATE TABLE IF NOT EXISTS pending_sends (
    mail_id {text} PRIMARY KEY,
    vault {text} NOT NULL,
    created_at {real} NOT NULL
);
CREATE INDEX IF NOT EXISTS mails_to ON mails(to_principal, state);
CREATE INDEX IF NOT EXISTS mails_thread ON mails(thread_id);
CREATE TABLE IF NOT EXISTS runs (
    id {id},
    agent {text} NOT NULL,
    kind {text} NOT NULL,
    subject {text} NOT NULL,
    state {text} NOT NULL,
    created_at {real} NOT NULL
);
""")

register_columns("mails", {"other_labels": "{text} NOT NULL DEFAULT '[]'",
                          "agent_turns": "{int} NOT NULL DEFAULT 0"})
# counted again from schema 19 (agents' follow-ups that woke the recipient, reset by a reply or
# a person's follow-up): what an older release counted, never reset, starts at 0
register_backfill("UPDATE mails SET agent_turns=0 WHERE agent_turns<>0",
                  postgres="UPDATE mails SET agent_turns=0 WHERE agent_turns<>0", version=19)

# The states a mail row can hold: the four label names, and "quiet" for a reply delivered
# past the loop guard (it carries no state label until someone acts on it).
QUIET = "quiet"
STATES = ("mail:new", "mail:working", "mail:replied", "mail:closed", "mail:held", QUIET)


@dataclass(frozen=True)
class MailRecord:
    mail_id: str
    vault: str
    number: int
    subject: str
    body: str
    from_principal: str
    to_principal: str
    sent: str
    hops: int
    in_reply_to: str | None
    thread_id: str
    key_id: str
    body_sha256: str
    state: str
    tampered: bool = False
    other_labels: tuple[str, ...] = ()  # labels besides mail:*, kept so writes keep them
    agent_turns: int = 0  # agents' follow-ups and reopens that woke its recipient (loop guard)

    @property
    def ref(self) -> str:
        return f"{self.vault}#{self.number}"

    @property
    def org(self) -> str:
        """The office the mail belongs to: its vault's owner."""
        return org_of(self.vault)

    def with_state(self, state: str) -> MailRecord:
        return replace(self, state=state)

    @property
    def labels(self) -> list[str]:
        """The issue's labels as the index knows them (no mail label while quiet)."""
        return [*self.other_labels, *([] if self.state == QUIET else [self.state])]

    def as_json(self) -> dict[str, Any]:
        out = asdict(self)
        out["ref"] = self.ref
        return out


_COLUMNS = [f for f in MailRecord.__dataclass_fields__]


def _record(row: Any) -> MailRecord:
    values = {c: row[c] for c in _COLUMNS}
    values["tampered"] = bool(values["tampered"])
    values["other_labels"] = tuple(json.loads(values["other_labels"]))
    return MailRecord(**values)


# (updated_at by the database's clock, vm_now(): what wakes an agent is compared across
# replicas, whose host clocks may disagree)
_PUT_MAIL = upsert("mails", [*_COLUMNS, "org"], ["mail_id"], {"updated_at": "vm_now()"})
_PUT_ADOPTED = upsert("mails", [*_COLUMNS, "org", "adopted_at"], ["mail_id"],
                      {"updated_at": "vm_now()"})


@functools.cache
def _add(adopted: bool, sent_from: bool) -> str:
    """`add_mail`'s statement: the row `put_mail` writes (`adopted_at`, `sent_from` too where
    given), or nothing where one is under its id."""
    columns = [*_COLUMNS, "org", *(["adopted_at"] if adopted else []),
               *(["sent_from"] if sent_from else [])]
    return (f"INSERT INTO mails({', '.join(columns)}, updated_at)"
            f" VALUES ({','.join('?' for _ in columns)},vm_now())"
            " ON CONFLICT(mail_id) DO NOTHING RETURNING 1")


# One recipient's mail rows are written one transaction at a time (on PostgreSQL, where writers
# run side by side): `updated_at` is what wakes a waiting agent (has_unshown, against what it
# was last shown), so a row stamped earlier must never commit after one stamped later, or an
# agent shown the later one would never be woken for the earlier.
def box_key(org: str, to_principal: str) -> str:
    """The key one recipient's mail rows are written under (name it at the transaction's
    start where the recipient is known: `Store.transaction(box_key(...), ...)`)."""
    return f"mailbox:{scoped(org, to_principal)}"


async def _hold_box_of(db: Connection, mail_id: str) -> None:
    if not keyed(db):
        return
    row = await db.fetchone("SELECT vault, to_principal FROM mails WHERE mail_id=?",
                            (mail_id,))
    if row is not None:
        await hold(db, box_key(org_of(row["vault"]), row["to_principal"]))


def _values(mail: MailRecord) -> list[Any]:
    values = [getattr(mail, c) for c in _COLUMNS]
    values[_COLUMNS.index("tampered")] = int(mail.tampered)
    values[_COLUMNS.index("other_labels")] = json.dumps(list(mail.other_labels))
    return values


async def put_mail(db: Connection, mail: MailRecord, *, adopted_at: float | None = None
                   ) -> None:
    """The mail's row, written whole; `adopted_at` as `set_adopted_at` (in the same
    statement)."""
    await hold(db, box_key(mail.org, mail.to_principal))
    values = _values(mail)
    if adopted_at is None:
        await db.execute(_PUT_MAIL, (*values, mail.org))
    else:
        await db.execute(_PUT_ADOPTED, (*values, mail.org, adopted_at))


async def add_mail(db: Connection, mail: MailRecord, *, adopted_at: float | None = None,
                   sent_from: str | None = None) -> bool:
    """The mail's row, as `put_mail` writes it (and `sent_from`, the run it was sent from),
    unless a row is under its id already: then nothing is written, and False (`get_mail_in`
    reads it). One statement where a look, then a write, took two: the mail's indexing
    (bot.mail.mailer), on every new mail's path."""
    await hold(db, box_key(mail.org, mail.to_principal))
    extra = [v for v in (adopted_at, sent_from) if v is not None]
    row = await db.fetchone(_add(adopted_at is not None, sent_from is not None),
                            (*_values(mail), mail.org, *extra))
    return row is not None


async def set_state(db: Connection, mail_id: str, state: str,
                    labels: list[str] | None = None, *, expected: str | None = None) -> bool:
    """The new state; with `labels` (the issue's whole label list) the other labels too. With
    `expected`, only from that state (a writer whose view went stale, another replica having
    moved the mail, changes nothing). Whether the row changed."""
    if state not in STATES:
        raise ValueError(f"unknown mail state {state!r}")
    await _hold_box_of(db, mail_id)
    sql, params = "UPDATE mails SET state=?, updated_at=vm_now() WHERE mail_id=?", [
        state, mail_id]
    if expected is not None:
        sql, params = sql + " AND state=?", [*params, expected]
    changed = await db.execute(sql, tuple(params))
    if changed == 0:
        return False
    if labels is not None:
        others = [name for name in labels if not name.lower().startswith("mail:")]
        await db.execute("UPDATE mails SET other_labels=? WHERE mail_id=?",
                         (json.dumps(others), mail_id))
    return True


async def copy_hops(store: Store, thread: str, replied: str) -> int:
    """The most hops among the automatic reply copies of the mail `replied` (owner/repo#N) in
    `thread`, 0 when there is none: copies are the mails in reply to it with hops above 0."""
    row = await store.fetchone(
        "SELECT MAX(hops) AS most FROM mails WHERE thread_id=? AND in_reply_to=? AND hops>0",
        (thread, replied))
    return int(row["most"] or 0) if row else 0


_INTEND_SEND = Sql(
    "INSERT OR IGNORE INTO pending_sends(mail_id, vault, created_at) VALUES (?,?,?)",
    "INSERT INTO pending_sends(mail_id, vault, created_at) VALUES (?,?,?)"
    " ON CONFLICT DO NOTHING")


async def intend_send(store: Store, mail_id: str, vault: str) -> bool:
    """Note a send before its forge write; False when one with this id was begun before
    (a retry after a crash or timeout: look on the forge before creating again)."""
    async with store.transaction() as db:
        changed = await db.execute(_INTEND_SEND, (mail_id, vault, time.time()))
        return changed == 1


async def send_begun(store: Store, mail_id: str) -> bool:
    """Whether a send of `mail_id` was begun here (`intend_send`) and not yet recorded."""
    row = await store.fetchone("SELECT 1 FROM pending_sends WHERE mail_id=?", (mail_id,))
    return row is not None


async def sends_begun(store: Store) -> set[str]:
    """The mail ids whose sends were begun here (`intend_send`) and not yet recorded."""
    return {str(r["mail_id"]) for r in await store.fetchall("SELECT mail_id FROM pending_sends")}


async def sent(db: Connection, mail_id: str) -> bool:
    """The send of `mail_id` recorded: whether one was pending (`intend_send`)."""
    return await db.execute("DELETE FROM pending_sends WHERE mail_id=?", (mail_id,)) == 1


# `tampered` holds 0 (as signed), WARNING_OWED (flagged and ledgered, its warning comment not
# yet on the forge: a retry posts it) or 1 (flagged and warned); both non-zero read as True.
WARNING_OWED = 2


async def mark_tampered(db: Connection, mail_id: str) -> bool:
    """Flag the mail, its warning owed; False when it was flagged already."""
    await _hold_box_of(db, mail_id)
    changed = await db.execute("UPDATE mails SET tampered=?, updated_at=vm_now() WHERE mail_id=?"
                               " AND tampered=0", (WARNING_OWED, mail_id))
    return changed == 1


async def tamper_flag(store: Store, mail_id: str) -> int:
    """0, WARNING_OWED or 1 (see above)."""
    row = await store.fetchone("SELECT tampered FROM mails WHERE mail_id=?", (mail_id,))
    return int(row["tampered"]) if row else 0


async def tamper_warned(db: Connection, mail_id: str) -> None:
    await db.execute("UPDATE mails SET tampered=1 WHERE mail_id=? AND tampered=?",
                     (mail_id, WARNING_OWED))


async def get_mail(store: Store, mail_id: str, *, org: str | None = None
                   ) -> MailRecord | None:
    """The mail; in `org`'s office only, when named."""
    sql, params = _office(org)
    row = await store.fetchone(sql + " AND mail_id=?", (*params, mail_id))
    return _record(row) if row else None


async def get_mail_in(db: Connection, mail_id: str) -> MailRecord | None:
    """The mail as the caller's transaction reads it."""
    row = await db.fetchone("SELECT * FROM mails WHERE mail_id=?", (mail_id,))
    return _record(row) if row else None


async def vaults_of(store: Store, org: str) -> set[str]:
    """The vaults `org`'s mail rows name (lower case)."""
    rows = await store.fetchall("SELECT DISTINCT vault FROM mails WHERE org=?", (org,))
    return {str(row["vault"]).lower() for row in rows}


async def last_written(store: Store, org: str) -> dict[str, float]:
    """Each of `org`'s vaults (lower case) -> when the index last wrote a mail row of it
    (the database's clock): what the index knows of the vault is no newer."""
    rows = await store.fetchall("SELECT lower(vault) AS vault, max(updated_at) AS at FROM mails"
                                " WHERE org=? GROUP BY lower(vault)", (org,))
    return {str(row["vault"]): float(row["at"]) for row in rows}


async def recorded_at(store: Store, mail_id: str) -> float | None:
    """When the index last recorded anything of the mail (its row written, the database's
    clock): what it knows of the mail is no newer. None: no such mail."""
    row = await store.fetchone("SELECT updated_at FROM mails WHERE mail_id=?", (mail_id,))
    return float(row["updated_at"]) if row else None


# the mail of an issue, its vault's name in any case: every `issues` delivery asks, each
# time one look-up in `mails_vault_lower` (before it, a read of every mail the index held)
MAIL_AT = "SELECT * FROM mails WHERE lower(vault)=lower(?) AND number=?"
register_schema("CREATE INDEX IF NOT EXISTS mails_vault_lower ON mails(lower(vault), number);",
                version=47)


async def mail_at(store: Store, vault: str, number: int) -> MailRecord | None:
    row = await store.fetchone(MAIL_AT, (vault, number))
    return _record(row) if row else None


async def mails_known(store: Store, ids: Iterable[str], places: Iterable[tuple[str, int]]
                      ) -> tuple[dict[str, MailRecord], dict[tuple[str, int], MailRecord]]:
    """The mails of these ids, and those at these (vault, number) places (a vault's name in
    any case, keyed lower-cased), in one statement: what `get_mail` and `mail_at` find of
    each, for a page of ledger entries at once (bot.office.visibility.Viewer.entries_seen)."""
    named, at = set(ids), {(v.lower(), n) for v, n in places}
    if not named and not at:
        return {}, {}
    ids, places = padded(sorted(named)), padded(sorted(at))  # (a few statements' shapes)
    where = [f"mail_id IN ({','.join('?' * len(ids))})"] if ids else []
    where += ["(lower(vault)=lower(?) AND number=?)"] * len(places)  # (as MAIL_AT says it)
    rows = await store.fetchall("SELECT * FROM mails WHERE " + " OR ".join(where),
                                (*ids, *(x for place in places for x in place)))
    found = [_record(row) for row in rows]
    return ({m.mail_id: m for m in found if m.mail_id in named},
            {(m.vault.lower(), m.number): m for m in found
             if (m.vault.lower(), m.number) in at})


def _office(org: str | None) -> tuple[str, list[Any]]:
    """The WHERE clause of one office's mails (None: every office's, for the operator)."""
    return ("SELECT * FROM mails WHERE 1=1", []) if org is None else (
        "SELECT * FROM mails WHERE org=?", [org.lower()])


async def list_mails(store: Store, *, org: str | None, to: str | None = None,
                     state: str | None = None, vault: str | None = None,
                     thread: str | None = None, involving: str | None = None,
                     limit: int = 200) -> list[MailRecord]:
    """`org`'s mails (None: every office's) as filtered, in the order they were sent."""
    sql, params = _office(org)
    for col, value in (("to_principal", to), ("state", state), ("lower(vault)", vault),
                       ("thread_id", thread)):
        if value is not None:
            sql += f" AND {col}=?"
            params.append(value.lower() if col == "lower(vault)" else value)
    if involving is not None:
        sql += " AND (to_principal=? OR from_principal=?)"
        params += [involving, involving]
    rows = await store.fetchall(sql + " ORDER BY sent, vault, number LIMIT ?", (*params, limit))
    return [_record(r) for r in rows]


MailCursor = tuple[str, str, int]  # (sent, vault, number) of the last mail on a page
register_schema("CREATE INDEX IF NOT EXISTS mails_sent ON mails(sent, vault, number);")


def mail_cursor(mail: MailRecord) -> MailCursor:
    return (mail.sent, mail.vault, mail.number)


async def page_mails(store: Store, *, org: str, state: str | None = None,
                     vault: str | None = None, thread: str | None = None,
                     involving: str | None = None, before: MailCursor | None = None,
                     limit: int = 30) -> list[MailRecord]:
    """`org`'s mails newest first (by their signed `sent`, then vault and number), the ones
    after `before` on; `involving` keeps those it sent or received."""
    sql, params = _office(org)
    for col, value in (("state", state), ("lower(vault)", vault), ("thread_id", thread)):
        if value is not None:
            sql += f" AND {col}=?"
            params.append(value.lower() if col == "lower(vault)" else value)
    if involving is not None:
        sql += " AND (to_principal=? OR from_principal=?)"
        params += [involving, involving]
    if before is not None:
        sql += " AND (sent, vault, number) < (?, ?, ?)"
        params += [before[0], before[1], before[2]]
    rows = await store.fetchall(sql + " ORDER BY sent DESC, vault DESC, number DESC LIMIT ?",
                                (*params, limit))
    return [_record(r) for r in rows]


async def all_mails(store: Store) -> list[MailRecord]:
    rows = await store.fetchall("SELECT * FROM mails ORDER BY vault, number")
    return [_record(r) for r in rows]


async def replace_all(store: Store, mails: list[MailRecord],
                      vaults: list[str] | None = None) -> None:
    """Replace the index's mails (only those in `vaults`, when given: one office's reindex
    leaves the other offices' mails as they are)."""
    # every recipient's key first, in order: a move holding one and waiting for a row this
    # deletes would otherwise wait in a circle with it
    async with store.transaction(*{box_key(m.org, m.to_principal) for m in mails}) as db:
        if vaults is None:
            await db.execute("DELETE FROM mails")
        else:
            for vault in vaults:
                await db.execute("DELETE FROM mails WHERE lower(vault)=?", (vault.lower(),))
        for mail in mails:
            await put_mail(db, mail)


numbered_per_office("runs", "number", "id")  # a run's in its payload and the ledger
# a mail run's mail (its id), and an agent's runs by time: what an agent sends while the run is
# open counts past that mail (`wake_at`, the loop guard); NULL: a chat's, or before schema 24
register_columns("runs", {"woken_by": "{text}"}, version=24)
register_schema("CREATE INDEX IF NOT EXISTS runs_agent ON runs(org, agent, created_at);",
                version=24)


async def add_run(db: Connection, agent: str, kind: str, subject: str,
                  state: str, *, org: str, woken_by: str | None = None) -> int:
    """Keep a run of `org`'s, in the caller's transaction (`woken_by`: a mail run's mail id);
    returns its number (the office's next)."""
    org = org.lower()
    number = await next_number(db, "runs", "number", "id", org)
    row = await db.insert("INSERT INTO runs(agent, kind, subject, state, created_at, org,"
                          " number, woken_by) VALUES (?,?,?,?,?,?,?,?) RETURNING id",
                          (agent, kind, subject, state, time.time(), org, number, woken_by))
    if number is None:  # (a rolling deploy: numbered as the release before numbers)
        return await number_as_was(db, "runs", "number", "id", row)
    return number


async def finish_run(db: Connection, number: int, state: str, *, org: str) -> None:
    """A dispatched run ended: `done`, or `failed` (it exited non-zero or timed out); when is
    kept (`finished_at`), so what its agent wrote before then counts past its mail however
    late the forge's delivery of it comes (`wake_at`)."""
    await db.execute("UPDATE runs SET state=?, finished_at=? WHERE org=? AND number=?",
                     (state, time.time(), org.lower(), number))


# when a run ended (`finish_run`); NULL: still open, never learnt (a POST's runner), or ended
# before schema 42 (such a run counts only while `queued`, as before)
register_columns("runs", {"finished_at": "{real}"}, version=42)


async def wake_at(store: Store, agent: str, *, org: str, at: float, skew: float,
                  held_open: float, longest: float) -> str | None:
    """The mail that woke `agent`'s latest mail run in `org`'s office open at `at` (a write's
    time): started by then, and ended after it (`finished_at`) or, its end not known, started
    within `held_open` before it; no run is read that started `longest` before it. `skew`:
    seconds either way a forge's clock, which times a write, may be off ours, which times
    runs. None when there was none."""
    row = await store.fetchone(
        "SELECT woken_by FROM runs WHERE org=? AND agent=? AND kind='mail'"
        " AND woken_by IS NOT NULL AND created_at<=? AND created_at>?"
        " AND (finished_at>=? OR (finished_at IS NULL AND state='queued' AND created_at>?))"
        " ORDER BY created_at DESC, id DESC LIMIT 1",
        (org.lower(), agent, at + skew, at - skew - longest, at - skew,
         at - skew - held_open))
    return str(row["woken_by"]) if row is not None else None


async def run_wake(store: Store, agent: str, number: int, *, org: str,
                   since: float) -> str | None:
    """What woke `agent`'s run `number` in `org`'s office, when that run is open now (not
    ended, started after `since`): a mail run's mail id, or a chat run's `chat:<n>` (as a chat
    run's token names it). None when it is not such a run of this agent's."""
    row = await store.fetchone(
        "SELECT kind, subject, woken_by FROM runs WHERE org=? AND agent=? AND number=?"
        " AND created_at>? AND state='queued'", (org.lower(), agent, number, since))
    if row is None:
        return None
    if row["kind"] == "chat":
        return str(row["subject"])
    return str(row["woken_by"]) if row["woken_by"] is not None else None


# the run an agent's mail was sent from, by what woke it (a mail id, or a chat run's `chat:<n>`),
# written with the mail's row; NULL: a person's mail, a reply copy, or before schema 27. What
# a release before 29 counts a run's sends by (`claim_send` counts these too, beside its claims,
# while such a replica lives); `run_sends` is what this release counts.
register_columns("mails", {"sent_from": "{text}"}, version=27)
register_backfill("CREATE INDEX IF NOT EXISTS mails_sent_from ON mails(sent_from)",
                  postgres="CREATE INDEX IF NOT EXISTS mails_sent_from ON mails(sent_from)",
                  version=27)


# Each send from one run to one recipient counts a hop past the last (the loop guard,
# `Mailer.sent_hops`): a run is a budget an agent spends, not a label it may name again and
# again. A send's place in that budget is claimed as it is counted, before its forge write, so
# sends made at once each count the others, and a mail id keeps the place it claimed whatever
# happens after (a retry of its key after a failed create or a crash; its mail indexed from
# its own webhook, which knows no run). Schema 29.
register_schema("""
CREATE TABLE IF NOT EXISTS run_sends (
    org {text} NOT NULL,
    run {text} NOT NULL,
    sender {text} NOT NULL,
    to_principal {text} NOT NULL,
    mail_id {text} NOT NULL,
    place {int} NOT NULL,
    PRIMARY KEY (org, run, sender, to_principal, mail_id)
);
""", version=29)

_EARLIER_SENDS = (
    "SELECT COUNT(*) AS n FROM ("
    "SELECT mail_id FROM run_sends WHERE org=? AND run=? AND sender=? AND to_principal=?"
    " UNION SELECT mail_id FROM mails WHERE org=? AND sent_from=? AND from_principal=?"
    " AND to_principal=?) AS earlier")


def run_sends_key(org: str, run: str, sender: str, to: str) -> str:
    """The key one office's sends from one run to one recipient are claimed under."""
    return f"run-sends:{scoped(org, run)}\n{sender}\n{to}"


async def claim_send(store: Store, mail_id: str, run: str, sender: str, to: str, *,
                     org: str) -> int:
    """Mail `mail_id`'s place among the mails `sender` sends to `to` in `org`'s office from
    the run `run` woke: how many were claimed (or indexed by an older release) before it, 0
    for the first; the place it claimed before, when it has one. Counted and claimed in one
    transaction under a key of that office's run and recipient alone."""
    key = (org.lower(), run, sender, to)

    async def claim(db: Connection) -> int:
        row = await db.fetchone("SELECT place FROM run_sends WHERE org=? AND run=? AND sender=?"
                                " AND to_principal=? AND mail_id=?", (*key, mail_id))
        if row is not None:
            return int(row["place"])
        row = await db.fetchone(_EARLIER_SENDS, (*key, *key))
        place = int(row["n"]) if row is not None else 0
        await db.execute("INSERT INTO run_sends(org, run, sender, to_principal, mail_id, place)"
                         " VALUES (?,?,?,?,?,?)", (*key, mail_id, place))
        return place

    return await store.run_transaction(claim, run_sends_key(org, run, sender, to))


# the forge time of the adoption's write, which put the header on an issue opened by hand
# (its answer's `updated_at`): an edit the forge dates no later was written over by it
# (`Mailer.edited`). Written with the mail's row; NULL: mail the app opened, or before schema 34
register_columns("mails", {"adopted_at": "{real}"}, version=34)


async def set_adopted_at(db: Connection, mail_id: str, at: float) -> None:
    """Mail `mail_id` was adopted by a write the forge dates `at` (in the indexing
    transaction)."""
    await db.execute("UPDATE mails SET adopted_at=? WHERE mail_id=?", (at, mail_id))


async def adopted_at(store: Store, mail_id: str) -> float | None:
    """The forge time of the write that adopted mail `mail_id`; None when it was not adopted
    (or before schema 34)."""
    row = await store.fetchone("SELECT adopted_at FROM mails WHERE mail_id=?", (mail_id,))
    return float(row["adopted_at"]) if row and row["adopted_at"] is not None else None


async def runs_for(store: Store, agent: str, *, org: str) -> list[dict[str, Any]]:
    rows = await store.fetchall("SELECT * FROM runs WHERE org=? AND agent=? ORDER BY id",
                                (org.lower(), agent))
    return [dict(r) for r in rows]


# -- what an agent has been shown of its mail to handle ---------------------------------------
#
# Every tool result for an agent lists its mail to handle (`inbox.mail`). A mail listed there
# is not news the next time the agent waits (`list_inbox` with `wait`): the wait returns at
# once only for mail that became new to handle after the agent's last look, or it would spin.

register_schema("""
CREATE TABLE IF NOT EXISTS mail_shown (
    principal {text} PRIMARY KEY,
    upto {real} NOT NULL            -- the newest updated_at of the mail it was last shown
);
""")


async def to_handle(store: Store, principal: str, *,
                    org: str) -> tuple[list[MailRecord], float | None]:
    """Mail waiting for `principal` of `org` (mail:new, then quiet loop-guard deliveries),
    and the newest `updated_at` among them as read (what `mark_shown` records once they are
    shown)."""
    rows = await store.fetchall(
        "SELECT * FROM mails WHERE org=? AND to_principal=? AND state IN (?, ?)"
        " ORDER BY state=?, sent, vault, number LIMIT 400",
        (org.lower(), principal, "mail:new", QUIET, QUIET))
    upto = max((float(r["updated_at"]) for r in rows), default=None)
    return [_record(r) for r in rows], upto


async def mark_shown(store: Store, principal: str, upto: float | None, *, org: str) -> None:
    """`principal` was shown its mail to handle as it stood at `upto` (see `to_handle`)."""
    if upto is None:
        return
    principal = scoped(org, principal)
    known = await store.fetchone("SELECT upto FROM mail_shown WHERE principal=?", (principal,))
    if known is not None and known[0] >= upto:
        return  # nothing newer shown: no write on every tool call
    async with store.transaction() as db:
        await db.execute("INSERT INTO mail_shown(principal, upto) VALUES (?,?)"
                         " ON CONFLICT(principal) DO UPDATE"
                         " SET upto=" + greatest("mail_shown.upto", "excluded.upto"),
                         (principal, upto))


async def has_unshown(store: Store, principal: str, *, org: str) -> bool:
    """New mail (mail:new) that changed since `principal` was last shown its list: what wakes
    a waiting agent. A quiet copy past the loop guard is listed with it but wakes no one."""
    row = await store.fetchone(
        "SELECT 1 FROM mails WHERE org=? AND to_principal=? AND state=? AND updated_at >"
        " coalesce((SELECT upto FROM mail_shown WHERE principal=?), -1) LIMIT 1",
        (org.lower(), principal, "mail:new", scoped(org, principal)))
    return row is not None


async def indexed_places(store: Store) -> list[Row]:
    """Every indexed mail's (mail_id, vault, number)."""
    return await store.fetchall("SELECT mail_id, vault, number FROM mails")


def _like(text: str) -> str:
    escaped = text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
    return f"%{escaped}%"


async def find_mails(store: Store, *, org: str, state: str | None, agent: str | None,
                     text: str | None, limit: int) -> list[MailRecord]:
    """`org`'s mails newest first: in `state`, to or from `agent`, with `text` in subject or
    body."""
    sql, params = _office(org)
    if state:
        sql += " AND state=?"
        params.append(state)
    if agent:
        sql += " AND (to_principal=? OR from_principal=?)"
        params += [agent, agent]
    query: Statement = sql
    if text:  # ignoring ASCII case, as SQLite's LIKE does
        query = sql + Sql(" AND (subject LIKE ? ESCAPE '\\' OR body LIKE ? ESCAPE '\\')",
                          " AND (subject ILIKE ? ESCAPE '\\' OR body ILIKE ? ESCAPE '\\')")
        params += [_like(text), _like(text)]
    rows = await store.fetchall(query + " ORDER BY sent DESC, vault DESC, number DESC LIMIT ?",
                                (*params, limit))
    return [_record(r) for r in rows]


async def count_to(store: Store, *, org: str, state: str,
                   recipients: Sequence[str]) -> dict[str, int]:
    """How many of `org`'s mails in `state` each of `recipients` has, in one grouped COUNT
    (by the `mails_org_to` index; a recipient with none is left out)."""
    if not recipients:
        return {}
    marks = ",".join("?" * len(recipients))
    rows = await store.fetchall(
        "SELECT to_principal, count(*) AS n FROM mails WHERE org=? AND state=?"
        f" AND to_principal IN ({marks}) GROUP BY to_principal",
        (org.lower(), state, *recipients))
    return {str(r["to_principal"]): int(r["n"]) for r in rows}


async def knows_principal(store: Store, principal: str, *, org: str) -> bool:
    """Whether `org`'s index holds any mail to or from `principal` (an EXISTS: one row read
    at most, by the `to_principal` index first)."""
    row = await store.fetchone(
        "SELECT 1 WHERE EXISTS (SELECT 1 FROM mails WHERE org=? AND to_principal=?)"
        " OR EXISTS (SELECT 1 FROM mails WHERE org=? AND from_principal=?)",
        (org.lower(), principal, org.lower(), principal))
    return row is not None


async def latest_mails_of(store: Store, principal: str, *, org: str) -> list[MailRecord]:
    """The 300 latest mails `principal` of `org` sent or received, newest first."""
    rows = await store.fetchall(
        "SELECT * FROM mails WHERE org=? AND (to_principal=? OR from_principal=?)"
        " ORDER BY sent DESC LIMIT 300", (org.lower(), principal, principal))
    return [_record(r) for r in rows]


async def count_agent_turn(db: Connection, mail_id: str, *, reset: bool = False) -> None:
    """In the move's transaction: one more follow-up or reopen by an agent that woke the recipient
    (`reset`: a person's follow-up or reopen, which start the count again)."""
    await db.execute("UPDATE mails SET agent_turns=" + ("0" if reset else "agent_turns+1")
                     + " WHERE mail_id=?" + (" AND agent_turns<>0" if reset else ""),
                     (mail_id,))
