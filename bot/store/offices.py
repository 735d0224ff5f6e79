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

import time
from collections.abc import Callable

from bot.store.db import Store
from bot.store.migrations import register_backfill, register_columns
from bot.store.sql import Connection, Sql

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
    "SELECT m.name AS t, p.name AS c FROM sqlite_master m, pragma_table_info(m.name) p"
    " WHERE m.type='table'",
    "SELECT table_name AS t, column_name AS c FROM information_schema.columns"
    " WHERE table_schema=current_schema()")
# keys made with `scoped(org, ...)` in tables with no office column of their own
_SCOPED = {"inbox_agent_marks": "owner"}
_KEPT = {"installations"}  # the org's own row: its caller writes the new owner's


async def retire_in(db: Connection, org: str, archived: str) -> int:
    """Move every row of `org`'s office aside, under `archived` (in the caller's transaction):
    the org's name now belongs to another account, whose office starts empty, while what the
    old office kept stays for the operator. Every column that names the office (`org`, the
    queue's `office`, the ledger's `chain`), the repository of rows about one (`_BY_REPO`),
    and scoped keys. Revokes every token and grant the old office gave. Returns rows moved."""
    org, archived = org.lower(), archived.lower()
    tables: dict[str, set[str]] = {}
    for row in await db.fetchall(_COLUMNS):
        tables.setdefault(str(row["t"]), set()).add(str(row["c"]))
    now, moved = time.time(), 0
    for table, columns in sorted(tables.items()):
        if table in _KEPT:
            continue
        for column in ("org", "office", "chain"):
            if column in columns:
                moved += await db.execute(
                    f"UPDATE {table} SET {column}=? WHERE {column}=?", (archived, org))
        prefixed = [_BY_REPO.get(table)] + (["owner"] if table == "inbox_deliveries" else [])
        for column in (c for c in prefixed if c is not None):
            await db.execute(
                f"UPDATE {table} SET {column}=? || substr({column}, ?) WHERE org=?"
                f" AND lower(substr({column}, 1, ?))=?",
                (archived, len(org) + 1, archived, len(org) + 1, org + "/"))
        if table in _SCOPED:
            column = _SCOPED[table]
            moved += await db.execute(
                f"UPDATE {table} SET {column}=? || substr({column}, ?)"
                f" WHERE substr({column}, 1, ?)=?", (archived, len(org) + 1, len(org) + 1,
                                                      org + "/"))
        if "revoked_at" in columns and "org" in columns:  # tokens, grants: dead, not moved
            await db.execute(f"UPDATE {table} SET revoked_at=? WHERE org=?"
                             " AND revoked_at IS NULL", (now, archived))
    return moved
