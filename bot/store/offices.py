"""Which office each row belongs to (schema version 4).

One deployment serves every organisation that installs the App, so every row of the index
carries the office (the org's login, lowercase) it belongs to, and every read keyed by a
principal is also keyed by the office: `human:marco@acme.com` in acme and a
`human:marco@acme.com` some other org declares are two principals that never meet.

Rows about a repository (mails, items, comments, threads, inbox deliveries, item updates) take
their office from the repository's owner; an index written before this version gets them the
same way. Rows about no repository (chats, runs, ledger entries about no repository) written
before it stay without an office until `adopt_unowned` gives them to the deployment's one
office (`vaultmail serve` with one installation, `vaultmail up`); until then no office reads
them.

Tables keyed by a principal alone (what an agent was shown, an agent's mark on its person's box,
the strangers answered) key it by `scoped(org, principal)` instead.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable

from bot.store import outbound
from bot.store.db import Store, hold
from bot.store.migrations import register_backfill, register_columns, register_schema
from bot.store.sql import Connection, Params, Sql

VERSION = 4

_BY_REPO = {  # table -> the column holding `owner/repo` or `owner/repo#N`
    "mails": "vault",
    "items": "repo",
    "comments": "item",
    "threads": "item",
    "item_updates": "item",
}
for _table in (*_BY_REPO, "inbox_deliveries", "chats", "runs", "ledger", "outbound_cursors"):
    register_columns(_table, {"org": "{text}"}, version=VERSION)
# the hash chain an entry belongs to: its office's; NULL for entries written before there was
# one chain per office (the old single chain, which still verifies as it was written)
register_columns("ledger", {"chain": "{text}"}, version=VERSION)
# the name an entry was hashed under, once its office was renamed (`rename_in`; NULL: its
# chain's name, or a chain moved aside's name before its `~`: bot.store.ledger.verify_chain)
register_columns("ledger", {"hashed_as": "{text}"}, version=21)


def _owner_sqlite(column: str) -> str:
    return (f"CASE WHEN instr({column}, '/') > 1"
            f" THEN lower(substr({column}, 1, instr({column}, '/') - 1)) END")


def _owner_postgres(column: str) -> str:
    return f"CASE WHEN strpos({column}, '/') > 1 THEN lower(split_part({column}, '/', 1)) END"


def _backfill(owner: Callable[[str], str]) -> str:
    statements = [f"UPDATE {t} SET org={owner(c)} WHERE org IS NULL" for t, c in _BY_REPO.items()]
    statements += [
        "UPDATE inbox_deliveries SET org=(SELECT c.org FROM comments c"
        " WHERE c.id=inbox_deliveries.comment) WHERE org IS NULL",
        # a box's owner is kept scoped by its office (bot.store.comments.deliver)
        "UPDATE inbox_deliveries SET owner=org || '/' || owner WHERE org IS NOT NULL"
        f" AND {'instr' if owner is _owner_sqlite else 'strpos'}(owner, '/')=0",
        # an agent's mark, once per office its owner had deliveries in
        "INSERT INTO inbox_agent_marks(owner, agent, seq) SELECT DISTINCT d.owner, m.agent,"
        " m.seq FROM inbox_agent_marks m JOIN inbox_deliveries d"
        " ON d.owner=d.org || '/' || m.owner ON CONFLICT DO NOTHING",
        f"DELETE FROM inbox_agent_marks WHERE {'instr' if owner is _owner_sqlite else 'strpos'}"
        "(owner, '/')=0",
        # an old entry is seen by the office its subject names (a mail or an item); the rest
        # only by the operator
        f"UPDATE ledger SET org={owner('subject')} WHERE org IS NULL AND chain IS NULL",
        "CREATE INDEX IF NOT EXISTS mails_org_to ON mails(org, to_principal, state)",
        "CREATE INDEX IF NOT EXISTS ledger_org ON ledger(org, seq)",
        "CREATE INDEX IF NOT EXISTS ledger_chain ON ledger(chain, seq)",
        "CREATE INDEX IF NOT EXISTS chats_org_agent ON chats(org, agent, answered_at)",
        "CREATE INDEX IF NOT EXISTS inbox_deliveries_org ON inbox_deliveries(org, owner, box)",
        "CREATE INDEX IF NOT EXISTS threads_org_asker ON threads(org, asker)",
        "CREATE INDEX IF NOT EXISTS items_org ON items(org)",
        "CREATE INDEX IF NOT EXISTS item_updates_org ON item_updates(org, seq)",
    ]
    return ";\n".join(statements) + ";\n"


register_backfill(_backfill(_owner_sqlite), postgres=_backfill(_owner_postgres), version=VERSION)


def org_of(ref: str) -> str:
    """The office of a repository, an issue `owner/repo#N` or a vault: its owner, lowercase."""
    return ref.split("/", 1)[0].strip().lower()


register_schema("""
CREATE TABLE IF NOT EXISTS office_numbers (
    org {text} NOT NULL,
    name {text} NOT NULL,        -- table.column
    last {int} NOT NULL,         -- the last number given: never given again
    PRIMARY KEY (org, name)
);
""", version=20)
# a replica of a release before per-office numbers lives (a rolling deploy): its rows take
# their id, and so do ours meanwhile, or one of its next ids could be a number we gave
_OLDER_LIVES = "SELECT 1 FROM replicas WHERE numbering IS NULL AND seen_at>vm_now()-?"
_OLDER_NUMBERING = _OLDER_LIVES + " LIMIT 1"
_OLDER_FOR = 5.0  # seconds without a heartbeat after which a replica is gone (queue.DEAD_AFTER)


def numbered_per_office(table: str, column: str, was: str, *, unique: bool = True) -> None:
    """`table`'s rows get `column`, their number in their office, which is what the office is
    shown (schema 20): a number every office's rows share (an id, a sequence) told an office,
    by the gaps between its own, how busy the others were. A row written before takes `was`,
    so what an office held then reads the same; each office counts on from its own last
    (`next_number`)."""
    register_columns(table, {column: "{int}"}, version=20)
    index = (f"CREATE {'UNIQUE ' if unique else ''}INDEX IF NOT EXISTS {table}_org_{column}"
             f" ON {table}(org, {column});\n")
    backfill = f"UPDATE {table} SET {column}={was} WHERE {column} IS NULL;\n" + index
    register_backfill(backfill, postgres=backfill, version=20)


async def next_number(db: Connection, table: str, column: str, was: str,
                      org: str, *, counted: list[tuple[str, Params]] | None = None,
                      head: str | None = None) -> int | None:
    """The next number of `org`'s in `table` (`numbered_per_office`), in the caller's
    transaction, under the office's ledger key: above every number given before (a row deleted
    since too), and above every row of no office (which `adopt_unowned` may give it). None
    while a replica of a release before numbers lives: the row takes its `was` then
    (`number_as_was`), as that release's rows do.

    What a transaction learns here it keeps (`db.memo`): the key is held to its end, so the
    second number it takes of an office's is the first plus one, and what it read of the
    release before's replicas and rows stands (a mail's adoption takes three numbers).

    Each first number of a table in a transaction first numbers the rows such a release wrote
    meanwhile, and looks whether one of its replicas lives: on SQLite each its own statement
    (its transaction runs in one hop), on PostgreSQL all of it one statement with the
    number's (`_numbered_pg`), as fresh as ever (read once the key is held), one round trip.

    PostgreSQL, where each statement is a round trip: with `counted`, a later number's move of
    the office's counter is not sent here but put in `counted` (a statement and its
    parameters), for the caller to send as a `WITH` of the statement that writes the row it
    numbers (`ledger.append`); with `head` (a one-value query, parameter: the org), the first
    number's statement also reads it, after the key, and `memo["head", org, name]` holds what
    it read (absent when it was not read: read it yourself)."""
    org = org.lower()
    name = f"{table}.{column}"
    memo = db.memo
    given = memo.get(("number", org, name))
    if given is not None:
        number = int(given) + 1
        move: tuple[str, Params] = ("UPDATE office_numbers SET last=? WHERE org=? AND name=?",
                                    (number, org, name))
        if counted is not None and db.engine == "postgresql":
            counted.append(move)
        else:
            await db.execute(*move)
        memo["number", org, name] = number
        return number
    await hold(db, f"ledger:{org}")
    older = memo.get("older numbering")
    if db.engine == "postgresql" and not older:
        # (`older` None: not read yet in this transaction; no row back then: one lives)
        row = await db.fetchone(
            _numbered_pg(table, column, was, head),
            (org, org, name, org, org, name, older is None, _OLDER_FOR,
             *(() if head is None else (org,))))
        memo["older numbering"] = row is None
        if row is None:
            return None
        if head is not None:
            memo["head", org, name] = row[1]
    else:
        if ("unnumbered", org, table) not in memo:
            # rows such a release wrote meanwhile: numbered as that release showed them
            await db.execute(_fix(table, column, was), (org,))
        if older is None:
            older = memo["older numbering"] = (
                await db.fetchone(_OLDER_NUMBERING, (_OLDER_FOR,)) is not None)
        if older:
            return None
        row = await db.fetchone(  # (WHERE true: SQLite's parser takes the ON CONFLICT as
            # the upsert's, not as a join's)
            "INSERT INTO office_numbers(org, name, last) SELECT ?, ?, COALESCE(MAX(n), 0) + 1"
            f" FROM ({_numbers_given(table, column)}) found WHERE true{_TAKEN}",
            (org, name, org, org, name))
        assert row is not None
    memo["unnumbered", org, table] = True  # (none now, and none comes: the key is held)
    number = int(row[0])
    memo["number", org, name] = number
    return number


def _fix(table: str, column: str, was: str) -> str:
    """The rows of an office (parameter: the org) a release before wrote unnumbered, numbered
    as that release showed them (`was`)."""
    return f"UPDATE {table} SET {column}={was} WHERE org=? AND {column} IS NULL"


def _numbers_given(table: str, column: str) -> str:
    """The numbers an office's next is above (parameters: the org, the org and the counter's
    name), each part one step down an index: its rows', those of no office, its counter's."""
    return (f"SELECT MAX({column}) AS n FROM {table} WHERE org=?"
            f" UNION ALL SELECT MAX({column}) FROM {table} WHERE org IS NULL"
            " UNION ALL SELECT last FROM office_numbers WHERE org=? AND name=?")


_TAKEN = " ON CONFLICT(org, name) DO UPDATE SET last=excluded.last RETURNING last"


@functools.cache
def _numbered_pg(table: str, column: str, was: str, head: str | None = None) -> str:
    """PostgreSQL: `next_number`'s three steps in one statement. The rows a release before
    wrote unnumbered are numbered `was` (`fixed`; the statement's other parts read the table
    as it was before, so the numbers given are counted from `fixed` too); then, unless asked
    not to look (the transaction read it already) or a replica of that release lives (then no
    row comes back), the office's next number is taken, above every number given."""
    return (
        f"WITH fixed AS ({_fix(table, column, was)} RETURNING {column} AS n)"
        " INSERT INTO office_numbers(org, name, last) SELECT ?, ?, next FROM"
        " (SELECT COALESCE(MAX(n), 0) + 1 AS next FROM"
        f" ({_numbers_given(table, column)} UNION ALL SELECT MAX(n) FROM fixed) found) counted"
        f" WHERE NOT (? AND EXISTS ({_OLDER_LIVES})){_TAKEN}"
        + ("" if head is None else f", ({head}) AS head"))


async def number_as_was(db: Connection, table: str, column: str, was: str,
                        value: int) -> int:
    """The row whose `was` (its id, its seq) is `value` numbered by it, as a release before
    per-office numbers numbered it; returns that number."""
    await db.execute(f"UPDATE {table} SET {column}={was} WHERE {was}=?", (value,))
    return value


def scoped(org: str, key: str) -> str:
    """A principal (or login) as a key of one office, for tables keyed by it alone."""
    return f"{org.lower()}/{key}"


async def adopt_unowned(store: Store, org: str) -> int:
    """Give rows written before offices (chats, runs, ledger entries) to `org`: called when
    the deployment has exactly one office, which they can only have been written for, and
    only when every office the index knows of (by its mails and items) is that one: an
    index that held several offices' rows keeps these unowned. Returns the rows adopted."""
    org = org.lower()
    others = await store.fetchone(
        "SELECT 1 FROM mails WHERE org<>? UNION ALL SELECT 1 FROM items WHERE org<>? LIMIT 1",
        (org, org))
    if others is not None:
        return 0
    adopted = 0
    async with store.transaction() as db:
        for table in ("chats", "runs"):
            changed = await db.execute(f"UPDATE {table} SET org=? WHERE org IS NULL",
                                       (org.lower(),))
            adopted += changed
        # old entries: seen by the office now; they stay on the old chain they were hashed on
        changed = await db.execute("UPDATE ledger SET org=?, pos=seq WHERE org IS NULL"
                                   " AND chain IS NULL", (org.lower(),))
        adopted += changed
    return adopted


_COLUMNS = Sql(
    "SELECT m.name AS t, p.name AS c, lower(p.type) AS type FROM sqlite_master m,"
    " pragma_table_info(m.name) p WHERE m.type='table'",
    "SELECT table_name AS t, column_name AS c, data_type AS type FROM information_schema.columns"
    " WHERE table_schema=current_schema()")
_TEXT = ("text", "character varying")
# what stays as it is: the ledger is hashed as written (its rows move by their office alone),
# the org's own installation row is its caller's, the operator's office file is bound to an
# account under the name the file says (moved aside with an office whose name another account
# took, the file would be bound afresh to that account), and so are the outbound entries
# naming an org by login (`outbound_allow_accounts`), and the rest are no office's
_UNMOVED = {"installations", "ledger", "schema_migrations", "sqlite_sequence", "replicas",
            "deliveries", "missed_deliveries", "reconcile_marks", "oauth_clients",
            "idempotency",  # (its clients' keys: the office's steps move by `_move_steps`)
            "office_file_accounts", "outbound_allow_accounts"}
# what people wrote, and the app's own results: never a reference to rewrite
_CONTENT = {"body", "subject", "message", "title", "answer", "summary", "data", "payload",
            "result", "card_body", "detail", "metadata", "last_error", "flash", "cause",
            "name", "content_type", "redirect_uri", "resource", "csrf", "fingerprint"}
_IDEMPOTENCY = Sql("DELETE FROM idempotency WHERE substr(scope, 1, 5)='tool:'"
                   " AND instr(scope, ?) > 0",
                   "DELETE FROM idempotency WHERE substr(scope, 1, 5)='tool:'"
                   " AND strpos(scope, ?) > 0")


async def retire_in(db: Connection, org: str, archived: str) -> int:
    """Move every row of `org`'s office aside, under `archived` (in the caller's transaction):
    the org's name now belongs to another account, whose office starts empty, while what the
    old office kept stays for the operator (`_move`). The old office's idempotent results are
    dropped, and every token and grant it gave is revoked. Returns the rows moved."""
    moved = await _move(db, org, archived, revoke=True)
    await db.execute(_IDEMPOTENCY, (f":{org.lower()}:",))
    await _move_steps(db, org.lower(), archived.lower())  # (the rest: no key of the new one's)
    return moved


async def rename_in(db: Connection, org: str, new: str) -> int:
    """The office of `org` follows its org's new login `new` (the same account renamed it),
    in the caller's transaction (`_move`): its mail, items, ledger, members and numbers are
    the office's under the new name, its tokens and grants act there as they did, and its
    ledger chain goes on from its last entry, each entry still checked with the name it was
    hashed under (`ledger.hashed_as`). Returns the rows moved."""
    org, new = org.lower(), new.lower()
    # the chain's entries were hashed under the old name: they keep it, where not kept yet
    await db.execute("UPDATE ledger SET hashed_as=chain WHERE chain=? AND hashed_as IS NULL",
                     (org,))
    await _move_steps(db, org, new)
    # the ids its own webhook's deliveries were recorded under (`<org>/<id>`: bot.app.intake),
    # as the queue's move with it: one delivered again to the hook's old URL is one seen
    await db.execute(_DELIVERY_IDS, (new, len(org) + 1, len(org) + 1, f"{org}/", new,
                                     len(org) + 1))
    return await _move(db, org, new, revoke=False)


async def _move_steps(db: Connection, org: str, to: str) -> None:
    """`org`'s idempotent steps, `to`'s (its new name, or where it is moved aside): the
    scopes named by the office (a tool call's, an email's), an email's keys (its mail's ref,
    `org/...`), and the forge changes it handled (`<event>.<action>:<org>:<ids>`: bot.app.
    context's change_key), so a retry, or a change delivered again naming either login, finds
    what was done under the old name. A tool call's key is its client's word, whatever it
    says: never rewritten (nor another office's key that begins `org/`)."""
    for row in await db.fetchall(_SCOPES, (f":{org}",)):
        now = _scope_renamed(str(row["scope"]), org, to)
        if now is None:
            continue
        await db.execute("UPDATE idempotency SET scope=? WHERE scope=?", (now, row["scope"]))
        if not now.startswith("tool:"):
            await _rekey(db, now, org, "/", to)
    await db.execute(_FORGE_KEYS, (to, len(org) + 1, len(org) + 1, f"{org}:"))


async def _rekey(db: Connection, scope: str, old: str, sep: str, new: str) -> int:
    """The keys of `scope` that begin `old` and `sep` (an email's: its mail's ref) begin
    `new` instead."""
    return await db.execute("UPDATE idempotency SET key=? || substr(key, ?) WHERE scope=?"
                            " AND lower(substr(key, 1, ?))=?",
                            (new, len(old) + 1, scope, len(old) + 1, old + sep))


_FORGE_KEYS = Sql(
    "UPDATE idempotency SET key=substr(key, 1, instr(key, ':')) || ? || substr(key,"
    " instr(key, ':') + ?) WHERE scope='forge' AND substr(key, instr(key, ':') + 1, ?)=?",
    "UPDATE idempotency SET key=substr(key, 1, strpos(key, ':')) || ? || substr(key,"
    " strpos(key, ':') + ?) WHERE scope='forge' AND substr(key, strpos(key, ':') + 1, ?)=?")
_DELIVERY_IDS = (  # (an id recorded under both names already stays as it is)
    "UPDATE deliveries SET guid=? || substr(guid, ?) WHERE substr(guid, 1, ?)=? AND NOT EXISTS"
    " (SELECT 1 FROM deliveries d WHERE d.guid=? || substr(deliveries.guid, ?))")
_SCOPES = Sql("SELECT DISTINCT scope FROM idempotency WHERE instr(scope, ?) > 0",
              "SELECT DISTINCT scope FROM idempotency WHERE strpos(scope, ?) > 0")


def _scope_renamed(scope: str, org: str, new: str) -> str | None:
    """An idempotency scope of `org`'s office under its new name `new`: a tool's
    (`tool:<name>:<org>:<principal>`) or an email's (`email-in:<org>`, ...); None for
    another office's, or one that names no office."""
    kind, _, rest = scope.partition(":")
    if kind == "tool":
        name, _, rest = rest.partition(":")
        office, _, principal = rest.partition(":")
        return f"tool:{name}:{new}:{principal}" if office == org else None
    return f"{kind}:{new}" if kind.startswith("email-") and rest == org else None


async def rename_vault_in(db: Connection, old: str, new: str) -> int:
    """A repository of an office renamed (`owner/repo` to `owner/other`), in the caller's
    transaction: every reference to it, or to one of its issues (`owner/repo#N`), found in
    the catalogue as `_move` finds them (a mail's vault, an item's ref, ...), names it by
    its new name. The ledger keeps the names it hashed. Returns the rows changed. Only
    within the office: a repository that went to another owner takes no office's rows."""
    old, new = old.lower(), new.lower()
    org = org_of(old)
    if org_of(new) != org:
        raise ValueError(f"{old} went to another owner ({new}): not a rename")
    await hold(db, f"ledger:{org}")
    changed = 0
    for table, columns in sorted((await _catalogue(db)).items()):
        if table in _UNMOVED:
            continue
        owned = "org" in columns
        for column in _refs(columns):
            where = (f"(lower({column})=? OR lower(substr({column}, 1, ?))=?)"
                     + (" AND org=?" if owned else ""))
            changed += await db.execute(
                f"UPDATE {table} SET {column}=? || substr({column}, ?) WHERE {where}",
                (new, len(old) + 1, old, len(old) + 1, old + "#", *((org,) if owned else ())))
    for row in await db.fetchall(_SCOPES, (f":{org}",)):  # its emails' steps, by their refs
        scope = str(row["scope"])
        if scope.startswith("email-") and scope.partition(":")[2] == org:
            changed += await _rekey(db, scope, old, "#", new)
    return changed


async def _catalogue(db: Connection) -> dict[str, dict[str, str]]:
    """{table: {column: its type}} of every table, from the database's own catalogue."""
    tables: dict[str, dict[str, str]] = {}
    for row in await db.fetchall(_COLUMNS):
        tables.setdefault(str(row["t"]), {})[str(row["c"])] = str(row["type"] or "")
    return tables


def _refs(columns: dict[str, str]) -> list[str]:
    """The text columns that may hold a reference (`owner/repo...`, a scoped principal)."""
    return [column for column, kind in sorted(columns.items())
            if kind in _TEXT and column not in _CONTENT and column not in ("org", "office")]


async def _move(db: Connection, org: str, to: str, *, revoke: bool) -> int:
    """Every row of `org`'s office moved to the office `to`: every column that names the
    office (`org`, the queue's `office`, the ledger's `chain`), and every reference that
    starts with the office (`org/...`: a mail's vault, an item's ref and parent, a scoped
    principal, ...), found in the database's own catalogue, so a table added later is moved
    too. `revoke`: every token and grant it gave is revoked, not moved live. Holds the
    office's member and ledger keys, so no append chains onto the old office meanwhile.
    Returns the rows moved."""
    org, to = org.lower(), to.lower()
    await hold(db, f"office-members:{org}")
    await hold(db, f"ledger:{org}")  # (an office's ledger key last, as every transaction)
    now, moved, prefix = time.time(), 0, org + "/"
    for table, columns in sorted((await _catalogue(db)).items()):
        if table in _UNMOVED - {"ledger"}:
            continue
        owned = "org" in columns
        for column in ("org", "office", "chain"):
            if column in columns:
                moved += await db.execute(
                    f"UPDATE {table} SET {column}=? WHERE {column}=?", (to, org))
        if table == "ledger":
            continue
        for column in _refs(columns):
            where = f"lower(substr({column}, 1, ?))=?" + (" AND org=?" if owned else "")
            changed = await db.execute(
                f"UPDATE {table} SET {column}=? || substr({column}, ?) WHERE {where}",
                (to, len(prefix), len(prefix), prefix, *((to,) if owned else ())))
            moved += changed
        if revoke and "revoked_at" in columns and owned:  # tokens, grants: dead
            await db.execute(f"UPDATE {table} SET revoked_at=? WHERE org=?"
                             " AND revoked_at IS NULL", (now, to))
    await outbound.move_cursors(db, org, to)  # (keyed `<org> <url>`: no reference above)
    return moved
