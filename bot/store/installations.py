"""Which organisations the App is installed on, as every replica learns it.

A webhook is handled by one replica, but every replica serves tool calls: an uninstall (or a
suspension) is written here, so the replicas that did not handle it refuse the org's calls at
once instead of serving it until their cached installation token expires.
"""

from __future__ import annotations

import time

from bot.store.db import Store, register_schema

register_schema("""
CREATE TABLE IF NOT EXISTS installations (
    org {text} PRIMARY KEY,
    installation_id {int} NOT NULL,
    removed_at {real}
);
""", version=4)


async def installed(store: Store, org: str, installation_id: int) -> None:
    """The App is (again) installed on `org` as `installation_id`."""
    async with store.transaction() as db:
        await db.execute(
            "INSERT INTO installations(org, installation_id, removed_at) VALUES (?,?,NULL)"
            " ON CONFLICT(org) DO UPDATE SET installation_id=excluded.installation_id,"
            " removed_at=NULL", (org.lower(), installation_id))


async def removed(store: Store, org: str, installation_id: int) -> None:
    """The App was uninstalled from (or suspended on) `org`."""
    async with store.transaction() as db:
        await db.execute(
            "INSERT INTO installations(org, installation_id, removed_at) VALUES (?,?,?)"
            " ON CONFLICT(org) DO UPDATE SET removed_at=excluded.removed_at"
            " WHERE installations.installation_id=excluded.installation_id",
            (org.lower(), installation_id, time.time()))


async def is_removed(store: Store, org: str, installation_id: int) -> bool:
    """Whether this installation of `org` was removed (by whichever replica heard of it)."""
    row = await store.fetchone(
        "SELECT 1 FROM installations WHERE org=? AND installation_id=? AND removed_at IS NOT NULL",
        (org.lower(), installation_id))
    return row is not None


async def live_orgs(store: Store) -> list[str]:
    """The organisations the App is installed on, as this index last heard."""
    rows = await store.fetchall("SELECT org FROM installations WHERE removed_at IS NULL"
                                " ORDER BY org")
    return [str(r["org"]) for r in rows]
