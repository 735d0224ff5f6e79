"""Which account first proved each email domain with a record in the form before ids
(bot.email.domains): `vaultmail-office=<org>` names an org by its name, which a deleted or
renamed org leaves to anyone, so such a record proves the domain only for the account (the
forge's id of the org) that proved it with one first. A record naming the account's id
proves for that account alone, and needs nothing kept here."""

from __future__ import annotations

from bot.store.db import Store
from bot.store.migrations import register_schema

VERSION = 36

register_schema("""
CREATE TABLE IF NOT EXISTS domain_named_proofs (
    domain {text} PRIMARY KEY,
    account_id {int} NOT NULL,
    proved_at {real} NOT NULL         -- the database's clock
);
""", version=VERSION)


async def first_named_by(store: Store, domain: str, account_id: int) -> int:
    """The account whose office first proved `domain` with a record naming its org: this
    one (`account_id`, recorded now) when none had."""
    domain = domain.lower()
    async with store.transaction(f"domain-proof:{domain}") as db:
        await db.execute("INSERT INTO domain_named_proofs(domain, account_id, proved_at)"
                         " VALUES (?,?,vm_now()) ON CONFLICT(domain) DO NOTHING",
                         (domain, account_id))
        row = await db.fetchone("SELECT account_id FROM domain_named_proofs WHERE domain=?",
                                (domain,))
    assert row is not None
    return int(row["account_id"])
