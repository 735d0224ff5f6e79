"""Who each office's config last named (schema version 20), so that a config that removes
someone revokes what they held in that office whichever replica reads it first, and however
long after the push: diffed against an earlier read kept in memory, a quiet office's push (its
config read again past `max_age`, or by a replica that had read it already) revoked nothing,
and the removed principal's tokens acted again once a config named them back.

Each member's forge account is also known by its id, the first one seen acting or signing in
with the login the config gave (`bind`): a login is a name its owner may give up, and someone
else may take it.

An office recorded for the first time revokes nothing (nothing to compare with); from then on
each new config is compared with the last one recorded, in one transaction under the office's
key: whoever it no longer names loses their API tokens and OAuth grants in the office; whoever
it gives another forge account loses their OAuth grants (they consent again as that account;
their API tokens were handed to the person, not to the account).

Whoever a config no longer names is also recorded as departed (schema version 39), with the
login they had, until a config names them again: the questions still waiting on them are
sent back from that record (`bot.items.service.Comments.left_office`), so a sweep cut off
part-way is finished by the next read of the config, on any replica, and a question asked of
them through a replica that has not read the config yet is refused or sent back.

The record follows the config the forge has, not the one a replica read last (schema version
41): every read of the config from the forge, changed for that replica or not, is applied, and
costs one read when the record already holds what it names (`office_members_read`: a digest of
the members it named, and when the read that recorded them began). Applied only on a text
changed for that replica, a config pushed back to the text a replica still held (lee removed,
then added back) was taken by that replica as nothing new, and lee stayed departed on every
replica. A read that began before the one recorded is not applied: it may hold a text older
than the one recorded (its answer came later than another replica's newer read; a push's read
begins after the push), and the forge's next read, on any replica, puts right what differs.
Those reads are ordered by the replicas' clocks, each recorded no later than the database's
clock says it is (`vm_now()`): one that is behind by s seconds has its reads skipped for s
seconds after another replica's, until a read of its own begins later; one that is ahead
outranks no later read (review r8: a read an hour ahead had frozen the record for the hour)."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

from bot.store import api_tokens, oauth
from bot.store.db import Store, register_schema
from bot.store.sql import Connection, Row, upsert

VERSION = 20

register_schema("""
CREATE TABLE IF NOT EXISTS office_members (
    org {text} NOT NULL,         -- the office (the org's login, lower case)
    principal {text} NOT NULL,
    login {text} NOT NULL,       -- the forge account the config gave them, lower case
    user_id {int},               -- that login's account, as the forge first said (bind)
    PRIMARY KEY (org, principal)
);
""", version=VERSION)

DEPARTED_VERSION = 39
register_schema("""
CREATE TABLE IF NOT EXISTS office_departed (
    org {text} NOT NULL,         -- the office (the org's login, lower case)
    principal {text} NOT NULL,   -- one a config named and names no more
    login {text} NOT NULL,       -- the login it gave them: the name people knew them by
    PRIMARY KEY (org, principal)
);
""", version=DEPARTED_VERSION)
_PUT_DEPARTED = upsert("office_departed", ["org", "principal", "login"], ["org", "principal"])

READ_VERSION = 41
register_schema("""
CREATE TABLE IF NOT EXISTS office_members_read (
    org {text} PRIMARY KEY,      -- the office (the org's login, lower case)
    digest {text} NOT NULL,      -- of the members the recorded config named (principal: login)
    read_at {real} NOT NULL      -- when that config's read from the forge began (wall clock)
);
""", version=READ_VERSION)
_PUT_READ = upsert("office_members_read", ["org", "digest", "read_at"], ["org"])
_GET_READ = "SELECT digest, read_at FROM office_members_read WHERE org=?"


@dataclass(frozen=True)
class Changed:
    removed: set[str] = field(default_factory=set)
    relogged: set[str] = field(default_factory=set)
    revoked: int = 0


def _digest(named: dict[str, str]) -> str:
    return hashlib.sha256(repr(sorted(named.items())).encode()).hexdigest()


def _applies(row: Row | None, digest: str, read_at: float) -> bool:
    """Whether a config naming `digest`'s members, read from `read_at`, changes the record
    `row` (None: none yet): it names others, and its read is not older (see the module)."""
    return row is None or (row["digest"] != digest and float(row["read_at"]) <= read_at)


async def apply(store: Store, org: str, named: dict[str, str], read_at: float) -> Changed:
    """Record `named` (principal: login), as a config read from the forge from `read_at`
    (time.time()) names them, as `org`'s members, revoking what the last recorded config's
    members lost (see the module). One read when the record names them already, or holds a
    later read's."""
    org = org.lower()
    named = {principal: login.lower() for principal, login in named.items()}
    digest = _digest(named)
    if not _applies(await store.fetchone(_GET_READ, (org,)), digest, read_at):
        return Changed()
    async with store.transaction(f"office-members:{org}") as db:
        # never later than the database's clock: one read by a replica whose clock ran
        # ahead would otherwise outrank every read until the clocks caught up (review r8)
        now = await db.fetchone("SELECT vm_now() AS t")
        read_at = min(read_at, float(now["t"])) if now else read_at
        if not _applies(await db.fetchone(_GET_READ, (org,)), digest, read_at):
            return Changed()  # (another replica's read, recorded meanwhile)
        await db.execute(_PUT_READ, (org, digest, read_at))
        rows = await db.fetchall("SELECT principal, login FROM office_members WHERE org=?",
                                 (org,))
        was = {r["principal"]: r["login"] for r in rows}
        if was == named:
            return Changed()
        removed = set(was) - set(named)
        relogged = {p for p, login in named.items() if p in was and was[p] != login}
        revoked = 0
        for principal in sorted(removed):
            revoked += await api_tokens.revoke_in(db, principal, org)
        for principal in sorted(removed | relogged):
            revoked += await oauth.revoke_in(db, principal, org)
        for principal in sorted(removed):
            await db.execute("DELETE FROM office_members WHERE org=? AND principal=?",
                             (org, principal))
            await db.execute(_PUT_DEPARTED, (org, principal, was[principal]))
        for principal, login in sorted(named.items()):
            if principal not in was:
                await db.execute("INSERT INTO office_members(org, principal, login)"
                                 " VALUES (?,?,?)", (org, principal, login))
                await db.execute("DELETE FROM office_departed WHERE org=? AND principal=?",
                                 (org, principal))  # (back in the office)
            elif principal in relogged:  # another account: known by its id when next seen
                await db.execute("UPDATE office_members SET login=?, user_id=NULL"
                                 " WHERE org=? AND principal=?", (login, org, principal))
    return Changed(removed, relogged, revoked)


async def departed(store: Store, org: str) -> dict[str, str]:
    """Those `org`'s recorded configs named once and name no more: principal: login then."""
    rows = await store.fetchall("SELECT principal, login FROM office_departed WHERE org=?",
                                (org.lower(),))
    return {r["principal"]: r["login"] for r in rows}


async def bind(store: Store, org: str, principal: str, login: str, user_id: int) -> bool:
    """Whether the forge account `user_id`, signed in or acting as `login`, is the one the
    office's `principal` has: the first account seen with that login since the config gave it
    is theirs from then on (bound), and another account with the same login later is not (a
    login renamed away and taken by someone else). True when the office's members are not
    recorded yet (nothing to go by)."""
    org, login = org.lower(), login.lower()
    query = "SELECT login, user_id FROM office_members WHERE org=? AND principal=?"
    row = await store.fetchone(query, (org, principal))
    if row is not None and row["login"] == login and row["user_id"] is None:
        async def bound(db: Connection) -> Row | None:  # (bound once: a read after that)
            await db.execute("UPDATE office_members SET user_id=? WHERE org=? AND principal=?"
                             " AND login=? AND user_id IS NULL",
                             (user_id, org, principal, login))
            return await db.fetchone(query, (org, principal))

        # in the one writer's next trip, beside what others hand in meanwhile: each office's
        # first deliveries bind their members, and a transaction of its own waited ~110 ms
        # p50 for the writer at 50 installations (bench.probot_compare, BENCH_TRACE)
        row = await store.run_transaction(bound)
    if row is None or row["login"] != login:
        return True  # (a config not recorded yet, or one this check is older than)
    return row["user_id"] is None or int(row["user_id"]) == user_id
