"""The console's sign-in sessions and what a person set aside in it, in the index.

A session is a random value in an HTTP-only cookie; the index keeps only its SHA-256 (as for API
tokens), the principal it signed in, the office's org, a CSRF token for its forms, and a flash
message for the next page. Deferred cards are kept per principal, not per session, so a card
set aside on the phone is set aside on the laptop too.
"""

from __future__ import annotations

import hashlib
import json
import secrets
import time
from dataclasses import dataclass

from bot.store import Store
from bot.store import sessions as db

LIFETIME = 8 * 3600.0  # seconds a session lasts (a forge user token lasts as long on GitHub)


def _hash(value: str) -> str:
    return hashlib.sha256(value.encode()).hexdigest()


@dataclass(frozen=True)
class Session:
    id_hash: str
    principal: str
    org: str | None  # None: a session from before sign-in pinned a token (`visitor` ends it)
    login: str
    via: str  # "forge" (the OAuth web flow) or "token" (an API token)
    csrf: str
    flash: dict[str, str] | None
    expires_at: float


async def create(store: Store, principal: str, org: str, login: str,
                 via: str) -> tuple[str, Session]:
    """A new session: the cookie's value (shown once, to the browser) and the session."""
    value = secrets.token_urlsafe(32)
    now = time.time()
    session = Session(_hash(value), principal, org, login, via, secrets.token_urlsafe(24),
                      None, now + LIFETIME)
    await db.add_session(store, session.id_hash, principal, org, login, via, session.csrf, now,
                         session.expires_at)
    return value, session


async def get(store: Store, value: str) -> Session | None:
    """The live session a cookie's value stands for, or None."""
    row = await db.live_session(store, _hash(value), time.time())
    if row is None:
        return None
    flash = json.loads(row["flash"]) if row["flash"] else None
    return Session(row["id_hash"], row["principal"], row["org"], row["login"], row["via"],
                   row["csrf"], flash, row["expires_at"])


async def end(store: Store, session: Session) -> None:
    await db.delete_session(store, session.id_hash)


async def set_flash(store: Store, session: Session, flash: dict[str, str] | None) -> None:
    """What the next page says (the outcome of a form posted just before it)."""
    await db.set_flash(store, session.id_hash, json.dumps(flash) if flash else None)


async def defer(store: Store, principal: str, thread: str, *, org: str) -> None:
    await db.defer(store, principal, thread, org=org)


async def undefer(store: Store, principal: str, thread: str, *, org: str) -> None:
    await db.undefer(store, principal, thread, org=org)


async def deferred(store: Store, principal: str, *, org: str) -> dict[str, float]:
    """The threads `principal` of `org` set aside, with when."""
    rows = await db.deferred(store, principal, org=org)
    return {str(r["thread"]): float(r["deferred_at"]) for r in rows}
