"""Which organisations the App is installed on, as every replica learns it.

A webhook is handled by one replica, but every replica serves tool calls: an uninstall (or a
suspension) is written here, so the replicas that did not handle it refuse the org's calls at
once instead of serving it until their cached installation token expires. A replica's start
writes what the forge lists (`listed`): what changed while no app ran counts (an installation
suspended or unsuspended then, its webhook not heard).
"""

from __future__ import annotations

import logging
import time

from bot.store.db import Store, register_columns, register_schema
from bot.store.offices import retire_in

log = logging.getLogger("vaultmail.installations")

register_schema("""
CREATE TABLE IF NOT EXISTS installations (
    org {text} PRIMARY KEY,
    installation_id {int} NOT NULL,
    removed_at {real}
);
""", version=4)


# the forge's id of the account that installed it: a name is not an identity (an org renamed
# or deleted frees its login, and another account may take it)
register_columns("installations", {"account_id": "{int}"}, version=20)


def archived_name(org: str, account_id: int) -> str:
    """Where an office whose name went to another account is kept (`~` is in no login)."""
    return f"{org.lower()}~{account_id}"


async def installed(store: Store, org: str, installation_id: int,
                    account_id: int | None = None) -> str | None:
    """The App is (again) installed on `org` as `installation_id`, by the account
    `account_id`. When the index knew `org` as another account's, that office is moved aside
    first (`offices.retire_in`), in the same transaction, and where it went is returned: the
    new owner's office starts empty, reads nothing of the old one's, and no token or grant of
    the old one acts in it."""
    org = org.lower()
    async with store.transaction(f"installation:{org}") as db:
        row = await db.fetchone("SELECT account_id FROM installations WHERE org=?", (org,))
        was = row["account_id"] if row is not None else None
        moved = None
        if was is not None and account_id is not None and int(was) != account_id:
            moved = archived_name(org, int(was))
            await retire_in(db, org, moved)
        await db.execute(
            "INSERT INTO installations(org, installation_id, removed_at, account_id)"
            " VALUES (?,?,NULL,?) ON CONFLICT(org) DO UPDATE SET"
            " installation_id=excluded.installation_id, removed_at=NULL,"
            " account_id=COALESCE(excluded.account_id, installations.account_id)",
            (org, installation_id, account_id))
    return moved


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


Known = dict[str, tuple[int, float | None]]  # org -> (installation id, removed_at)


async def accounts(store: Store) -> dict[str, int]:
    """{org: the account id its office was made for}, of the orgs whose account is known."""
    rows = await store.fetchall("SELECT org, account_id FROM installations"
                                " WHERE account_id IS NOT NULL")
    return {str(r["org"]): int(r["account_id"]) for r in rows}


def taken_over(known: dict[str, int], now: dict[str, int]) -> list[str]:
    """The orgs whose name another account has now (`now`: {org: account id})."""
    return sorted(org for org, account in now.items()
                  if org in known and known[org] != account)


async def known(store: Store) -> Known:
    """Every org's row as it stands (read before the forge's listing: see `listed`)."""
    rows = await store.fetchall("SELECT org, installation_id, removed_at FROM installations")
    return {str(r["org"]): (int(r["installation_id"]), r["removed_at"]) for r in rows}


async def listed(store: Store, live: dict[str, int], before: Known,
                 accounts: dict[str, int] | None = None) -> dict[str, int]:
    """Take the forge's listing at start: `live` ({org: installation id}, suspended ones
    left out), listed after `before` was read. A row still as `before` saw it is made what
    the listing says (installed; removed if it was live and is not listed); a row a webhook
    changed meanwhile is newer than the listing, and kept. `accounts` ({org: account id}): an
    org the index knew as another account's is another office now, the old one moved aside
    (see `installed`). Returns what is installed now."""
    now = time.time()
    # a row is as `before` saw it while its id and removed_at are (-1: none, or live)
    same = " installations.installation_id=? AND COALESCE(installations.removed_at, -1)=?"
    put, gone = [], []
    for org, inst in live.items():
        was_id, was_removed = before.get(org, (inst, None))
        put.append((org, inst, was_id, -1 if was_removed is None else was_removed))
    for org, (was_id, was_removed) in before.items():
        if was_removed is None and org not in live:
            gone.append((now, org, was_id, -1))
    async with store.transaction() as db:
        await db.executemany(
            "INSERT INTO installations(org, installation_id, removed_at) VALUES (?,?,NULL)"
            " ON CONFLICT(org) DO UPDATE SET installation_id=excluded.installation_id,"
            " removed_at=NULL WHERE" + same, put)
        await db.executemany(
            "UPDATE installations SET removed_at=? WHERE org=? AND" + same, gone)
        # whose each org is: one the index knew as another account's is another office now
        # (see `installed`); the moved are said by the log
        whose = {str(r["org"]): r["account_id"] for r in await db.fetchall(
            "SELECT org, account_id FROM installations")}
        for org, account in sorted((accounts or {}).items()):
            was = whose.get(org)
            if was == account:
                continue
            if was is not None:
                moved = archived_name(org, int(was))
                await retire_in(db, org, moved)
                log.warning("installed by another account than the one its office was made "
                            "for: that office is kept aside, this one starts empty",
                            extra={"org": org, "kept_as": moved, "account_id": account})
            await db.execute("UPDATE installations SET account_id=? WHERE org=? AND"
                             " (account_id IS NULL OR account_id<>?)", (account, org, account))
        rows = await db.fetchall(
            "SELECT org, installation_id FROM installations WHERE removed_at IS NULL")
    return {str(r["org"]): int(r["installation_id"]) for r in rows}
