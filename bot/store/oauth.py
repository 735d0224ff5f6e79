"""The MCP endpoint's OAuth 2.1 authorisation server in the index (`bot.tools.oauth_server`):
the clients that registered themselves (RFC 7591), and every value it hands out: an
authorisation request waiting for the person's consent, a code, an access token, a refresh
token. Only the SHA-256 of a value is kept (as for API tokens and console sessions); each row
says the kind, the grant it belongs to (everything one consent led to: a code replayed, or a
refresh token used twice, revokes the whole grant), the client, the person and the office it
acts for, the resource (RFC 8707) it is for, and when it expires, was used and was revoked.

A grant (`oauth_consents`) is the person's consent itself: it ends thirty days after it was
given, however often its refresh tokens were used, and is revoked as a whole (a replay, the
person removed from the office: `revoke_principal`). Every change to a grant's rows (a code or
refresh token spent and its successors kept, a revocation) is one transaction holding the
grant's key, and no value is added to a revoked or ended grant; a value's check reads its
grant's state too, so nothing issued to a grant outlives the grant.
"""

from __future__ import annotations

import enum
import hashlib
import json
import time
from dataclasses import dataclass
from typing import Any

from bot.store.db import Connection, Row, Store, register_columns, register_schema

VERSION = 10

register_schema("""
CREATE TABLE IF NOT EXISTS oauth_clients (
    client_id {text} PRIMARY KEY,
    name {text} NOT NULL,
    redirect_uris {text} NOT NULL,  -- JSON list, matched exactly (a loopback one: any port)
    metadata {text} NOT NULL,       -- the registration as answered (JSON)
    created_at {real} NOT NULL,
    registered_from {text}          -- the address it registered from (a cap per hour)
);
CREATE INDEX IF NOT EXISTS oauth_clients_from ON oauth_clients(registered_from, created_at);
CREATE TABLE IF NOT EXISTS oauth_consents (
    grant_id {text} PRIMARY KEY,    -- what one consent led to
    client_id {text} NOT NULL,
    principal {text} NOT NULL,      -- the person who allowed it
    org {text} NOT NULL,            -- the office it acts in
    created_at {real} NOT NULL,
    expires_at {real} NOT NULL,     -- absolute: the consent's time and thirty days
    revoked_at {real}
);
CREATE INDEX IF NOT EXISTS oauth_consents_person ON oauth_consents(principal, org);
CREATE INDEX IF NOT EXISTS oauth_consents_client ON oauth_consents(client_id);
CREATE INDEX IF NOT EXISTS oauth_consents_expiry ON oauth_consents(expires_at);
CREATE TABLE IF NOT EXISTS oauth_grants (
    value_hash {text} PRIMARY KEY,  -- SHA-256 of the request id, code or token
    kind {text} NOT NULL,           -- request, code, access or refresh
    grant_id {text} NOT NULL,       -- its consent (oauth_consents), once given
    client_id {text} NOT NULL,
    principal {text},               -- the person (not yet known for a request)
    org {text},                     -- the office it acts in
    resource {text} NOT NULL,       -- RFC 8707: the MCP endpoint it is for
    redirect_uri {text} NOT NULL,
    detail {text},                  -- a request's state and PKCE challenge; a code's challenge
    created_at {real} NOT NULL,
    expires_at {real} NOT NULL,
    used_at {real},
    revoked_at {real}
);
CREATE INDEX IF NOT EXISTS oauth_grants_grant ON oauth_grants(grant_id);
CREATE INDEX IF NOT EXISTS oauth_grants_expiry ON oauth_grants(expires_at);
CREATE INDEX IF NOT EXISTS oauth_grants_client ON oauth_grants(client_id);
""", version=VERSION)
register_columns("oauth_consents", {"login": "{text}"}, version=17)

KEPT_AFTER_EXPIRY = 86_400.0  # seconds an expired row is kept (a replay is still recognised)
SPENDABLE = ("code", "refresh")  # the values good once
ISSUED = ("code", "access", "refresh")  # what a consent leads to


def value_hash(value: str) -> str:
    return hashlib.sha256(value.encode()).hexdigest()


def grant_key(grant_id: str) -> str:
    """The transaction key of one grant's rows (`Store.transaction`)."""
    return f"oauth-grant:{grant_id}"


@dataclass(frozen=True)
class Grant:
    """One row: a value handed out, with its grant's state (None: no consent yet)."""

    kind: str
    grant_id: str
    client_id: str
    principal: str | None
    org: str | None
    resource: str
    redirect_uri: str
    detail: dict[str, Any]
    expires_at: float
    used_at: float | None
    revoked_at: float | None
    grant_expires_at: float | None = None
    grant_revoked_at: float | None = None
    # what the person was signed in to the console with when they allowed it: a forge login,
    # or an API token's hash (bot.console.visitor); None for a consent from before it was kept
    grant_login: str | None = None

    @classmethod
    def of(cls, row: Row) -> Grant:
        return cls(str(row["kind"]), str(row["grant_id"]), str(row["client_id"]),
                   row["principal"], row["org"], str(row["resource"]),
                   str(row["redirect_uri"]), json.loads(row["detail"] or "{}"),
                   float(row["expires_at"]), row["used_at"], row["revoked_at"],
                   row["grant_expires_at"], row["grant_revoked_at"], row["grant_login"])

    def live(self, now: float) -> bool:
        """Issued under a consent that still holds, itself neither revoked nor expired."""
        return (self.revoked_at is None and self.grant_revoked_at is None
                and self.grant_expires_at is not None
                and now < min(self.expires_at, self.grant_expires_at))


async def add_client(store: Store, client_id: str, name: str, redirect_uris: list[str],
                     metadata: dict[str, Any], now: float, *, source: str | None = None,
                     per_hour: int | None = None) -> float | None:
    """Keep a client's registration. With `per_hour`, at most that many from `source` (an
    address) within an hour: over it nothing is kept, and the answer is the seconds until
    one more is taken; None when it was kept."""
    async with store.transaction(f"oauth-register:{source}") as db:
        if per_hour is not None:
            recent = [float(r["created_at"]) for r in await db.fetchall(
                "SELECT created_at FROM oauth_clients WHERE registered_from=?"
                " AND created_at>? ORDER BY created_at DESC LIMIT ?",
                (source, now - 3600.0, per_hour))]
            if len(recent) >= per_hour:
                return max(1.0, recent[-1] + 3600.0 - now)
        await db.execute(
            "INSERT INTO oauth_clients(client_id, name, redirect_uris, metadata, created_at,"
            " registered_from) VALUES (?,?,?,?,?,?)",
            (client_id, name, json.dumps(redirect_uris), json.dumps(metadata), now, source))
    return None


@dataclass(frozen=True)
class Client:
    client_id: str
    name: str
    redirect_uris: list[str]
    grant_types: tuple[str, ...] = ("authorization_code", "refresh_token")  # registered


async def client(store: Store, client_id: str) -> Client | None:
    row = await store.fetchone("SELECT client_id, name, redirect_uris, metadata"
                               " FROM oauth_clients WHERE client_id=?", (client_id,))
    if row is None:
        return None
    # (the registration as answered: its grant_types checked then, the defaults when none)
    grants = json.loads(row["metadata"]).get("grant_types", Client.grant_types)
    return Client(str(row["client_id"]), str(row["name"]), list(json.loads(row["redirect_uris"])),
                  tuple(str(g) for g in grants))


async def _insert(db: Connection, values: list[tuple[str, str]], *, grant_id: str,
                  client_id: str, principal: str | None, org: str | None, resource: str,
                  redirect_uri: str, now: float, lifetimes: dict[str, float],
                  detail: dict[str, Any] | None, until: float | None) -> None:
    for kind, value in values:
        expires = now + lifetimes[kind]
        await db.execute(
            "INSERT INTO oauth_grants(value_hash, kind, grant_id, client_id, principal,"
            " org, resource, redirect_uri, detail, created_at, expires_at)"
            " VALUES (?,?,?,?,?,?,?,?,?,?,?)",
            (value_hash(value), kind, grant_id, client_id, principal, org, resource,
             redirect_uri, json.dumps(detail) if detail else None, now,
             expires if until is None else min(expires, until)))


async def _live_until(db: Connection, grant_id: str, now: float) -> float | None:
    """Inside the grant's transaction: when its consent ends, or None if it has (revoked,
    expired, or never given)."""
    row = await db.fetchone("SELECT expires_at, revoked_at FROM oauth_consents WHERE grant_id=?",
                            (grant_id,))
    if row is None or row["revoked_at"] is not None or float(row["expires_at"]) <= now:
        return None
    return float(row["expires_at"])


async def add(store: Store, values: list[tuple[str, str]], *, grant_id: str, client_id: str,
              principal: str | None, org: str | None, resource: str, redirect_uri: str,
              now: float, lifetimes: dict[str, float],
              detail: dict[str, Any] | None = None) -> bool:
    """Keep `values` ((kind, value) pairs) of one grant, in one transaction. A request needs
    no consent; anything else is refused (False) when its grant is revoked or has ended, and
    expires with the grant at the latest."""
    async with store.transaction(grant_key(grant_id)) as db:
        until = None
        if any(kind != "request" for kind, _ in values):
            until = await _live_until(db, grant_id, now)
            if until is None:
                return False
        await _insert(db, values, grant_id=grant_id, client_id=client_id, principal=principal,
                      org=org, resource=resource, redirect_uri=redirect_uri, now=now,
                      lifetimes=lifetimes, detail=detail, until=until)
    return True


async def allow(store: Store, code: str, *, grant_id: str, client_id: str, principal: str,
                org: str, resource: str, redirect_uri: str, now: float,
                lifetimes: dict[str, float], detail: dict[str, Any] | None = None,
                login: str | None = None) -> None:
    """The person's consent, given signed in with `login`: a new grant, lasting
    `lifetimes["grant"]` from now whatever is refreshed, and its code."""
    async with store.transaction(grant_key(grant_id)) as db:
        until = now + lifetimes["grant"]
        await db.execute(
            "INSERT INTO oauth_consents(grant_id, client_id, principal, org, created_at,"
            " expires_at, login) VALUES (?,?,?,?,?,?,?)",
            (grant_id, client_id, principal, org.lower(), now, until, login))
        await _insert(db, [("code", code)], grant_id=grant_id, client_id=client_id,
                      principal=principal, org=org.lower(), resource=resource,
                      redirect_uri=redirect_uri, now=now, lifetimes=lifetimes, detail=detail,
                      until=until)


async def find(store: Store, kind: str, value: str) -> Grant | None:
    """The row a value stands for (used, expired or revoked alike), with its grant's state,
    or None."""
    row = await store.fetchone(
        "SELECT g.*, c.expires_at AS grant_expires_at, c.revoked_at AS grant_revoked_at,"
        " c.login AS grant_login"
        " FROM oauth_grants g LEFT JOIN oauth_consents c ON c.grant_id=g.grant_id"
        " WHERE g.value_hash=? AND g.kind=?", (value_hash(value), kind))
    return Grant.of(row) if row is not None else None


async def use(store: Store, kind: str, value: str, now: float) -> bool:
    """Mark a value used: True for the one caller that used it first (a request is good
    once), False for every later one. (A code or refresh token: `exchange`.)"""
    async with store.transaction() as db:
        changed = await db.execute(
            "UPDATE oauth_grants SET used_at=? WHERE value_hash=? AND kind=? AND used_at IS NULL"
            " AND revoked_at IS NULL", (now, value_hash(value), kind))
        return changed == 1


class Spent(enum.Enum):
    """What `exchange` made of a code or refresh token."""

    ISSUED = "issued"  # spent now: its successors are kept
    REPLAYED = "replayed"  # spent before (or revoked): the whole grant is revoked now
    ENDED = "ended"  # spent now, but it, or its grant, had expired or was revoked


async def exchange(store: Store, held: Grant, value: str, new: list[tuple[str, str]], *,
                   now: float, lifetimes: dict[str, float],
                   replaces: tuple[str, ...] = ()) -> Spent:
    """Spend `value` (a code or refresh token, `held` its row) and keep `new` in its place,
    in one transaction holding the grant's key: of two callers with the same value one
    spends it, the other revokes the grant, and whichever comes second, nothing the first
    was given stays live. `replaces`: kinds of the grant's values revoked as `new` comes
    (a refresh's access tokens)."""
    async with store.transaction(grant_key(held.grant_id)) as db:
        changed = await db.execute(
            "UPDATE oauth_grants SET used_at=? WHERE value_hash=? AND kind=? AND used_at IS NULL"
            " AND revoked_at IS NULL", (now, value_hash(value), held.kind))
        if changed != 1:
            await _revoke(db, held.grant_id, now)
            return Spent.REPLAYED
        until = await _live_until(db, held.grant_id, now)
        if until is None or held.expires_at <= now:
            return Spent.ENDED
        if replaces:
            marks = ",".join("?" for _ in replaces)
            await db.execute(
                f"UPDATE oauth_grants SET revoked_at=? WHERE grant_id=? AND kind IN ({marks})"
                " AND revoked_at IS NULL", (now, held.grant_id, *replaces))
        await _insert(db, new, grant_id=held.grant_id, client_id=held.client_id,
                      principal=held.principal, org=held.org, resource=held.resource,
                      redirect_uri=held.redirect_uri, now=now, lifetimes=lifetimes,
                      detail=None, until=until)
    return Spent.ISSUED


async def _revoke(db: Connection, grant_id: str, now: float) -> int:
    await db.execute("UPDATE oauth_consents SET revoked_at=? WHERE grant_id=?"
                     " AND revoked_at IS NULL", (now, grant_id))
    marks = ",".join("?" for _ in ISSUED)
    changed = await db.execute(
        f"UPDATE oauth_grants SET revoked_at=? WHERE grant_id=? AND kind IN ({marks})"
        " AND revoked_at IS NULL", (now, grant_id, *ISSUED))
    return changed


async def revoke_grant(store: Store, grant_id: str, now: float) -> int:
    """Revoke a grant, and every value it led to: how many of those were live."""
    async with store.transaction(grant_key(grant_id)) as db:
        return await _revoke(db, grant_id, now)


async def revoke_principal(store: Store, principal: str, org: str) -> int:
    """Revoke every grant `principal` gave in `org`'s office, and all they led to (someone
    removed from the office config: added back, they sign in again). The grants' own
    revocation is what a check reads, so a refresh under way meanwhile issues nothing live.
    Returns how many grants were revoked."""
    async with store.transaction() as db:
        return await revoke_in(db, principal, org)


async def revoke_in(db: Connection, principal: str, org: str) -> int:
    """`revoke_principal` inside the caller's transaction."""
    now = time.time()
    revoked = await db.execute(
        "UPDATE oauth_consents SET revoked_at=? WHERE principal=? AND org=?"
        " AND revoked_at IS NULL", (now, principal, org.lower()))
    marks = ",".join("?" for _ in ISSUED)
    await db.execute(
        f"UPDATE oauth_grants SET revoked_at=? WHERE principal=? AND org=?"
        f" AND kind IN ({marks}) AND revoked_at IS NULL",
        (now, principal, org.lower(), *ISSUED))
    return revoked
