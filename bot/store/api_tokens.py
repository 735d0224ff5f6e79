"""API tokens per principal: shown once, stored as SHA-256 hashes, revocable, last use kept."""

from __future__ import annotations

import hashlib
import secrets
import time
from collections.abc import Sequence
from dataclasses import dataclass

from bot.store.db import Connection, Store, register_columns, register_schema

register_schema("""
CREATE TABLE IF NOT EXISTS api_tokens (
    id {id},
    principal {text} NOT NULL,
    token_hash {text} NOT NULL UNIQUE,
    created_at {real} NOT NULL,
    last_used_at {real},
    revoked_at {real}
);
""")

register_columns("api_tokens", {"org": "{text}"})  # the office's org, when the token names one
# when a token stops acting (a run's: its timeout and a margin), so one whose revocation never
# came (the app killed mid-run, its command left running) does not act for good; NULL: never
register_columns("api_tokens", {"expires_at": "{real}"}, version=19)
# a run's token: what woke the run, a mail's id (mail its agent sends with it climbs the loop
# guard's hops from there, bot.mail.mailer) or a chat's `chat:<n>`; NULL: no run's token
register_columns("api_tokens", {"woken_by": "{text}"}, version=23)
_LIVE = "revoked_at IS NULL AND (expires_at IS NULL OR expires_at>?)"

PREFIX = "vm_"
LAST_USED_RESOLUTION = 60.0  # seconds: how fresh `last used` is kept


@dataclass(frozen=True)
class TokenInfo:
    id: int
    principal: str
    org: str | None  # its office (None: pinned to one at its first use)
    created_at: float
    last_used_at: float | None
    expires_at: float | None
    revoked: bool

    @property
    def run(self) -> bool:
        """A run's token (bot.app.runs): the only tokens made to expire."""
        return self.expires_at is not None

    def expired(self, now: float) -> bool:
        return self.expires_at is not None and self.expires_at <= now


def _hash(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


@dataclass(frozen=True)
class Owner:
    """Who a token acts for: a principal, in the office of `org` (None: the one office that
    has the principal)."""

    principal: str
    org: str | None = None
    woken_by: str | None = None  # a run's token: what woke the run (a mail's id, chat:<n>)


async def create_token(store: Store, principal: str, org: str | None = None, *,
                       lasts: float | None = None, woken_by: str | None = None) -> str:
    """A new token for `principal` (in `org`'s office); `lasts`: seconds it acts, at most;
    `woken_by`: the mail whose run it is for."""
    token = PREFIX + secrets.token_urlsafe(32)
    async with store.transaction() as db:
        await db.execute(_INSERT, _row(principal, token, org, time.time(), lasts, woken_by))
    return token


async def create_tokens(store: Store, principals: Sequence[str],
                        org: str | None = None) -> dict[str, str]:
    """A new token for each of `principals` (in `org`'s office), in one statement: an office's
    first start makes one for everyone in it (bot.app.embedded)."""
    made = {p: PREFIX + secrets.token_urlsafe(32) for p in principals}
    now = time.time()
    async with store.transaction() as db:
        await db.executemany(_INSERT, [_row(p, token, org, now, None, None)
                                       for p, token in made.items()])
    return made


_INSERT = ("INSERT INTO api_tokens(principal, token_hash, created_at, org, expires_at, woken_by)"
           " VALUES (?,?,?,?,?,?)")


def _row(principal: str, token: str, org: str | None, now: float, lasts: float | None,
         woken_by: str | None) -> tuple[str, str, float, str | None, float | None, str | None]:
    # lowercase, as every org column: revoke_principal and pin_office compare so
    return (principal, _hash(token), now, org.lower() if org else None,
            now + lasts if lasts is not None else None, woken_by)


async def principal_for(store: Store, token: str) -> str | None:
    """The principal a live token belongs to (and note its use), or None."""
    owner = await owner_of(store, token)
    return owner.principal if owner else None


async def owner_of(store: Store, token: str) -> Owner | None:
    """Who a live token acts for (and note its use), or None."""
    row = await store.fetchone(
        "SELECT id, principal, org, last_used_at, woken_by FROM api_tokens WHERE token_hash=?"
        " AND "
        + _LIVE, (_hash(token), time.time()))
    if row is None:
        return None
    now = time.time()
    if row["last_used_at"] is None or now - row["last_used_at"] > LAST_USED_RESOLUTION:
        # a write on every call would put every tool call in the write queue
        async with store.transaction() as db:
            await db.execute("UPDATE api_tokens SET last_used_at=? WHERE id=?",
                             (now, row["id"]))
    return Owner(str(row["principal"]), row["org"], row["woken_by"])


def token_hash(token: str) -> str:
    """What the index keeps of a token (a console session signed in with it keeps it too)."""
    return _hash(token)


async def known_hashes(store: Store, hashed: set[str]) -> set[str]:
    """Those of the token hashes `hashed` the index has a row of, live or not (a token revoked
    or expired is known: it is not made again)."""
    wanted = sorted(hashed)
    known: set[str] = set()
    for at in range(0, len(wanted), 500):  # (under every engine's limit on parameters)
        chunk = wanted[at:at + 500]
        rows = await store.fetchall("SELECT token_hash FROM api_tokens WHERE token_hash IN ("
                                    + ",".join("?" * len(chunk)) + ")", tuple(chunk))
        known.update(str(row["token_hash"]) for row in rows)
    return known


async def live_hashes(store: Store, hashed: set[str]) -> set[str]:
    """Those of the token hashes `hashed` whose tokens are still live: one read for many (the
    long polls one wake-up ends, `bot.tools.http._still_live`)."""
    live: set[str] = set()
    wanted = sorted(hashed)
    for at in range(0, len(wanted), 500):  # (under every engine's limit on parameters)
        chunk = wanted[at:at + 500]
        marks = ",".join("?" * len(chunk))
        rows = await store.fetchall(
            f"SELECT token_hash FROM api_tokens WHERE token_hash IN ({marks}) AND " + _LIVE,
            (*chunk, time.time()))
        live.update(str(row["token_hash"]) for row in rows)
    return live


async def live_hash(store: Store, hashed: str) -> bool:
    """Whether the token with this hash is still live (not revoked)."""
    row = await store.fetchone(
        "SELECT 1 AS live FROM api_tokens WHERE token_hash=? AND " + _LIVE,
        (hashed, time.time()))
    return row is not None


async def revoke_token(store: Store, token_id: int, *, org: str | None = None
                       ) -> TokenInfo | None:
    """Revoke the live token `token_id`, only if it is `org`'s office's when `org` is named.
    Returns it as it was (its `org` tells whether another office's was left alone), or None
    when no live token has that id."""
    async with store.transaction() as db:
        row = await db.fetchone("SELECT * FROM api_tokens WHERE id=? AND revoked_at IS NULL",
                                (token_id,))
        if row is None:
            return None
        if org is None or row["org"] == org.lower():
            await db.execute("UPDATE api_tokens SET revoked_at=? WHERE id=?",
                             (time.time(), token_id))
        return TokenInfo(row["id"], row["principal"], row["org"], row["created_at"],
                         row["last_used_at"], row["expires_at"], False)


async def revoke_token_value(store: Store, token: str) -> bool:
    """Revoke a token by its value (a run's own token, when the run ends)."""
    async with store.transaction() as db:
        changed = await db.execute(
            "UPDATE api_tokens SET revoked_at=? WHERE token_hash=? AND revoked_at IS NULL",
            (time.time(), _hash(token)),
        )
        return changed == 1


async def revoke_principal(store: Store, principal: str, org: str) -> int:
    """Revoke every live token of `principal` in `org`'s office: someone removed from an
    office config must not find their tokens alive again when they are added back (a token
    that names no office is pinned to one at its first use, `pin_office`; another office
    never revokes it). Returns how many were revoked."""
    async with store.transaction() as db:
        return await revoke_in(db, principal, org)


async def revoke_in(db: Connection, principal: str, org: str) -> int:
    """`revoke_principal` inside the caller's transaction."""
    return await db.execute("UPDATE api_tokens SET revoked_at=? WHERE principal=? AND org=?"
                            " AND revoked_at IS NULL", (time.time(), principal, org.lower()))


async def pin_office(store: Store, token: str, org: str) -> str:
    """A token that named no office acts in `org`'s from now on (its first use found it
    there): an office that later declares a principal of the same name can neither take it
    over nor make it ambiguous. The office it is pinned to: `org`, or the one another first
    use pinned it to before (the first written stands, on any replica)."""
    async with store.transaction() as db:
        await db.execute("UPDATE api_tokens SET org=? WHERE token_hash=? AND org IS NULL",
                         (org.lower(), _hash(token)))
        row = await db.fetchone("SELECT org FROM api_tokens WHERE token_hash=?", (_hash(token),))
    return str(row["org"]) if row is not None and row["org"] is not None else org.lower()


async def list_tokens(store: Store, org: str | None = None) -> list[TokenInfo]:
    """Every token, or `org`'s office's only."""
    rows = await store.fetchall(
        "SELECT * FROM api_tokens ORDER BY id" if org is None else
        "SELECT * FROM api_tokens WHERE org=? ORDER BY id", () if org is None else (org.lower(),))
    return [TokenInfo(r["id"], r["principal"], r["org"], r["created_at"], r["last_used_at"],
                      r["expires_at"], r["revoked_at"] is not None) for r in rows]
