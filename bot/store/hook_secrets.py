"""What each org's own webhook secret on Gitea is made from (bot.app.intake.org_webhook_secret):
the org's id on the forge, and its generation.

The id is the one the app read for the org's name from the forge (`installations.account_id`,
at start and every few minutes: bot.app.gitea_orgs): an org deleted and made again under its
name by another user is another id, so another secret, and the old org's admins, who were given
the old one, sign nothing for it. An org the app has not seen has no id, and no secret yet.

Before ids (version 30) the secret was made from the name alone. Those secrets were given out,
so they stay the org's while the name is the same org's: each name known then is recorded with
its org's id (`org_webhook_names`; one whose id was not read yet, with the id the app reads
first), and its secret is made from the name while that org holds it (`Generation.by_name`).

The generation is 0 for an org never rotated (no row), one more at each `vaultmail gitea-hook
ORG --rotate`. Only numbers and times are kept here, where every replica reads them: the secret
itself is made from the operator's, never stored.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from bot.store import ledger
from bot.store.db import Store
from bot.store.migrations import register_backfill, register_schema
from bot.store.sql import Connection

VERSION = 26
ROTATED = "office.webhook_secret_rotated"  # the ledger's word for a rotation

register_schema("""
CREATE TABLE IF NOT EXISTS org_webhook_secrets (
    org {text} PRIMARY KEY,
    generation {int} NOT NULL,
    rotated_at {real} NOT NULL        -- the database's clock
);
""", version=VERSION)

BY_NAME = 30
register_schema("""
CREATE TABLE IF NOT EXISTS org_webhook_names (
    org {text} PRIMARY KEY,
    org_id {int}                      -- NULL: bound to the id the app reads first
);
""", version=BY_NAME)
_NAMES_THEN = ("INSERT INTO org_webhook_names(org, org_id) SELECT org, account_id"
               " FROM installations WHERE true ON CONFLICT(org) DO NOTHING")
register_backfill(_NAMES_THEN, postgres=_NAMES_THEN, version=BY_NAME)


@dataclass(frozen=True)
class Generation:
    """An org's webhook secret as intake makes it: its generation, and whose it is."""

    number: int
    rotated_at: float | None  # when it became the org's (None: never rotated)
    # seconds since rotated_at when read, both by the database's clock (a replica's own may
    # disagree with it); not what tells generations apart
    age: float = field(default=0.0, compare=False)
    org_id: int | None = None  # the forge's id of the org holding the name (None: not seen)
    by_name: bool = False  # its secret is made from its name alone (given out before ids)


NEVER_ROTATED = Generation(0, None)


async def rotate(store: Store, org: str, actor: str) -> Generation:
    """`org`'s next generation, ledgered in the office's chain with who asked (no secret)."""
    org = org.lower()
    async with store.transaction(f"org-webhook:{org}") as db:
        row = await db.fetchone("SELECT generation FROM org_webhook_secrets WHERE org=?",
                                (org,))
        number = (int(row[0]) if row is not None else 0) + 1
        await db.execute(
            "INSERT INTO org_webhook_secrets(org, generation, rotated_at) VALUES (?,?,vm_now())"
            " ON CONFLICT(org) DO UPDATE SET generation=excluded.generation,"
            " rotated_at=excluded.rotated_at", (org, number))
        await ledger.append(db, ROTATED, actor, org, {"generation": number}, org=org)
    return await generation(store, org)


async def generations(store: Store) -> dict[str, Generation]:
    """Every org's that the app has seen or rotated (a row each)."""
    return {str(r[0]): _generation(r) for r in await store.fetchall(_READ)}


async def generation(store: Store, org: str) -> Generation:
    row = await store.fetchone(_READ + " WHERE o.org=?", (org.lower(),))
    return NEVER_ROTATED if row is None else _generation(row)


async def bind_names_in(db: Connection, accounts: dict[str, int]) -> None:
    """In the caller's transaction (the listing's, as it records each org's id first): a
    name recorded before its org's id was read (`org_webhook_names`) is that org's."""
    await db.executemany("UPDATE org_webhook_names SET org_id=? WHERE org=? AND org_id IS NULL",
                         sorted((account, org) for org, account in accounts.items()))


def _generation(row: Any) -> Generation:
    org_id = None if row[4] is None else int(row[4])
    return Generation(int(row[1] or 0), None if row[2] is None else float(row[2]),
                      float(row[3] or 0.0), org_id,
                      org_id is not None and row[5] is not None and int(row[5]) == org_id)


# each org the app has seen (its id) or rotated, with its generation and the id its
# name-made secret was given to
_READ = ("SELECT o.org, s.generation, s.rotated_at, vm_now()-s.rotated_at AS age,"
         " i.account_id, n.org_id AS named_for"
         " FROM (SELECT org FROM installations UNION SELECT org FROM org_webhook_secrets) o"
         " LEFT JOIN org_webhook_secrets s ON s.org=o.org"
         " LEFT JOIN installations i ON i.org=o.org"
         " LEFT JOIN org_webhook_names n ON n.org=o.org")
