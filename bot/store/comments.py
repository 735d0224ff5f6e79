"""The comments index: items, comments, threads (with their questions and decisions), inbox
deliveries with read marks, and updates on outcomes. All rebuildable from the forge except
`then` and read marks, which live only here (`then` must never be in the forge in clear)."""

from __future__ import annotations

import json
import time
from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass, field
from operator import attrgetter, itemgetter
from typing import Any
from weakref import WeakKeyDictionary

from bot import jsontext
from bot.items.model import Item, item_ref
from bot.items.threads import ThreadState
from bot.store.db import Connection, Row, Store, hold, register_columns, register_schema
from bot.store.migrations import register_backfill
from bot.store.offices import org_of, scoped
from bot.store.sql import Sql, greatest, indexed_by, padded, upsert

register_schema("""
CREATE TABLE IF NOT EXISTS items (
    ref {text} PRIMARY KEY,
    repo {text} NOT NULL,
    number {int} NOT NULL,
    kind {text} NOT NULL,
    title {text} NOT NULL,
    state {text} NOT NULL,
    author_login {text} NOT NULL,
    author {text},
    parent {text},
    assignees {text} NOT NULL,
    claim {text},
    updated_at {real} NOT NULL,
    key {text}
);
CREATE INDEX IF NOT EXISTS items_parent ON items(parent);
CREATE TABLE IF NOT EXISTS comments (
    seq {id},
    id {text} NOT NULL UNIQUE,
    item {text} NOT NULL,
    thread {text} NOT NULL,
    parent {text},
    author {text} NOT NULL,
    body {text} NOT NULL,
    data {text} NOT NULL,
    forge_id {int},
    created_at {real} NOT NULL
);
CREATE INDEX IF NOT EXISTS comments_item ON comments(item);
-- A forge comment stands for one comment: a retried delivery must not index it twice.
CREATE UNIQUE INDEX IF NOT EXISTS comments_forge_once ON comments(forge_id)
    WHERE forge_id IS NOT NULL;
CREATE TABLE IF NOT EXISTS threads (
    id {text} PRIMARY KEY,
    item {text} NOT NULL,
    scope {text} NOT NULL,
    asker {text} NOT NULL,
    is_question {int} NOT NULL,
    open {int} NOT NULL,
    card_id {int},
    card_body {text},
    state {text} NOT NULL,
    answered_at {real},
    updated_at {real} NOT NULL
);
CREATE INDEX IF NOT EXISTS threads_asker ON threads(asker, is_question, open);
CREATE INDEX IF NOT EXISTS threads_scope ON threads(scope, answered_at);
CREATE INDEX IF NOT EXISTS threads_card ON threads(card_id);
CREATE TABLE IF NOT EXISTS inbox_deliveries (
    seq {id},
    owner {text} NOT NULL,
    box {text} NOT NULL,
    principal {text} NOT NULL,
    comment {text} NOT NULL,
    read_at {real},
    created_at {real} NOT NULL
);
CREATE INDEX IF NOT EXISTS inbox_deliveries_owner ON inbox_deliveries(owner, box, read_at);
CREATE TABLE IF NOT EXISTS item_updates (
    seq {id},
    item {text} NOT NULL,
    kind {text} NOT NULL,
    actor {text} NOT NULL,
    summary {text} NOT NULL,
    data {text} NOT NULL,
    at {real} NOT NULL
);
CREATE INDEX IF NOT EXISTS item_updates_item ON item_updates(item, seq);
""")

# Schema 37: the item an update tells of besides its outcome (a plan, evidence), in a column
# of its own, so a repository's or org's rename rewrites it as it does `item`
# (offices.rename_vault_in): an update is judged by what the repository is called now, never
# by a name another repository may take since. Filled from `data` for older rows.
UPDATE_ABOUT_VERSION = 37
register_columns("item_updates", {"about": "{text}"}, version=UPDATE_ABOUT_VERSION)
register_backfill("UPDATE item_updates SET about=json_extract(data, '$.item')"
                  " WHERE about IS NULL",
                  postgres="UPDATE item_updates SET about=data::jsonb->>'item'"
                           " WHERE about IS NULL",
                  version=UPDATE_ABOUT_VERSION)

# A forge comment is recorded once for the issue it is on (`comment_by_forge_id`): on Gitea
# every org's comments are numbered by one counter, and an org's admins sign their own
# deliveries, so an id alone, unique across the index, let evil record first the id acme's
# next comment would get, and acme's comment was then taken as already recorded.
register_schema("""
DROP INDEX IF EXISTS comments_forge_once;
CREATE UNIQUE INDEX IF NOT EXISTS comments_forge_once_item ON comments(item, forge_id)
    WHERE forge_id IS NOT NULL;
""", version=19)

# PostgreSQL writes SQLite's triggers below as functions; the same rows, the same moments.
_PG_DERIVED = """
CREATE OR REPLACE FUNCTION vm_thread_waiting() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP <> 'INSERT' THEN
        DELETE FROM thread_waiting WHERE thread=OLD.id;
    END IF;
    IF TG_OP <> 'DELETE' THEN
        DELETE FROM thread_waiting WHERE thread=NEW.id;
        IF NEW.open=1 AND NEW.is_question=1 THEN
            INSERT INTO thread_waiting(principal, thread, updated_at)
                SELECT w, NEW.id, NEW.updated_at FROM jsonb_array_elements_text(
                    coalesce(NEW.state::jsonb->'waiting_on', '[]'::jsonb)) AS w
                ON CONFLICT DO NOTHING;
        END IF;
    END IF;
    RETURN NULL;
END $$;
DROP TRIGGER IF EXISTS threads_waiting ON threads;
CREATE TRIGGER threads_waiting AFTER INSERT OR UPDATE OR DELETE ON threads
    FOR EACH ROW EXECUTE FUNCTION vm_thread_waiting();
CREATE OR REPLACE FUNCTION vm_item_assignees() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP <> 'INSERT' THEN
        DELETE FROM item_assignees WHERE item=OLD.ref;
    END IF;
    IF TG_OP <> 'DELETE' THEN
        DELETE FROM item_assignees WHERE item=NEW.ref;
        INSERT INTO item_assignees(login, item)
            SELECT a, NEW.ref FROM jsonb_array_elements_text(NEW.assignees::jsonb) AS a
            ON CONFLICT DO NOTHING;
    END IF;
    RETURN NULL;
END $$;
DROP TRIGGER IF EXISTS items_assignees ON items;
CREATE TRIGGER items_assignees AFTER INSERT OR UPDATE OR DELETE ON items
    FOR EACH ROW EXECUTE FUNCTION vm_item_assignees();
"""
# Indexes and derived tables for the inboxes (additive: an existing index gets them at open).
# `thread_waiting` holds who each open question waits on (`waiting_on` from the JSON state);
# triggers keep it in step with every write to `threads`, whoever makes it, and the last
# statement fills it for threads written before it existed (a no-op once it is filled).
# `item_assignees` does the same for the logins assigned to an item.
register_schema("""
CREATE INDEX IF NOT EXISTS threads_open ON threads(updated_at) WHERE open=1;
CREATE INDEX IF NOT EXISTS threads_open_asked
    ON threads(asker, open, is_question, updated_at, id) WHERE open=1 AND is_question=1;
CREATE INDEX IF NOT EXISTS threads_asked_scope ON threads(asker, is_question, scope);
CREATE INDEX IF NOT EXISTS threads_scope_asked ON threads(scope, is_question, asker);
CREATE INDEX IF NOT EXISTS items_author ON items(author);
CREATE INDEX IF NOT EXISTS items_claim ON items(claim);
CREATE INDEX IF NOT EXISTS inbox_deliveries_owner_seq ON inbox_deliveries(owner, seq);
CREATE INDEX IF NOT EXISTS inbox_deliveries_unread ON inbox_deliveries(owner, box, seq)
    WHERE read_at IS NULL;
CREATE TABLE IF NOT EXISTS thread_waiting (
    principal {text} NOT NULL,
    thread {text} NOT NULL,
    updated_at {real} NOT NULL,
    org {text},
    repo {text} NOT NULL DEFAULT '',
    asker {text} NOT NULL DEFAULT '',
    PRIMARY KEY (principal, thread)
){without_rowid};
CREATE INDEX IF NOT EXISTS thread_waiting_thread ON thread_waiting(thread);
CREATE TABLE IF NOT EXISTS item_assignees (
    login {text} NOT NULL,
    item {text} NOT NULL,
    PRIMARY KEY (login, item)
){without_rowid};
CREATE INDEX IF NOT EXISTS item_assignees_item ON item_assignees(item);
""")
register_schema("""
CREATE TRIGGER IF NOT EXISTS threads_waiting_insert AFTER INSERT ON threads BEGIN
    DELETE FROM thread_waiting WHERE thread=NEW.id;
    INSERT OR IGNORE INTO thread_waiting(principal, thread, updated_at)
        SELECT value, NEW.id, NEW.updated_at FROM json_each(NEW.state, '$.waiting_on')
        WHERE NEW.open=1 AND NEW.is_question=1;
END;
CREATE TRIGGER IF NOT EXISTS threads_waiting_update AFTER UPDATE ON threads BEGIN
    DELETE FROM thread_waiting WHERE thread=OLD.id;
    DELETE FROM thread_waiting WHERE thread=NEW.id;
    INSERT OR IGNORE INTO thread_waiting(principal, thread, updated_at)
        SELECT value, NEW.id, NEW.updated_at FROM json_each(NEW.state, '$.waiting_on')
        WHERE NEW.open=1 AND NEW.is_question=1;
END;
CREATE TRIGGER IF NOT EXISTS threads_waiting_delete AFTER DELETE ON threads BEGIN
    DELETE FROM thread_waiting WHERE thread=OLD.id;
END;
INSERT OR IGNORE INTO thread_waiting(principal, thread, updated_at)
    SELECT w.value, t.id, t.updated_at FROM threads t, json_each(t.state, '$.waiting_on') w
    WHERE t.open=1 AND t.is_question=1;
CREATE TRIGGER IF NOT EXISTS items_assignees_insert AFTER INSERT ON items BEGIN
    DELETE FROM item_assignees WHERE item=NEW.ref;
    INSERT OR IGNORE INTO item_assignees(login, item)
        SELECT value, NEW.ref FROM json_each(NEW.assignees);
END;
CREATE TRIGGER IF NOT EXISTS items_assignees_update AFTER UPDATE ON items BEGIN
    DELETE FROM item_assignees WHERE item=OLD.ref;
    DELETE FROM item_assignees WHERE item=NEW.ref;
    INSERT OR IGNORE INTO item_assignees(login, item)
        SELECT value, NEW.ref FROM json_each(NEW.assignees);
END;
CREATE TRIGGER IF NOT EXISTS items_assignees_delete AFTER DELETE ON items BEGIN
    DELETE FROM item_assignees WHERE item=OLD.ref;
END;
INSERT OR IGNORE INTO item_assignees(login, item)
    SELECT a.value, i.ref FROM items i, json_each(i.assignees) a;
""", postgres=_PG_DERIVED)


# -- items ---------------------------------------------------------------------------------
# An item's stable key ("AC-12", from its title or body), so tools can name it by the key
# (added to an older index at open; looked up rarely, by tools, so it has no index of its own).
register_columns("items", {"key": "{text}"})


_PUT_ITEM = upsert("items", ["ref", "repo", "number", "kind", "title", "state", "author_login",
                             "author", "parent", "assignees", "claim", "key", "updated_at",
                             "org"],
                   ["ref"])


async def put_item(db: Connection, item: Item) -> None:
    await db.execute(_PUT_ITEM,
                     (item.ref, item.repo, item.number, item.kind, item.title, item.state,
                      item.author_login, item.author, item.parent, json.dumps(list(item.assignees)),
                      item.claim, item.key, time.time(), org_of(item.repo)))


def _item(r: Any) -> Item:
    return Item(repo=r["repo"], number=r["number"], kind=r["kind"], title=r["title"],
                state=r["state"], author_login=r["author_login"], parent=r["parent"],
                assignees=tuple(json.loads(r["assignees"])), author=r["author"],
                claim=r["claim"], key=r["key"])


async def items_by_key(store: Store, key: str, org: str) -> list[Item]:
    """The items of the org's repositories that give themselves `key` (upper-cased)."""
    prefix = org.lower() + "/"
    rows = await store.fetchall(
        "SELECT * FROM items WHERE key=? AND substr(repo, 1, ?)=? ORDER BY repo, number",
        (key, len(prefix), prefix))
    return [_item(r) for r in rows]


async def get_item(store: Store, ref: str) -> Item | None:
    """The index's item `ref` names, in any case (`item_ref`: as `put_item` keeps it)."""
    row = await store.fetchone("SELECT * FROM items WHERE ref=?", (item_ref(ref),))
    return _item(row) if row else None


async def items_at(store: Store, refs: Iterable[str]) -> dict[str, Item]:
    """The index's items among `refs` (in any case), by their ref as kept (`item_ref`), in one
    statement."""
    refs = padded(sorted({item_ref(ref) for ref in refs}))
    if not refs:
        return {}
    rows = await store.fetchall(f"SELECT * FROM items WHERE ref IN ({_marks(refs)})",
                                tuple(refs))
    return {(item := _item(r)).ref: item for r in rows}


async def item_kinds(store: Store, refs: set[str]) -> dict[str, str]:
    """goal/outcome/plan/evidence for each known item among `refs` (for inbox cards)."""
    if not refs:
        return {}
    marks = ",".join("?" for _ in refs)
    rows = await store.fetchall(f"SELECT ref, kind FROM items WHERE ref IN ({marks})",
                                tuple(refs))
    return {str(r["ref"]): str(r["kind"]) for r in rows}


async def children(store: Store, ref: str) -> list[Item]:
    rows = await store.fetchall("SELECT * FROM items WHERE parent=? ORDER BY repo, number",
                                (ref,))
    return [_item(r) for r in rows]


# -- comments ------------------------------------------------------------------------------
# Schema 32: a comment follows the forge after it was indexed. `edited_at`: when its words
# were last read back from the forge after an edit; `deleted_at`: when it was deleted on the
# forge (the row stays as a tombstone without its words, so a late `created` never indexes
# it again).
COMMENT_CHANGES_VERSION = 32
register_columns("comments", {"edited_at": "{real}", "deleted_at": "{real}"},
                 version=COMMENT_CHANGES_VERSION)

# Schema 35: an edit that came before its comment was indexed (its `created` late: out of
# order, or lost and redelivered): the forge's words then, and when, until the comment is
# indexed (`put_comment` takes them in its transaction); pruned after the retention.
EARLY_EDITS_VERSION = 35
register_schema("""
CREATE TABLE IF NOT EXISTS early_edits (
    item {text} NOT NULL,
    forge_id {int} NOT NULL,
    body {text} NOT NULL,
    edited_at {real} NOT NULL,
    PRIMARY KEY (item, forge_id)
);
CREATE INDEX IF NOT EXISTS early_edits_at ON early_edits(edited_at);
""", version=EARLY_EDITS_VERSION)
_PUT_EARLY_EDIT = upsert("early_edits", ["item", "forge_id", "body", "edited_at"],
                         ["item", "forge_id"])


@dataclass(frozen=True)
class CommentRow:
    id: str
    item: str
    thread: str
    parent: str | None
    author: str
    body: str
    data: dict[str, Any]
    forge_id: int | None
    created_at: float
    edited_at: float | None = None
    deleted_at: float | None = None


# (a row's JSON is read by orjson where it reads it as json.loads does, `bot.jsontext`: an
# inbox reads some fifty of them a call)
def _comment(r: Any) -> CommentRow:
    return CommentRow(r["id"], r["item"], r["thread"], r["parent"], r["author"], r["body"],
                      jsontext.loads(r["data"]), r["forge_id"], r["created_at"],
                      r["edited_at"], r["deleted_at"])


async def put_comment(db: Connection, c: CommentRow) -> None:
    """Index `c`; a forge comment edited before it was indexed (`note_early_edit`) is indexed
    with its words as the forge showed them after that edit, marked edited."""
    body, edited_at = c.body, c.edited_at
    if c.forge_id is not None and c.deleted_at is None:
        early = await db.fetchone("SELECT body, edited_at FROM early_edits WHERE item=? AND"
                                  " forge_id=?", (c.item, c.forge_id))
        if early is not None:
            await db.execute("DELETE FROM early_edits WHERE item=? AND forge_id=?",
                             (c.item, c.forge_id))
            if early["body"] != body:
                body, edited_at = early["body"], early["edited_at"]
    await db.execute(
        "INSERT INTO comments(id, item, thread, parent, author, body, data, forge_id,"
        " created_at, edited_at, deleted_at, org) VALUES (?,?,?,?,?,?,?,?,?,?,?,?)",
        (c.id, c.item, c.thread, c.parent, c.author, body, json.dumps(c.data), c.forge_id,
         c.created_at, edited_at, c.deleted_at, org_of(c.item)))


async def note_early_edit(store: Store, item: str, forge_id: int, body: str) -> None:
    """Forge comment `forge_id` on `item`, not indexed yet, reads `body` after an edit: kept
    for when it is (`put_comment`)."""
    async with store.transaction() as db:
        await db.execute(_PUT_EARLY_EDIT, (item, forge_id, body, time.time()))


async def edit_comment(db: Connection, comment_id: str, body: str) -> None:
    """The comment's words as the forge shows them after an edit."""
    await db.execute("UPDATE comments SET body=?, edited_at=? WHERE id=? AND deleted_at IS NULL",
                     (body, time.time(), comment_id))


async def forget_comment(db: Connection, c: CommentRow, owners: list[str], *,
                         org: str) -> None:
    """Comment `c` was deleted on the forge: its words go (the row stays, a tombstone saying
    who wrote it and when it went) and so do its deliveries in the `owners`' boxes."""
    kept = {k: c.data[k] for k in ("kind", "option") if k in c.data}
    await db.execute("UPDATE comments SET body='', data=?, deleted_at=? WHERE id=?",
                     (json.dumps(kept), time.time(), c.id))
    for owner in sorted(set(owners)):  # (each box's key held, as deliver holds it)
        await hold(db, inbox_key(org, owner))
        await db.execute("DELETE FROM inbox_deliveries WHERE owner=? AND comment=?",
                         (scoped(org, owner), c.id))


async def get_comment(store: Store, comment_id: str) -> CommentRow | None:
    row = await store.fetchone("SELECT * FROM comments WHERE id=?", (comment_id,))
    return _comment(row) if row else None


async def comment_by_forge_id(store: Store, forge_id: int, item: str) -> CommentRow | None:
    """The comment recorded for forge comment `forge_id` on `item` (a forge comment is on one
    issue: its id alone, which another org's signed delivery may name first, is not enough)."""
    row = await store.fetchone("SELECT * FROM comments WHERE item=? AND forge_id=?",
                               (item, forge_id))
    return _comment(row) if row else None


async def comments_by_ids(store: Store, ids: list[str]) -> dict[str, CommentRow]:
    if not ids:
        return {}
    marks = ",".join("?" for _ in ids)
    rows = await store.fetchall(f"SELECT * FROM comments WHERE id IN ({marks})", tuple(ids))
    return {r["id"]: _comment(r) for r in rows}


async def count_comments(store: Store, item: str) -> int:
    row = await store.fetchone(
        "SELECT count(*) AS n FROM comments WHERE item=? AND deleted_at IS NULL", (item,))
    return int(row["n"]) if row else 0


async def agents_in_a_row(store: Store, item: str, thread: str | None) -> int:
    """How many of a conversation's comments, newest first, agents wrote before anyone else's
    (the loop guard's hops for its next comment: `bot.items.loop_guard.hops`, in SQL): thread
    `thread`'s, or with None the item's comments that reply to none
    (`loop_guard.counts_in`). A comment deleted on the forge is not counted, as a rebuild,
    which never sees it, counts it not."""
    where = "item=? AND deleted_at IS NULL AND " + (
        "thread=?" if thread is not None else "parent IS NULL")
    args = (item, thread) if thread is not None else (item,)
    row = await store.fetchone(
        f"SELECT count(*) AS n FROM comments WHERE {where} AND seq>"
        f" coalesce((SELECT max(seq) FROM comments WHERE {where}"
        " AND substr(author, 1, 6)<>'agent:'), 0)", (*args, *args))
    return int(row["n"]) if row else 0


async def count_past(store: Store, item: str, thread: str, first: int) -> int:
    """How many of `thread`'s comments came after the first `first` comments of `item`."""
    row = await store.fetchone(
        "SELECT count(*) AS n FROM comments WHERE item=? AND thread=? AND seq>"
        " (SELECT seq FROM comments WHERE item=? ORDER BY seq LIMIT 1 OFFSET ?)",
        (item, thread, item, first - 1))
    return int(row["n"]) if row else 0


# -- threads -------------------------------------------------------------------------------
@dataclass(frozen=True)
class ThreadRow:
    id: str
    item: str
    scope: str  # where its decision counts: the item, or a plan's/evidence's parent
    state: ThreadState
    card_id: int | None
    card_body: str | None
    answered_at: float | None
    updated_at: float


def _thread(r: Any) -> ThreadRow:
    return ThreadRow(r["id"], r["item"], r["scope"],
                     ThreadState.from_json(jsontext.loads(r["state"])),
                     r["card_id"], r["card_body"], r["answered_at"], r["updated_at"])


_PUT_THREAD = upsert("threads", ["id", "item", "scope", "asker", "is_question", "open",
                                 "card_id", "card_body", "state", "answered_at", "updated_at",
                                 "org"],
                     ["id"])


async def put_thread(db: Connection, t: ThreadRow) -> None:
    s = t.state
    await db.execute(_PUT_THREAD,
        (t.id, t.item, t.scope, s.asker, int(s.is_question), int(not s.resolved), t.card_id,
         t.card_body, json.dumps(s.to_json()), t.answered_at, time.time(), org_of(t.item)))


async def swap_thread(store: Store, seen: ThreadRow, row: ThreadRow) -> bool:
    """Write `row` over the thread as `seen` read it, and only so: False, writing nothing,
    when another write came between (its `updated_at` moved). For a change made off a read
    with a forge write between, which must not undo what another writer did meanwhile."""
    s = row.state
    async with store.transaction() as db:
        return await db.execute(
            "UPDATE threads SET scope=?, asker=?, is_question=?, open=?, card_id=?,"
            " card_body=?, state=?, answered_at=?, updated_at=? WHERE id=? AND updated_at=?",
            (row.scope, s.asker, int(s.is_question), int(not s.resolved), row.card_id,
             row.card_body, json.dumps(s.to_json()), row.answered_at,
             max(time.time(), seen.updated_at + 1e-6), row.id, seen.updated_at)) == 1


async def move_threads(db: Connection, item: str, old_scope: str, new_scope: str) -> None:
    """The item's threads count for `new_scope` now (a plan moved to another outcome): found
    through the scope index, so a move costs what its threads do."""
    await db.execute("UPDATE threads SET scope=? WHERE scope=? AND item=?",
                     (new_scope, old_scope, item))


async def get_thread(store: Store, thread_id: str) -> ThreadRow | None:
    row = await store.fetchone("SELECT * FROM threads WHERE id=?", (thread_id,))
    return _thread(row) if row else None


async def threads_by_ids(store: Store, ids: list[str]) -> list[ThreadRow]:
    if not ids:
        return []
    marks = ",".join("?" for _ in ids)
    rows = await store.fetchall(f"SELECT * FROM threads WHERE id IN ({marks})", tuple(ids))
    return [_thread(r) for r in rows]


@dataclass(frozen=True, slots=True)
class ThreadPlace:
    """Where a thread is: its item, and the scope its decision counts for (`ThreadRow`'s,
    without its state)."""

    id: str
    item: str
    scope: str


async def thread_places(store: Store, ids: list[str]) -> list[ThreadPlace]:
    """The places of these threads: what `views.hidden_claims` reads of a thread, without
    reading and decoding its state (an inbox asks it of the threads of its unread comments
    on every call)."""
    if not ids:
        return []
    rows = await store.fetchall(f"SELECT id, item, scope FROM threads WHERE id IN ({_marks(ids)})",
                                tuple(ids))
    return [ThreadPlace(r["id"], r["item"], r["scope"]) for r in rows]


async def thread_by_card(store: Store, card_id: int, item: str) -> ThreadRow | None:
    """The question whose card is forge comment `card_id` on `item`."""
    row = await store.fetchone("SELECT * FROM threads WHERE card_id=? AND item=?",
                               (card_id, item))
    return _thread(row) if row else None


async def open_threads(store: Store, *, item: str | None = None) -> list[ThreadRow]:
    sql, params = "SELECT * FROM threads WHERE open=1", []
    if item is not None:
        sql, params = sql + " AND item=?", [item]
    rows = await store.fetchall(sql + " ORDER BY updated_at DESC", tuple(params))
    return [_thread(r) for r in rows]


# Decoded thread rows, per store, checked against the row's updated_at (every write of a thread
# sets it), so a list_inbox does not decode the same JSON on each call.
_THREAD_CACHE_SIZE = 8192
_thread_caches: WeakKeyDictionary[Store, OrderedDict[str, tuple[float, ThreadRow]]] = (
    WeakKeyDictionary())


def _marks(values: Any) -> str:
    return ",".join("?" for _ in values)


async def open_questions_involving(store: Store, principals: list[str], *,
                                   org: str) -> list[ThreadRow]:
    """`org`'s open questions that wait on or were asked by any of `principals`, newest first
    (found through `thread_waiting` and the asker), all of them. The inbox reads no longer
    this, but its pages, visibility in the query (`question_repos`, `inbox_questions`)."""
    if not principals:
        return []
    ps = _marks(principals)
    # thread_waiting holds only open questions; the asker side reads a covering partial index
    # (one statement: one trip to the connection's thread)
    # (thread, updated_at) pairs: TEXT and REAL columns, as they are; this loop runs over
    # every open question of the caller on each call, so it does no more than it must
    # (another office's threads, waiting on a principal of the same name, are not read)
    org = org.lower()
    found: dict[str, float] = {r[0]: r[1] for r in await store.fetchall(
        "SELECT w.thread, w.updated_at FROM thread_waiting w CROSS JOIN threads t"
        f" WHERE w.principal IN ({ps}) AND t.id=w.thread AND t.org=?"
        " UNION ALL SELECT id, updated_at FROM " + indexed_by("threads", "threads_open_asked")
        + f" WHERE asker IN ({ps}) AND open=1 AND is_question=1 AND org=?",
        (*principals, org, *principals, org))}
    keys = sorted(found.items(), key=itemgetter(1), reverse=True)
    return await _cached_threads(store, keys)


async def _cached_threads(store: Store, keys: list[tuple[str, float]]) -> list[ThreadRow]:
    """The open threads of these (id, updated_at) keys, in their order: decoded rows from the
    store's thread cache where the row has not been written since, the rest read (one
    statement for up to 500)."""
    cache = _thread_caches.get(store)
    if cache is None:
        cache = _thread_caches[store] = OrderedDict()
    out: list[ThreadRow | None] = []
    missing: dict[str, int] = {}
    get = cache.get
    for thread_id, updated_at in keys:
        hit = get(thread_id)
        if hit is not None and hit[0] == updated_at:  # kept in the order first read
            out.append(hit[1])
        else:
            missing[thread_id] = len(out)
            out.append(None)
    ids = list(missing)
    for start in range(0, len(ids), 500):
        chunk = ids[start:start + 500]
        for r in await store.fetchall(
                f"SELECT * FROM threads WHERE id IN ({_marks(chunk)}) AND open=1",
                tuple(chunk)):
            row = _thread(r)
            out[missing[row.id]] = row
            cache[row.id] = (row.updated_at, row)
            cache.move_to_end(row.id)
    while len(cache) > _THREAD_CACHE_SIZE:
        cache.popitem(last=False)
    return [t for t in out if t is not None]


# (Schema 15 drops these two: the inbox reads its own indexes since, see below.)
# The open questions indexed as the inbox reads them (partial: open questions only, a few
# thousand rows where the table holds every thread ever asked), each covering what its lists
# need without the row (whose JSON state comes before `org` and `updated_at`): by id, for the
# questions `thread_waiting` names; by asker, for those asked and not answered yet.
INBOX_VERSION = 14
register_schema("""
CREATE INDEX IF NOT EXISTS threads_open_questions
    ON threads(id, org, item, asker, updated_at) WHERE open=1 AND is_question=1;
CREATE INDEX IF NOT EXISTS threads_open_askers
    ON threads(asker, org, updated_at, id, item, answered_at) WHERE open=1 AND is_question=1;
""", version=INBOX_VERSION)


# Schema 15: each open question's office, repository and asker beside who it waits on, and
# the asked questions indexed by their repository, so the inbox's reads stay in the indexes
# (the repositories of the caller's questions, each list's page and its count) and read the
# threads table only for the rows of the page. A thread's repository key is its item's ref
# without its `#N`, lower-cased, where the ref ends in `#` and digits (`owner/repo#N`), else
# '' (of no repository: never shown); the key of a repository is matched whole.
INBOX_REPO_VERSION = 15


def _repo_key(item: str) -> str:
    """The repository key of the ref in column `item` (see above), the same words on both
    engines (the indexes on it are matched by its words)."""
    bare = f"rtrim({item}, '0123456789')"
    return (f"(CASE WHEN substr({bare}, length({bare}), 1)='#' THEN lower(rtrim({bare}, '#'))"
            " ELSE '' END)")


_REPO_KEY = _repo_key("t.item")
# (a table made anew has them from the start: schema 15's triggers, there since, write them)
register_columns("thread_waiting", {"org": "{text}",
                                    "repo": "{text} NOT NULL DEFAULT ''",
                                    "asker": "{text} NOT NULL DEFAULT ''"},
                 version=INBOX_REPO_VERSION)
_sqlite_waiting_rows = """INSERT OR IGNORE INTO thread_waiting(principal, thread, updated_at, org,
        repo, asker)
        SELECT value, NEW.id, NEW.updated_at, NEW.org, {repo}, NEW.asker
        FROM json_each(NEW.state, '$.waiting_on') WHERE NEW.open=1 AND NEW.is_question=1;"""
register_backfill(f"""
DROP TRIGGER IF EXISTS threads_waiting_insert;
DROP TRIGGER IF EXISTS threads_waiting_update;
CREATE TRIGGER threads_waiting_insert AFTER INSERT ON threads BEGIN
    DELETE FROM thread_waiting WHERE thread=NEW.id;
    {_sqlite_waiting_rows.format(repo=_repo_key("NEW.item"))}
END;
CREATE TRIGGER threads_waiting_update AFTER UPDATE ON threads BEGIN
    DELETE FROM thread_waiting WHERE thread=OLD.id;
    DELETE FROM thread_waiting WHERE thread=NEW.id;
    {_sqlite_waiting_rows.format(repo=_repo_key("NEW.item"))}
END;
UPDATE thread_waiting SET (org, repo, asker) = (SELECT t.org,
    {_repo_key("t.item")}, t.asker FROM threads t
    WHERE t.id=thread_waiting.thread) WHERE thread IN (SELECT id FROM threads);
CREATE INDEX IF NOT EXISTS thread_waiting_inbox
    ON thread_waiting(principal, org, repo, updated_at, thread, asker);
CREATE INDEX IF NOT EXISTS threads_open_asker_repos
    ON threads(asker, org, {_repo_key("item")}, answered_at, updated_at, id)
    WHERE open=1 AND is_question=1;
DROP INDEX IF EXISTS threads_open_questions;
DROP INDEX IF EXISTS threads_open_askers;
""", postgres=f"""
CREATE OR REPLACE FUNCTION vm_thread_waiting() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP <> 'INSERT' THEN
        DELETE FROM thread_waiting WHERE thread=OLD.id;
    END IF;
    IF TG_OP <> 'DELETE' THEN
        DELETE FROM thread_waiting WHERE thread=NEW.id;
        IF NEW.open=1 AND NEW.is_question=1 THEN
            INSERT INTO thread_waiting(principal, thread, updated_at, org, repo, asker)
                SELECT w, NEW.id, NEW.updated_at, NEW.org,
                    {_repo_key("NEW.item")}, NEW.asker
                FROM jsonb_array_elements_text(
                    coalesce(NEW.state::jsonb->'waiting_on', '[]'::jsonb)) AS w
                ON CONFLICT DO NOTHING;
        END IF;
    END IF;
    RETURN NULL;
END $$;
UPDATE thread_waiting w SET org=t.org, repo={_repo_key("t.item")},
    asker=t.asker FROM threads t WHERE t.id=w.thread;
CREATE INDEX IF NOT EXISTS thread_waiting_inbox
    ON thread_waiting(principal, org, repo, updated_at, thread, asker);
CREATE INDEX IF NOT EXISTS threads_open_asker_repos
    ON threads(asker, org, {_repo_key("item")}, answered_at, updated_at, id)
    WHERE open=1 AND is_question=1;
DROP INDEX IF EXISTS threads_open_questions;
DROP INDEX IF EXISTS threads_open_askers;
""", version=INBOX_REPO_VERSION)

# The inbox's question lists, read with the visibility rule and the page in the query: which
# repositories a caller's open questions are on (`question_repos`, a handful of rows), then,
# given those of them the caller may see, each list's newest `limit` threads and how many it
# holds (`inbox_questions`): what the inbox can show, and nothing of a repository it cannot.
# A thread's repository is its repository key (schema 15, above), lower-cased as visibility
# asks the forge; a ref that does not end in `#N` is of no repository, never shown.
# whether `viewer` (the next parameter) has replied in the thread since its answer
_REPLIED = Sql("EXISTS (SELECT 1 FROM json_each(t.state, '$.replied_since') WHERE value=?)",
               "coalesce(t.state::jsonb->'replied_since', '[]'::jsonb)"
               " @> jsonb_build_array(?::text)")
WAITING_ON, ASKED_BY = "waiting_on", "asked_by"


@dataclass(frozen=True)
class QuestionPage:
    """The newest threads of one of the inbox's question lists, and how many it holds."""

    threads: list[ThreadRow]
    total: int
    kinds: dict[str, str] = field(default_factory=dict)  # goal/outcome/... of their items


async def question_repos(store: Store, principals: list[str], *, org: str) -> list[str]:
    """The repositories (lower-cased `owner/repo`) of `org`'s open questions that wait on or
    were asked by any of `principals`: what visibility is asked about, once each (read from
    the indexes alone: `thread_waiting_inbox`, `threads_open_asker_repos`)."""
    if not principals:
        return []
    org = org.lower()
    rows = await store.fetchall(_QUESTION_REPOS.get(len(principals)) or _question_repos(
        len(principals)), (*principals, org, org, org, org))
    return sorted(str(r["repo"]) for r in rows if r["repo"])


# Each principal's repositories, one index seek a repository: the next repository after the
# last one found (a skip scan, in a recursive query), where reading every open question of
# theirs in the indexes and keeping the distinct repositories read a few hundred rows each for
# a handful of repositories (bench.inbox: 667 rows for builder's 2).
_QUESTION_REPOS: dict[int, Sql] = {}


def _question_repos(n: int) -> Sql:
    def asked(who: str, after: str = "") -> Sql:  # the first repository of who's questions
        return ("(SELECT min(" + _REPO_KEY + ") FROM "  # (after `after`, where given)
                + indexed_by("threads t", "threads_open_asker_repos")
                + f" WHERE t.asker={who}.p AND t.open=1 AND t.is_question=1 AND t.org=?"
                + after + ")")

    def waiting(who: str, after: str = "") -> str:  # of the questions waiting on who
        return f"(SELECT min(repo) FROM thread_waiting WHERE principal={who}.p AND org=?{after})"

    sql = ("WITH RECURSIVE ps(p) AS (VALUES " + ",".join("(?)" for _ in range(n)) + "),"
           " w(p, repo) AS (SELECT p, " + waiting("ps") + " FROM ps"
           " UNION ALL SELECT w.p, " + waiting("w", " AND repo>w.repo")
           + " FROM w WHERE w.repo IS NOT NULL),"
           " a(p, repo) AS (SELECT p, " + asked("ps") + " FROM ps"
           " UNION ALL SELECT a.p, " + asked("a", " AND " + _REPO_KEY + ">a.repo")
           + " FROM a WHERE a.repo IS NOT NULL)"
           " SELECT repo FROM w WHERE repo IS NOT NULL"
           " UNION SELECT repo FROM a WHERE repo IS NOT NULL")
    _QUESTION_REPOS[n] = sql
    return sql


def _list_sql(name: str, kind: str, principals: int, sibling: bool,
              repos: int | None) -> Sql:
    """One list's page (see `inbox_questions`), each row with the list's name and total: the
    page and the count read from the indexes alone, the threads table only for the page. Its
    parameters are `_list_params`'."""
    ps = ",".join("?" * principals)
    if kind == WAITING_ON:  # questions waiting on any of them (thread_waiting: open ones;
        # its org, repo and asker are the thread's, written by the triggers of schema 15)
        source: Sql | str = "thread_waiting w"
        where: Sql | str = f" WHERE w.principal IN ({ps}) AND w.org=?"
        if repos is not None:  # only the repositories the caller may see
            where = where + f" AND w.repo IN ({','.join('?' * repos)})"
        if sibling:  # an answer to a sibling agent's question, which the viewer (not
            # waited on) has replied in since: set down, not shown (inbox._turns)
            where = (where + " AND NOT (w.asker IN (" + ps + ") AND NOT EXISTS (SELECT 1"
                     " FROM thread_waiting v WHERE v.thread=w.thread AND v.principal=?)"
                     " AND EXISTS (SELECT 1 FROM thread_waiting a WHERE a.thread=w.thread"
                     " AND a.principal=w.asker) AND EXISTS (SELECT 1 FROM threads t"
                     " WHERE t.id=w.thread AND " + _REPLIED + "))")
        rows: Sql | str = "SELECT DISTINCT w.thread AS id, w.updated_at FROM " + source + where
        counted: Sql | str = "SELECT count(DISTINCT w.thread) FROM " + source + where
    else:  # questions they asked, not answered yet
        # (no answer: `answered_at` is set with the answer, and only then; the JSON state is
        # not read for it, and inbox._waiting_on_others checks the state of what it shows)
        source = indexed_by("threads t", "threads_open_asker_repos")
        where = (f" WHERE t.asker IN ({ps}) AND t.open=1 AND t.is_question=1 AND t.org=?"
                 " AND t.answered_at IS NULL")
        if repos is not None:
            where = where + " AND " + _REPO_KEY + f" IN ({','.join('?' * repos)})"
        rows = "SELECT t.id, t.updated_at FROM " + source + where
        counted = "SELECT count(*) FROM " + source + where
    # the page's items (and their kinds: an inbox card carries its item's kind) with it; the
    # list's count once (an uncorrelated subquery)
    sql = (f"SELECT '{name}' AS list, {name}.id, {name}.updated_at, p.item,"
           " (SELECT kind FROM items i WHERE i.ref=p.item) AS kind, (" + counted
           + ") AS total FROM (" + rows + " ORDER BY updated_at DESC, id DESC LIMIT ?) "
           + name + f" JOIN threads p ON p.id={name}.id")
    return Sql(sql, sql) if isinstance(sql, str) else sql


def _list_params(kind: str, principals: list[str], viewer: str | None,
                 repos: list[str] | None, org: str, limit: int) -> list[Any]:
    """The parameters of `_list_sql`'s statement: the list's condition twice (its count, its
    page), then the page's size."""
    params: list[Any] = [*principals, org, *(repos if repos is not None else ())]
    if viewer is not None:
        params += [*principals, viewer, viewer]
    return [*params, *params, limit]


# the statement of each shape of inbox_questions' lists: its names and kinds, how many
# principals each names, whether a sibling's answers are set down, how many repositories
_INBOX_STATEMENTS: dict[tuple[Any, ...], Sql] = {}
_INBOX_STATEMENTS_KEPT = 512


async def inbox_questions(store: Store, lists: dict[str, tuple[str, list[str]]], *,
                          viewer: str | None, repos: list[str] | None, org: str,
                          limit: int) -> dict[str, QuestionPage]:
    """For each list `name: (kind, principals)`, `org`'s open questions newest first, at most
    `limit`, and how many there are: `WAITING_ON` those waiting on any of the principals
    (without, where `viewer` is one of them, an answer to a sibling's question the viewer has
    replied in since), `ASKED_BY` those they asked that have no answer yet. Only threads on
    `repos` (lower-cased `owner/repo`; None: every repository) are read. One statement."""
    org = org.lower()
    wanted = {name: spec for name, spec in lists.items() if spec[1]}
    out = {name: QuestionPage([], 0) for name in lists}
    if not wanted or repos == []:
        return out
    shape: list[tuple[str, str, int, bool]] = []
    params: list[Any] = []
    for name, (kind, principals) in wanted.items():
        # (a sibling's question needs another of them waited on: not with the viewer alone)
        sibling = kind == WAITING_ON and viewer in principals and len(principals) > 1
        shape.append((name, kind, len(principals), sibling))
        params += _list_params(kind, principals, viewer if sibling else None, repos, org, limit)
    key = (*shape, None if repos is None else len(repos))
    statement = _INBOX_STATEMENTS.get(key)
    if statement is None:
        parts = [_list_sql(*part, None if repos is None else len(repos)) for part in shape]
        statement = parts[0]
        for part in parts[1:]:
            statement = statement + " UNION ALL " + part
        if len(_INBOX_STATEMENTS) >= _INBOX_STATEMENTS_KEPT:
            _INBOX_STATEMENTS.clear()
        _INBOX_STATEMENTS[key] = statement
    keys: dict[str, list[tuple[str, float]]] = {name: [] for name in wanted}
    kinds: dict[str, dict[str, str]] = {name: {} for name in wanted}
    totals: dict[str, int] = {}
    # (by position: list, id, updated_at, item, kind, total)
    for name, thread_id, updated_at, item, kind, total in await store.fetchall(statement,
                                                                                params):
        totals[name] = total
        keys[name].append((str(thread_id), float(updated_at)))
        if kind is not None:
            kinds[name][str(item)] = str(kind)
    # the pages' threads, decoded once (a thread may be on two lists: waiting on the person,
    # asked by an agent), newest first as each list's query ordered them
    everyone = {key for found in keys.values() for key in found}
    threads = {t.id: t for t in await _cached_threads(store, sorted(everyone))}
    newest = attrgetter("updated_at", "id")
    for name, found in keys.items():
        out[name] = QuestionPage(
            sorted((threads[i] for i, _ in found if i in threads), key=newest, reverse=True),
            int(totals.get(name, 0)), kinds[name])
    return out


async def count_open_questions(store: Store, asker: str, item: str | None = None, *,
                               org: str) -> int:
    """The asker's open questions that someone can still answer: not one asked only of people
    who have left (unanswered and waiting on its asker: `ThreadState.returned`)."""
    sql, params = ("SELECT count(*) AS n FROM threads WHERE asker=? AND is_question=1 AND open=1"
                   " AND org=? AND NOT (answered_at IS NULL AND EXISTS (SELECT 1 FROM"
                   " thread_waiting w WHERE w.thread=threads.id AND w.principal=threads.asker))",
                   [asker, org.lower()])
    if item is not None:
        sql += " AND item=?"
        params.append(item)
    row = await store.fetchone(sql, tuple(params))
    return int(row["n"]) if row else 0


async def decisions(store: Store, scope: str, limit: int = 10) -> list[ThreadRow]:
    rows = await store.fetchall(
        "SELECT * FROM threads WHERE scope=? AND answered_at IS NOT NULL"
        " ORDER BY answered_at DESC LIMIT ?", (scope, limit))
    return [_thread(r) for r in rows]


async def questions_asked_on(store: Store, askers: list[str], *, org: str) -> list[str]:
    if not askers:
        return []
    marks = ",".join("?" for _ in askers)
    rows = await store.fetchall(
        "SELECT DISTINCT scope FROM " + indexed_by("threads", "threads_asked_scope")
        + f" WHERE is_question=1 AND asker IN ({marks})",
        tuple(askers))
    return [r["scope"] for r in rows if org_of(r["scope"]) == org.lower()]


def _relevant_sql(mine: list[str], logins: list[str]) -> tuple[Sql, tuple[str, ...]]:
    """The refs of items `mine` created, hold or were asked about, or `logins` are assigned."""
    m = _marks(mine)
    sql = (f"SELECT ref FROM items WHERE author IN ({m})"
           f" UNION SELECT ref FROM items WHERE claim IN ({m})"
           " UNION SELECT scope FROM " + indexed_by("threads", "threads_asked_scope")
           + f" WHERE asker IN ({m}) AND is_question=1")
    params: tuple[str, ...] = (*mine, *mine, *mine)
    if logins:
        sql += f" UNION SELECT item FROM item_assignees WHERE login IN ({_marks(logins)})"
        params += tuple(logins)
    return sql, params


async def relevant_items(store: Store, mine: list[str], logins: list[str], *,
                         org: str) -> list[str]:
    if not mine and not logins:
        return []
    sql, params = _relevant_sql(mine or [""], logins)
    return sorted(str(r["ref"]) for r in await store.fetchall(sql, params)
                  if org_of(str(r["ref"])) == org.lower())


UPDATES_WINDOW = 512  # newest updates checked one by one before the relevant set is built


def _update_columns(keys: bool, alias: str = "") -> str:
    """What `updates_for` reads of each update: the update, or (`keys`) its seq and the
    repositories of the items it names (`_repo_key`: of its outcome, `item`, and of the plan
    or evidence it tells of, `about`, NULL where it tells of none; '' for a name of no
    repository), and its time."""
    a = alias
    if not keys:
        return f"{a}seq, {a}item, {a}kind, {a}actor, {a}summary, {a}data, {a}at, {a}about"
    return (f"{a}seq, {_repo_key(a + 'item')} AS repo, (CASE WHEN {a}about IS NULL"
            f" OR {a}about='' THEN NULL ELSE {_repo_key(a + 'about')} END) AS about_repo,"
            f" {a}at")


async def updates_for(store: Store, mine: list[str], logins: list[str], exclude: list[str],
                      before: int | None, since: float | None,
                      limit: int, *, org: str, least: int | None = None,
                      keys: bool = False) -> list[Row]:
    """`updates_page` over `org`'s items relevant to `mine`/`logins` (see `_relevant_sql`),
    newest first, without building that set when the newest updates already fill the page.
    `least`: the caller reads ahead, and `least` rows (or every one there is) are enough
    where the window holds that many but not `limit` (it reads on from the last row when it
    needs more): the window's rows are returned, not read past it. `keys`: each row's seq,
    the repositories it names and its time alone (`_update_columns`), for what the viewer
    may see: what an update says stays in the database until it is read by its seq
    (`updates_at`)."""
    org = org.lower()
    mine = mine or [""]
    m, ex = _marks(mine), _marks(exclude) or "''"
    page = (before or 2**62, since or 0.0)
    assigned = (f" OR EXISTS (SELECT 1 FROM item_assignees a WHERE a.item=u.item"
                f" AND a.login IN ({_marks(logins)}))") if logins else ""
    # The window: the newest UPDATES_WINDOW candidates, from the seq of the last of them
    # (counted in `item_updates_org` alone where no `since` asks for `at`; NULL when there
    # are fewer: the window holds every candidate). The page is read from the table newest
    # first, each update checked as it comes, and stops when it is full: what lies below
    # it in the window is not read (as a subquery of the window, every update of it was
    # checked, then sorted). After the page, one row (seq -1) whose `at` is that bound:
    # one statement, one trip to the connection's thread.
    # (without `since` the window counts every update: `at>=0` holds for every time written,
    # and an update the page's filter would leave out only sends it past the window)
    at = " AND at>=?" if since is not None else ""
    bound = (f"(SELECT seq FROM item_updates WHERE org=? AND seq<?{at}"
             " ORDER BY seq DESC LIMIT 1 OFFSET ?)")
    # (the keys' window twice as long: it counts the updates the viewer may not see too,
    # which the rounds read in windows of their own, and one long window is cheaper than
    # building the relevant set: bench.inbox's lee)
    rows_in = 2 * UPDATES_WINDOW if keys else UPDATES_WINDOW
    window = (org, page[0], *((since,) if since is not None else ()), rows_in - 1)
    bound_row = (f"-1, NULL, NULL, {bound}" if keys
                 else f"-1, NULL, NULL, NULL, NULL, NULL, {bound}, NULL")
    rows = await store.fetchall(
        f"SELECT * FROM (SELECT {_update_columns(keys, 'u.')}"
        f" FROM item_updates u WHERE u.org=? AND u.seq<? AND u.at>=?"
        f" AND u.seq>=coalesce({bound}, -1)"
        f" AND u.actor NOT IN ({ex}) AND ("
        " EXISTS (SELECT 1 FROM items i WHERE i.ref=u.item"
        f"  AND (i.author IN ({m}) OR i.claim IN ({m})))"
        " OR EXISTS (SELECT 1 FROM " + indexed_by("threads t", "threads_scope_asked")
        + " WHERE t.scope=u.item AND t.is_question=1"
        f"  AND t.asker IN ({m})){assigned})"
        " ORDER BY u.seq DESC LIMIT ?) page"
        f" UNION ALL SELECT {bound_row}"
        " ORDER BY 1 DESC",
        (org, *page, *window, *exclude, *mine, *mine, *mine, *logins, limit, *window))
    full = rows.pop()["at"] is not None
    if len(rows) >= (limit if least is None else least) or not full:
        return rows  # the page is full (enough of it), or the window held every candidate
    sql, params = _relevant_sql(mine, logins)
    return await store.fetchall(
        f"SELECT {_update_columns(keys)} FROM item_updates WHERE item IN (" + sql
        + f") AND actor NOT IN ({ex}) AND seq<? AND at>=? AND org=? ORDER BY seq DESC"
        " LIMIT ?",
        (*params, *exclude, *page, org, limit))


async def updates_at(store: Store, seqs: list[int], *, org: str) -> list[Row]:
    """The updates of `org` of these seqs (as `updates_for` reads them), newest first."""
    if not seqs:
        return []
    return await store.fetchall(
        f"SELECT {_update_columns(False)} FROM item_updates WHERE seq IN ({_marks(seqs)})"
        " AND org=? ORDER BY seq DESC", (*seqs, org.lower()))


# -- deliveries (the inboxes) --------------------------------------------------------------
# A box's owner is kept as `scoped(org, owner)`: one office's `human:marco@acme.com` and
# another's are two owners, whose deliveries and agents' marks never mix.
def inbox_key(org: str, owner: str) -> str:
    """The key one owner's deliveries are written under (see deliver)."""
    return f"box:{scoped(org, owner)}"


async def deliver(db: Connection, owner: str, box: str, principal: str,
                  comment: str, *, org: str, read_at: float | None = None) -> None:
    # One owner's deliveries commit in the order of their seq: an agent's mark (mark_seen)
    # moves over the deliveries it was shown, so one numbered before them and committed after
    # would fall behind the mark unseen. (Callers delivering to several owners go in order of
    # owner; the ledger's key comes after.)
    await hold(db, inbox_key(org, owner))
    await db.execute("INSERT INTO inbox_deliveries(owner, box, principal, comment, created_at,"
                     " org, read_at) VALUES (?,?,?,?,?,?,?)",
                     (scoped(org, owner), box, principal, comment, time.time(), org.lower(),
                      read_at))


def _unread_in(boxes: int, *, columns: str = "*", order: str = " ORDER BY seq") -> Sql:
    # params: owner, the boxes
    return (f"SELECT {columns} FROM " + indexed_by("inbox_deliveries", "inbox_deliveries_unread")
            + f" WHERE owner=? AND box IN ({','.join('?' * boxes)}) AND read_at IS NULL"
            + order)


async def unread_in(store: Store, owner: str, boxes: list[str], *, org: str) -> list[Row]:
    """The owner's unread deliveries in `boxes`, oldest first."""
    if not boxes:
        return []
    return await store.fetchall(_unread_in(len(boxes)), (scoped(org, owner), *boxes))


async def has_unread(store: Store, owner: str, *, org: str) -> bool:
    """Whether the owner's own (`you`) box holds anything unread."""
    owner = scoped(org, owner)
    row = await store.fetchone(
        "SELECT 1 FROM " + indexed_by("inbox_deliveries", "inbox_deliveries_unread")
        + " WHERE owner=? AND box='you' AND read_at IS NULL LIMIT 1", (owner,))
    return row is not None


# Each agent's read mark on its person's shared agents' box (seed: "Every agent of yours shares
# it"): the newest delivery it has been shown. An agent is shown every unread delivery at once,
# so one mark per agent says all it has seen, and a sibling's call never consumes its share.
# (`read_at` on an agents' box row is the mark of an older version, one for the whole box.)
register_schema("""
CREATE TABLE IF NOT EXISTS inbox_agent_marks (
    owner {text} NOT NULL,
    agent {text} NOT NULL,
    seq {int} NOT NULL,
    PRIMARY KEY (owner, agent)
){without_rowid};
CREATE INDEX IF NOT EXISTS inbox_deliveries_unread_for
    ON inbox_deliveries(owner, box, principal, seq) WHERE read_at IS NULL;
""")



def _unseen(*, only: str = "", index: str = "inbox_deliveries_unread",
            order: str = " ORDER BY seq", columns: str = "*") -> Sql:
    """Deliveries of an owner's agents' box past an agent's mark; params: owner, the values
    `only` needs, owner, agent (then those `limit` needs)."""
    return (f"SELECT {columns} FROM " + indexed_by("inbox_deliveries", index)
            + " WHERE owner=? AND box='agents'" + only + " AND read_at IS NULL AND seq>coalesce("
            "(SELECT seq FROM inbox_agent_marks WHERE owner=? AND agent=?), 0)"
            + order)


async def unseen_by(store: Store, owner: str, agent: str, *, org: str) -> list[Row]:
    """The deliveries in the owner's agents' box that `agent` has not been shown, oldest
    first."""
    owner = scoped(org, owner)
    return await store.fetchall(_unseen(), (owner, owner, agent))


async def mark_seen(store: Store, owner: str, agent: str,
                    looked_at: list[tuple[int, str]], *, org: str) -> None:
    """`agent` has been through these deliveries of the owner's agents' box ((seq, comment)
    pairs from `unseen_by`): its mark moves past them, and never goes back.

    The mark moves under the box's key (see deliver), only as far as the committed deliveries
    match what was looked at: a look outside it may see a delivery of a transaction still
    open, whose seq a rollback frees for a delivery the agent has not seen."""
    if not looked_at:
        return
    owner = scoped(org, owner)
    wanted = set(looked_at)
    async with store.transaction(f"box:{owner}") as db:  # (owner scoped: inbox_key's)
        rows = await db.fetchall(_unseen(only=" AND seq<=?"), (
                                 owner, max(seq for seq, _ in looked_at), owner, agent))
        committed = [(int(r["seq"]), str(r["comment"])) for r in rows]
        upto = None
        for pair in committed:
            if pair not in wanted:
                break
            upto = pair[0]
        if upto is None:
            return
        await db.execute(
            "INSERT INTO inbox_agent_marks(owner, agent, seq) VALUES (?,?,?)"
            " ON CONFLICT(owner, agent) DO UPDATE SET seq="
            + greatest("inbox_agent_marks.seq", "excluded.seq"),
            (owner, agent, upto))


def _unseen_by_their_agent(agents: int) -> Sql:
    """The deliveries in the owner's agents' box that the agent each is for has not been
    shown yet (the person's history of what their agents are handling), in one statement for
    every agent (each row against the mark of the agent it is for); params: owner, agents."""
    return ("SELECT 1 AS part, * FROM "
            + indexed_by("inbox_deliveries d", "inbox_deliveries_unread_for")
            + f" WHERE owner=? AND box='agents' AND principal IN ({','.join('?' * agents)})"
            " AND read_at IS NULL AND seq>coalesce((SELECT seq FROM inbox_agent_marks m"
            " WHERE m.owner=d.owner AND m.agent=d.principal), 0)")


async def unread_boxes(store: Store, owner: str, *, you: bool, agent: str | None,
                       agents: list[str], org: str) -> tuple[list[Row], list[Row]]:
    """An inbox look's unread deliveries, in one read: the owner's own (`you`) box's unread
    (as `unread_in`; none unless `you`), and of the agents' box what `agent` has not been
    shown (`unseen_by`) or, without an agent, what the agent each is for has not
    (`_unseen_by_their_agent` of `agents`); each oldest first. (Read one after the other,
    they were a trip more to the index's thread on every look.)"""
    key = scoped(org, owner)
    parts: list[Sql] = []
    params: list[Any] = []
    if you:
        parts.append(_unread_in(1, columns="0 AS part, *", order=""))
        params += [key, "you"]
    if agent is not None:
        parts.append(_unseen(columns="1 AS part, *", order=""))
        params += [key, key, agent]
    elif agents:
        parts.append(_unseen_by_their_agent(len(agents)))
        params += [key, *agents]
    if not parts:
        return [], []
    statement = parts[0]
    for part in parts[1:]:
        statement = statement + " UNION ALL " + part
    rows = await store.fetchall(statement + " ORDER BY part, seq", params)
    return [r for r in rows if r["part"] == 0], [r for r in rows if r["part"] == 1]


async def seen_page(store: Store, owner: str, agent: str, before: int | None,
                    limit: int, *, org: str) -> list[Row]:
    """What `agent` has been shown of the owner's agents' box, newest first."""
    owner = scoped(org, owner)
    return await store.fetchall(
        "SELECT * FROM " + indexed_by("inbox_deliveries", "inbox_deliveries_owner_seq")
        + " WHERE owner=? AND seq<? AND box='agents' AND (read_at IS NOT NULL OR seq<=coalesce("
        "(SELECT seq FROM inbox_agent_marks WHERE owner=? AND agent=?), 0))"
        " ORDER BY seq DESC LIMIT ?", (owner, before or 2**62, owner, agent, limit))


async def mark_read(store: Store, shown: list[tuple[int, str]]) -> None:
    """Mark as read the `you` deliveries shown, as (seq, comment) pairs.

    A look outside a transaction may see a delivery of a transaction still open, whose seq a
    rollback frees for the next one: the comment must match for the mark to be written."""
    if not shown:
        return
    async with store.transaction() as db:
        await db.executemany("UPDATE inbox_deliveries SET read_at=? WHERE seq=? AND comment=?"
                             " AND box='you' AND read_at IS NULL",
                             [(time.time(), seq, comment) for seq, comment in shown])


async def read_page(store: Store, owner: str, before: int | None,
                    limit: int, *, org: str) -> list[Row]:
    """What the owner has read of their own (`you`) box, newest first."""
    owner = scoped(org, owner)
    return await store.fetchall(
        "SELECT * FROM inbox_deliveries WHERE owner=? AND box='you' AND read_at IS NOT NULL"
        " AND seq<? ORDER BY seq DESC LIMIT ?", (owner, before or 2**62, limit))


# -- updates on outcomes -------------------------------------------------------------------
async def add_update(db: Connection, item: str, kind: str, actor: str, summary: str,
                     about: str | None = None) -> None:
    """An update on the outcome `item`, telling of the item `about` (a plan or evidence)."""
    await db.execute("INSERT INTO item_updates(item, kind, actor, summary, data, at, org, about)"
                     " VALUES (?,?,?,?,?,?,?,?)",
                     (item, kind, actor, summary, json.dumps({"item": about} if about else {}),
                      time.time(), org_of(item), about))




async def followers_of(store: Store, outcome: str) -> tuple[list[str], list[str]]:
    """Who gets an outcome's updates besides its author and claim holder (see `updates_for`):
    the askers of questions scoped to it, and the logins assigned to it."""
    askers = await store.fetchall(
        "SELECT DISTINCT asker FROM threads WHERE scope=? AND is_question=1", (outcome,))
    logins = await store.fetchall("SELECT login FROM item_assignees WHERE item=?", (outcome,))
    return [str(r["asker"]) for r in askers], [str(r["login"]) for r in logins]


async def latest_deliveries(store: Store, owner: str, before: int | None, limit: int, *,
                            org: str) -> list[Row]:
    """`owner`'s newest inbox deliveries (below seq `before`, where given), newest first:
    each its `seq` and the `item` its comment is on."""
    below = "" if before is None else " AND d.seq<?"
    return await store.fetchall(
        "SELECT d.seq AS seq, c.item AS item FROM inbox_deliveries d JOIN comments c"
        " ON c.id=d.comment WHERE d.owner=?" + below + " ORDER BY d.seq DESC LIMIT ?",
        (scoped(org, owner), *(() if before is None else (before,)), limit))


async def questions_answered_by(store: Store, principal: str, limit: int, *,
                                org: str) -> list[str]:
    """Ids of `org`'s open questions `principal` answered or whose answer was theirs, latest
    first."""
    rows = await store.fetchall(
        "SELECT id FROM " + indexed_by("threads", "threads_open")
        + " WHERE open=1 AND is_question=1 AND org=? AND ("
        + Sql("json_extract(state, '$.answer.by')=? OR json_extract(state, '$.answer.person')=?",
              "state::jsonb #>> '{answer,by}'=? OR state::jsonb #>> '{answer,person}'=?")
        + ") ORDER BY updated_at DESC LIMIT ?", (org.lower(), principal, principal, limit))
    return [str(r["id"]) for r in rows]
