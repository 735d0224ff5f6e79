"""The generation of each org's own webhook secret on Gitea (bot.app.intake.org_webhook_secret):
0 for an org never rotated (no row: the secret installs had before rotation existed), one more
at each `vaultmail gitea-hook ORG --rotate`. Only the number and when it moved are kept here,
where every replica reads them: the secret itself is made from the operator's, never stored.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from bot.store import ledger
from bot.store.db import Store, register_schema

VERSION = 26
ROTATED = "office.webhook_secret_rotated"  # the ledger's word for a rotation

register_schema("""
CREATE TABLE IF NOT EXISTS org_webhook_secrets (
    org {text} PRIMARY KEY,
    generation {int} NOT NULL,
    rotated_at {real} NOT NULL        -- the database's clock
);
""", version=VERSION)


@dataclass(frozen=True)
class Generation:
    number: int
    rotated_at: float | None  # when it became the org's (None: never rotated)
    # seconds since rotated_at when read, both by the database's clock (a replica's own may
    # disagree with it); not what tells generations apart
    age: float = field(default=0.0, compare=False)


NEVER_ROTATED = Generation(0, None)


async def rotate(store: Store, org: str, actor: str) -> Generation:
    """`org`'s next generation, ledgered in the office's chain with who asked (no secret)."""
    org = org.lower()
    async with store.transaction(f"org-webhook:{org}") as db:
        row = await db.fetchone("SELECT vm_now() AS t")
        assert row is not None
        now = float(row[0])
        row = await db.fetchone("SELECT generation FROM org_webhook_secrets WHERE org=?",
                                (org,))
        number = (int(row[0]) if row is not None else 0) + 1
        await db.execute(
            "INSERT INTO org_webhook_secrets(org, generation, rotated_at) VALUES (?,?,?)"
            " ON CONFLICT(org) DO UPDATE SET generation=excluded.generation,"
            " rotated_at=excluded.rotated_at", (org, number, now))
        await ledger.append(db, ROTATED, actor, org, {"generation": number}, org=org)
    return Generation(number, now)


async def generations(store: Store) -> dict[str, Generation]:
    """Every rotated org's generation (a few rows: orgs never rotated have none)."""
    rows = await store.fetchall(_READ)
    return {r[0]: Generation(int(r[1]), float(r[2]), float(r[3])) for r in rows}


async def generation(store: Store, org: str) -> Generation:
    row = await store.fetchone(_READ + " WHERE org=?", (org.lower(),))
    return NEVER_ROTATED if row is None else Generation(int(row[1]), float(row[2]),
                                                        float(row[3]))


_READ = "SELECT org, generation, rotated_at, vm_now()-rotated_at AS age FROM org_webhook_secrets"
