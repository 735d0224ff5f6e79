"""Refusals to people outside the office: the first gets a reply, repeats for a while do not.

A stranger (a forge account that is not in the office) writing `/mail` or commands on a public
repository is refused; one reply tells them why. Their repeated attempts within `QUIET_FOR` are
refused quietly (ledgered, no comment), so ten attempts cost one comment, not ten.
"""

from __future__ import annotations

import time

from bot.store.db import Store, register_schema
from bot.store.offices import scoped

register_schema("""
CREATE TABLE IF NOT EXISTS stranger_replies (
    login {text} PRIMARY KEY,       -- scoped(org, login): one office's quiet, not every one's
    replied_at {real} NOT NULL,
    cause {text} NOT NULL
);
""")

QUIET_FOR = 24 * 3600.0  # seconds after a reply during which a stranger's refusals are quiet


def quiet_key(org: str, login: str) -> str:
    """The transaction key of `login`'s quiet period in office `org`."""
    return f"stranger:{scoped(org, login.lower())}"


async def may_reply(store: Store, login: str, cause: str, *, org: str,
                    now: float | None = None) -> bool:
    """Whether office `org` answers this refusal of `login` with a comment; claims the reply
    if so. Each office's quiet is its own (row and lock): one office's refusal of a login
    silences it nowhere else.

    `cause` names what is refused (the delivery): when that same cause is tried again (its
    reply failed, the worker retries), it may still reply; any other cause within `QUIET_FOR`
    of the reply may not."""
    at = time.time() if now is None else now
    key = scoped(org, login.lower())
    async with store.transaction(quiet_key(org, login)) as db:
        row = await db.fetchone("SELECT replied_at, cause FROM stranger_replies WHERE login=?",
                                (key,))
        if row is not None and at - float(row[0]) < QUIET_FOR:
            return str(row[1]) == cause
        await db.execute(
            "INSERT INTO stranger_replies(login, replied_at, cause) VALUES (?,?,?)"
            " ON CONFLICT(login) DO UPDATE SET replied_at=excluded.replied_at,"
            " cause=excluded.cause", (key, at, cause))
    return True
