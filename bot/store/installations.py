"""Which organisations the App is installed on, as every replica learns it.

A webhook is handled by one replica, but every replica serves tool calls: an uninstall (or a
suspension) is written here, so the replicas that did not handle it refuse the org's calls at
once instead of serving it until their cached installation token expires, and serve an org
installed through another at once (`Services.follow_index`). A replica's start
writes what the forge lists (`listed`): what changed while no app ran counts (an installation
suspended or unsuspended then, its webhook not heard).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable

from bot.store.db import Store, register_columns, register_schema
from bot.store.hook_secrets import bind_names_in
from bot.store.offices import rename_in, retire_in
from bot.store.sql import Connection

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


# the account the operator's office file (VAULTMAIL_OFFICE) is for, by the org the file
# names: the file speaks for that org (its id), not for whoever holds the login later (an org
# deleted and made again under it; bot.office.source.OfficeSource). The login's binding
# (`bind_logins_in`, `outbound_allow_accounts`), copied here as the index records the login,
# for a replica of a release before, which reads this alone and binds it at the file's first
# serve; a row such a release wrote (the account first served) stands (version 45 bound the
# file at its first serve)
FILE_OFFICE = 45
register_schema("""
CREATE TABLE IF NOT EXISTS office_file_accounts (
    org {text} PRIMARY KEY,
    account_id {int} NOT NULL
);
""", version=FILE_OFFICE)


# the account the operator's entries naming an org by its login alone are for
# (VAULTMAIL_OUTBOUND_ALLOW's `acme=10.0.0.5`, VAULTMAIL_AGENT_COMMANDS's `acme:`,
# VAULTMAIL_SMTP_DOMAINS's `mail.acme.example=acme`; bot.names.Behalf): the first account the
# index recorded under the login (`bind_logins_in`), which is the org the operator knew, not
# whoever holds the login later (an org deleted or renamed, and the login taken, even while
# no app heard it). One row per login, for every login, named by a setting or not yet: the
# login means one account to the operator, so the settings cannot disagree about who the org
# is, and an entry written later is bound as one written before (the table is named for the
# setting that first needed it; version 49 bound a login at its entries' first use)
OUTBOUND_BOUND = 49
register_schema("""
CREATE TABLE IF NOT EXISTS outbound_allow_accounts (
    org {text} PRIMARY KEY,
    account_id {int} NOT NULL
);
""", version=OUTBOUND_BOUND)


async def bind_logins_in(db: Connection, orgs: Iterable[str]) -> None:
    """In the caller's transaction: each of `orgs` whose login is bound to no account yet
    (`outbound_allow_accounts`) is bound to the one the index has under it now, and the
    operator's office file naming it (`office_file_accounts`) to the login's account. Called
    before the index records another account (or login) for an org, so that a login it knew
    is bound to the account it knew first, and after, so that a login new to it is bound to
    the first it records; the row first written stands."""
    orgs = sorted({org.lower() for org in orgs})
    if not orgs:
        return
    among = f"org IN ({','.join('?' * len(orgs))})"
    await db.execute(
        "INSERT INTO outbound_allow_accounts(org, account_id) SELECT org, account_id"
        f" FROM installations WHERE account_id IS NOT NULL AND {among} AND org NOT IN"
        " (SELECT org FROM outbound_allow_accounts)"
        " ORDER BY org"  # (one order: two listings never deadlock)
        " ON CONFLICT(org) DO NOTHING", tuple(orgs))
    # (one binding: the file is the login's account, as the entries are)
    await db.execute(
        "INSERT INTO office_file_accounts(org, account_id) SELECT org, account_id"
        f" FROM outbound_allow_accounts WHERE {among} AND org NOT IN"
        " (SELECT org FROM office_file_accounts) ORDER BY org"
        " ON CONFLICT(org) DO NOTHING", tuple(orgs))


async def _first_account(store: Store, table: str, org: str, now: int) -> int:
    """The account `table` binds `org` to, `now` when none yet (bound now, whichever replica
    asks first: the row first written stands)."""
    async with store.transaction() as db:
        await db.execute(f"INSERT INTO {table}(org, account_id) VALUES (?,?)"
                         " ON CONFLICT(org) DO NOTHING", (org, now))
        got = await db.fetchone(f"SELECT account_id FROM {table} WHERE org=?", (org,))
    return int(got["account_id"]) if got is not None else now


async def login_entries_holder(store: Store, org: str, now: int) -> int:
    """The account the operator's entries naming `org` by its login are for: the first the
    index recorded under it (`bind_logins_in`); `now`, the account under `org` now, where
    none is bound (a row a replica of a release before wrote: bound to it from then)."""
    row = await store.fetchone("SELECT account_id FROM outbound_allow_accounts WHERE org=?",
                               (org.lower(),))
    if row is not None:
        return int(row["account_id"])
    return await _first_account(store, "outbound_allow_accounts", org.lower(), now)


async def file_office_holder(store: Store, named: str, org: str) -> tuple[int, int] | None:
    """Whether the office under `org` now is the org the operator's office file, which names
    `named`, is for: the first account the index recorded under `named` (`bind_logins_in`),
    under that login still or renamed since; or, for a row a release before wrote, the
    account the file was first served to. None when it is, or when `org`'s account is not
    known (nothing to tell apart by, as `installed`); else (the account the file is for, the
    account under `org` now)."""
    named, org = named.lower(), org.lower()
    row = await store.fetchone(
        "SELECT i.account_id AS now, COALESCE(f.account_id, o.account_id) AS bound"
        " FROM installations i LEFT JOIN office_file_accounts f ON f.org=?"
        " LEFT JOIN outbound_allow_accounts o ON o.org=? WHERE i.org=?", (named, named, org))
    if row is None or row["now"] is None:
        return None
    now = int(row["now"])
    bound = row["bound"]
    if bound is None:  # (a login no write of this release recorded: an index of before)
        bound = await _first_account(store, "office_file_accounts", named,
                                     await login_entries_holder(store, named, now))
    return None if int(bound) == now else (int(bound), now)


def archived_name(org: str, account_id: int) -> str:
    """Where an office whose name went to another account is kept (`~` is in no login)."""
    return f"{org.lower()}~{account_id}"


async def installed(store: Store, org: str, installation_id: int,
                    account_id: int | None = None) -> str | None:
    """The App is (again) installed on `org` as `installation_id`, by the account
    `account_id`. When the index knew `org` as another account's, that office is moved aside
    first (`offices.retire_in`), in the same transaction, and where it went is returned: the
    new owner's office starts empty, reads nothing of the old one's, and no token or grant of
    the old one acts in it. The operator's entries and office file naming `org` by its login
    stay the account's the index knew first (`bind_logins_in`)."""
    org = org.lower()
    async with store.transaction(f"installation:{org}") as db:
        await bind_logins_in(db, [org])  # (the account it knew, before another's)
        moved = await _retire_if_another(db, org, account_id)
        await db.execute(
            "INSERT INTO installations(org, installation_id, removed_at, account_id)"
            " VALUES (?,?,NULL,?) ON CONFLICT(org) DO UPDATE SET"
            " installation_id=excluded.installation_id, removed_at=NULL,"
            " account_id=COALESCE(excluded.account_id, installations.account_id)",
            (org, installation_id, account_id))
        await bind_logins_in(db, [org])  # (a login new to it: the first account recorded)
    return moved


async def _retire_if_another(db: Connection, org: str, account_id: int | None) -> str | None:
    """Under `org`'s key (`installation:{org}`): when the index knows `org` as another
    account's than `account_id`, that office is moved aside (`offices.retire_in`); where it
    went, or None (the same account, or none known: nothing to move)."""
    row = await db.fetchone("SELECT account_id FROM installations WHERE org=?", (org,))
    was = row["account_id"] if row is not None else None
    if was is None or account_id is None or int(was) == account_id:
        return None
    moved = archived_name(org, int(was))
    await retire_in(db, org, moved)
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


async def live_installation(store: Store, org: str) -> int | None:
    """`org`'s installation, when the index has it installed (whichever replica heard it)."""
    row = await store.fetchone("SELECT installation_id FROM installations WHERE org=?"
                               " AND removed_at IS NULL", (org.lower(),))
    return int(row["installation_id"]) if row is not None else None


async def live(store: Store) -> dict[str, int]:
    """{org: installation id} of every org the index has installed now, whichever replica
    heard of it."""
    return (await live_accounts(store))[0]


async def live_accounts(store: Store) -> tuple[dict[str, int], dict[str, int]]:
    """`live`, and {org: the account id its office was made for} of those orgs whose account
    is known (`accounts`, of the installed only), in one read."""
    rows = await store.fetchall("SELECT org, installation_id, account_id FROM installations"
                                " WHERE removed_at IS NULL")
    return ({str(r["org"]): int(r["installation_id"]) for r in rows},
            {str(r["org"]): int(r["account_id"]) for r in rows if r["account_id"] is not None})


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


async def account_of(store: Store, org: str) -> int | None:
    """The forge's id of the account `org`'s office was made for, when known: what stays the
    office's across a rename of its org (its login does not)."""
    row = await store.fetchone("SELECT account_id FROM installations WHERE org=?",
                               (org.lower(),))
    return int(row["account_id"]) if row is not None and row["account_id"] is not None \
        else None


# the orgs of an installation, in order: every `issues` delivery asks (`handlers.common`),
# each time a look-up in `installations_installation`, not a read of every installation
ORGS_OF_INSTALLATION = ("SELECT org FROM installations WHERE installation_id=?"
                        " AND removed_at IS NULL ORDER BY org")
register_schema("CREATE INDEX IF NOT EXISTS installations_installation"
                " ON installations(installation_id, org);", version=47)


async def orgs_of_installation(store: Store, installation_id: int) -> list[str]:
    """The orgs the index has `installation_id` installed on now (the rows follow their orgs'
    renames): one on GitHub; on Gitea, whose one bot is every org's "installation", all."""
    rows = await store.fetchall(ORGS_OF_INSTALLATION, (installation_id,))
    return [str(r["org"]) for r in rows]


def taken_over(known: dict[str, int], now: dict[str, int]) -> list[str]:
    """The orgs whose name another account has now (`now`: {org: account id}), once the
    renamed (`renamed_in`) are known by their new names: an org renamed away frees its name
    for anyone, whose office is a new one. A name an org was renamed into is that org's
    (what the index held under it is moved aside by the rename itself)."""
    renames = renamed_in(known, now)
    after = {org: account for org, account in known.items() if org not in renames}
    after |= {new: known[old] for old, new in renames.items()}
    return sorted(org for org, account in now.items()
                  if org in after and after[org] != account)


def renamed_in(known: dict[str, int], now: dict[str, int]) -> dict[str, str]:
    """{old login: new login} of the orgs the index knows (`known`: {org: account id}) whose
    account the forge lists under another login now (`now`), the old one not theirs now:
    the org renamed itself, and its office follows it (`renamed`). Follow them `in_order`."""
    by_account = {account: org for org, account in known.items()}
    return {by_account[account]: org for org, account in sorted(now.items())
            if account in by_account and by_account[account] != org
            and now.get(by_account[account]) != account}


def in_order(renames: dict[str, str]) -> list[tuple[str, str]]:
    """The renames ({old: new}) as steps taken one after another: the rename out of a name
    before the rename into it (an org takes the name another left; following the rename
    into it first would move the office still there aside as one whose org had left). Orgs
    that swapped names, or went round in a cycle, go through a name no forge gives first
    (`_aside`)."""
    left, steps = dict(renames), []
    while left:
        free = [old for old, new in sorted(left.items()) if new not in left]
        for old in free:
            steps.append((old, left.pop(old)))
        if not free:  # every one left is in a cycle: one steps aside, and the cycle opens
            old = min(left)
            steps.append((old, _aside(old)))
            left[_aside(old)] = left.pop(old)
    return steps


def _aside(org: str) -> str:
    """A name `org`'s office holds for a moment in a cycle of renames: a login neither
    GitHub (no '_') nor Gitea (no name ends in one) gives, and a valid key file name."""
    return org[:39] + "_"


async def held_elsewhere(store: Store, org: str, account_id: int) -> bool:
    """Whether the index has `org` installed as another account's than `account_id`: that
    account renamed its org too (`org` is ours now), its rename not heard yet."""
    row = await store.fetchone("SELECT account_id FROM installations WHERE org=?"
                               " AND removed_at IS NULL", (org.lower(),))
    return row is not None and row["account_id"] != account_id


async def rename(db: Connection, old: str, new: str) -> str | None:
    """In the caller's transaction, under both orgs' keys: the office of `old` is `new`'s
    now, its org renamed (`offices.rename_in`), and so is its installation row. What the
    index held under `new` for another account (an office whose org left that name before)
    is moved aside first, as when an installation names another account (`installed`);
    where it went is returned. The installation rows are written last: the offices' moves
    (long) hold no row a listing or a webhook of another org writes."""
    old, new = old.lower(), new.lower()
    row = await db.fetchone("SELECT account_id FROM installations WHERE org=?", (new,))
    moved = None
    if row is not None:
        moved = archived_name(new, int(row["account_id"] or 0))
        await retire_in(db, new, moved)
    await rename_in(db, old, new)
    if row is not None:
        await db.execute("DELETE FROM installations WHERE org=?", (new,))
    await db.execute("UPDATE installations SET org=? WHERE org=?", (new, old))
    return moved


async def renamed(store: Store, old: str, new: str, account_id: int) -> bool:
    """The org `old` renamed itself `new` (GitHub's `installation_target.renamed`): its
    office follows it (`rename`), when the index knows `old` as that account's. False when
    it does not (renamed already, or another account's): nothing moved."""
    done, moved = await _follow(store, old, new, account_id)
    if done:
        log.info("the organisation renamed itself: its office follows it",
                 extra={"org": new.lower(), "was": old.lower(), "kept_as": moved})
    return done


async def _follow(store: Store, old: str, new: str, account_id: int
                  ) -> tuple[bool, str | None]:
    """`renamed`'s move, a transaction of its own under both orgs' keys (it moves `new`'s
    office too, should the index hold one), checked under them: whether it moved, and where
    what `new` held went."""
    old, new = old.lower(), new.lower()
    if old == new:
        return False, None
    async with store.transaction(f"installation:{old}", f"installation:{new}") as db:
        row = await db.fetchone("SELECT account_id FROM installations WHERE org=?", (old,))
        if row is None or row["account_id"] not in (None, account_id):
            return False, None
        await bind_logins_in(db, [old, new])  # (the logins as it knew them, before the move)
        moved = await rename(db, old, new)
        await db.execute("UPDATE installations SET account_id=? WHERE org=?",
                         (account_id, new))
        await bind_logins_in(db, [new])  # (a login new to it: the renamed org's)
    return True, moved


async def known(store: Store) -> Known:
    """Every org's row as it stands (read before the forge's listing: see `listed`)."""
    rows = await store.fetchall("SELECT org, installation_id, removed_at FROM installations")
    return {str(r["org"]): (int(r["installation_id"]), r["removed_at"]) for r in rows}


async def listed(store: Store, live: dict[str, int], before: Known,
                 accounts_now: dict[str, int] | None = None) -> dict[str, int]:
    """Take the forge's listing (at start; on Gitea every few minutes, on every replica):
    `live` ({org: installation id}, suspended ones left out), listed after `before` was read.
    A row still as `before` saw it is made what the listing says (installed; removed if it
    was live and is not listed); a row a webhook changed meanwhile is newer than the
    listing, and kept. `accounts_now` ({org: account id}): an account the index knew under
    another login renamed its org, and the office follows it (`rename`); an org the index
    knew as another account's is another office now, the old one moved aside (see
    `installed`); the login entries (and office file) of each org stay bound to the account
    the index knew first, and a login new to it is bound to the account listed
    (`bind_logins_in`). Returns what is installed now.

    Each org's move is a transaction of its own under that org's key, as a webhook's is,
    and is made only if still due once the key is held (another replica's listing, or a
    webhook, may have made it); the listing itself is one short transaction after them. So
    one org's move (long: it rewrites the office's rows) holds up no other org's webhook,
    nor writes to another org's rows; and a stop between any two steps leaves what the next
    listing finds due and completes."""
    accounts_now = accounts_now or {}
    now = time.time()
    # an org that renamed itself meanwhile: its office follows it first, under its new name
    # before the listing is taken (the webhook saying so may never have come)
    whose = await accounts(store)
    renames = renamed_in(whose, accounts_now)  # (by their new names)
    for old, new in in_order(renames):  # (the rename out of a name before the one into it)
        whose[new] = whose.pop(old)
        done, moved = await _follow(store, old, new, whose[new])
        if done:
            log.warning("the organisation renamed itself while no app heard it: its office "
                        "follows it", extra={"org": new, "was": old, "kept_as": moved})
    # whose each org is: one the index knew as another account's is another office now
    # (see `installed`); the moved are said by the log
    whose = await accounts(store)
    for org, account in sorted(accounts_now.items()):
        if whose.get(org, account) == account:
            continue
        async with store.transaction(f"installation:{org}") as db:
            await bind_logins_in(db, [org])  # (the account it knew, before another's)
            moved = await _retire_if_another(db, org, account)
            if moved is not None:
                await db.execute("UPDATE installations SET account_id=? WHERE org=?",
                                 (account, org))
        if moved is not None:
            log.warning("installed by another account than the one its office was made "
                        "for: that office is kept aside, this one starts empty",
                        extra={"org": org, "kept_as": moved, "account_id": account})
    before = {org: row for org, row in before.items() if org not in renames} | {
        new: before[old] for old, new in renames.items() if old in before}
    # a row is as `before` saw it while its id and removed_at are (-1: none, or live)
    same = " installations.installation_id=? AND COALESCE(installations.removed_at, -1)=?"
    put, gone = [], []
    for org, inst in sorted(live.items()):  # (rows in one order: two listings never deadlock)
        was_id, was_removed = before.get(org, (inst, None))
        put.append((org, inst, was_id, -1 if was_removed is None else was_removed))
    for org, (was_id, was_removed) in sorted(before.items()):
        if was_removed is None and org not in live:
            gone.append((now, org, was_id, -1))
    async with store.transaction() as db:
        await db.executemany(
            "INSERT INTO installations(org, installation_id, removed_at) VALUES (?,?,NULL)"
            " ON CONFLICT(org) DO UPDATE SET installation_id=excluded.installation_id,"
            " removed_at=NULL WHERE" + same, put)
        await db.executemany(
            "UPDATE installations SET removed_at=? WHERE org=? AND" + same, gone)
        # the account of an org whose row names none yet (new here: no office to move)
        await db.executemany("UPDATE installations SET account_id=? WHERE org=?"
                             " AND account_id IS NULL", sorted(
                                 (account, org) for org, account in accounts_now.items()))
        await bind_logins_in(db, accounts_now)  # (the logins new to it: the first recorded)
        await bind_names_in(db, accounts_now)  # (its webhook secret of before: its own)
        rows = await db.fetchall(
            "SELECT org, installation_id FROM installations WHERE removed_at IS NULL")
    return {str(r["org"]): int(r["installation_id"]) for r in rows}
