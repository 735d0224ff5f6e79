"""The orgs a record in the form before ids may prove an email domain for (bot.email.domains).

`vaultmail-office=<org>` names an org by its name, which a deleted or renamed org leaves to
anyone: such a record proves a domain only for an org that held that name, as the same
account (the forge's id of the org), before this release. Those are taken once, as the index
is upgraded (schema 36), from the installations it knew then with their accounts. An org whose
office the index first learns of after that, or whose account it did not know then (an id the
listing reads later may be a newcomer's under a name freed before the upgrade), is in no row:
it proves its domain with a record naming its id, which needs nothing kept here."""

from __future__ import annotations

from bot.store.db import Store
from bot.store.migrations import register_backfill, register_schema

VERSION = 36

register_schema("""
CREATE TABLE IF NOT EXISTS domain_named_orgs (
    org {text} PRIMARY KEY,
    account_id {int} NOT NULL
);
""", version=VERSION)
# every (org, account) the index held at the upgrade, installed or uninstalled since; taken
# once, under the migration's lock, before any replica of this release reads the table
_HELD_THEN = ("INSERT INTO domain_named_orgs(org, account_id) SELECT org, account_id"
              " FROM installations WHERE account_id IS NOT NULL ON CONFLICT(org) DO NOTHING")
register_backfill(_HELD_THEN, postgres=_HELD_THEN, version=VERSION)


async def held_before_ids(store: Store, org: str, account_id: int) -> bool:
    """Whether `org` was the name of `account_id`'s office when the index was upgraded to
    proofs by id: a record naming `org` may prove a domain for that account alone."""
    row = await store.fetchone("SELECT 1 FROM domain_named_orgs WHERE org=? AND account_id=?",
                               (org.lower(), account_id))
    return row is not None
