"""Chats (`bot.tools.chat_tools`): a person's quick questions to an agent, kept in the index
only."""

from __future__ import annotations

import time
from dataclasses import dataclass

from bot.store.db import Connection, Row, Store, register_schema
from bot.store.offices import next_number, number_as_was, numbered_per_office

register_schema("""
CREATE TABLE IF NOT EXISTS chats (
    id {id},
    agent {text} NOT NULL,
    sender {text} NOT NULL,
    message {text} NOT NULL,
    created_at {real} NOT NULL,
    answer {text},
    answered_at {real}
);
CREATE INDEX IF NOT EXISTS chats_agent ON chats(agent, answered_at);
""")
numbered_per_office("chats", "number", "id")  # the number a chat goes by (`chat:N`)
# a chat of this number: one a replica of the release before wrote (a rolling deploy) has none
# until the office's next is numbered, and goes by its id meanwhile, as that release showed it
_NUMBERED = "(number=? OR (number IS NULL AND id=?))"


def number_of(row: Row) -> int:
    """The number a chat goes by (see _NUMBERED)."""
    return int(row["number"] if row["number"] is not None else row["id"])


async def get_chat(store: Store, number: int, *, org: str) -> Row | None:
    """`org`'s chat of this number, or None (another office's chat is none of its own)."""
    return await store.fetchone(f"SELECT * FROM chats WHERE org=? AND {_NUMBERED}",
                                (org.lower(), number, number))


async def waiting_for(store: Store, agent: str, *, org: str) -> list[Row]:
    """The chats to `agent` of `org` not answered yet, oldest first."""
    return await store.fetchall(
        "SELECT * FROM chats WHERE org=? AND agent=? AND answered_at IS NULL ORDER BY id",
        (org.lower(), agent))


# the chats still waiting for an answer, as the caps on them count (`waiting_counts`): a
# count reads the office's waiting chats of the hour only, never every chat it ever had
register_schema("CREATE INDEX IF NOT EXISTS chats_waiting ON chats(org, created_at)"
                " WHERE answered_at IS NULL", version=40)


@dataclass(frozen=True)
class Waiting:
    """How many chats started after a time wait for an answer, and when the oldest of them
    was started (None: none wait), in three scopes: one person's (to any agent), one agent's,
    and the whole office's."""

    person: int
    person_oldest: float | None
    agent: int
    agent_oldest: float | None
    office: int
    office_oldest: float | None


async def waiting_counts(db: Connection, agent: str, sender: str, *, org: str,
                         since: float) -> Waiting:
    """The chats of `org` started after `since` that wait for an answer (one statement):
    `sender`'s to any agent, everyone's to `agent`, and all of them."""
    row = await db.fetchone(
        "SELECT count(*) AS office, min(created_at) AS office_oldest,"
        " coalesce(sum(CASE WHEN sender=? THEN 1 ELSE 0 END), 0) AS person,"
        " min(CASE WHEN sender=? THEN created_at END) AS person_oldest,"
        " coalesce(sum(CASE WHEN agent=? THEN 1 ELSE 0 END), 0) AS agent,"
        " min(CASE WHEN agent=? THEN created_at END) AS agent_oldest"
        " FROM chats WHERE org=? AND answered_at IS NULL AND created_at>?",
        (sender, sender, agent, agent, org.lower(), since))
    if row is None:
        return Waiting(0, None, 0, None, 0, None)
    return Waiting(int(row["person"]), row["person_oldest"], int(row["agent"]),
                   row["agent_oldest"], int(row["office"]), row["office_oldest"])


async def add_chat(db: Connection, agent: str, sender: str, message: str,
                   created_at: float, *, org: str) -> int:
    """Keep a new chat of `org` in the caller's transaction (its number the office's next);
    returns its number."""
    org = org.lower()
    number = await next_number(db, "chats", "number", "id", org)
    row = await db.insert("INSERT INTO chats(agent, sender, message, created_at, org, number)"
                          " VALUES (?,?,?,?,?,?) RETURNING id",
                          (agent, sender, message, created_at, org, number))
    if number is None:  # (a rolling deploy: numbered as the release before numbers)
        return await number_as_was(db, "chats", "number", "id", row)
    return number


async def delete_chat(db: Connection, number: int, *, org: str) -> None:
    """Drop a chat, in the caller's transaction."""
    await db.execute(f"DELETE FROM chats WHERE org=? AND {_NUMBERED}",
                     (org.lower(), number, number))


async def answer_chat(store: Store, number: int, answer: str, *, org: str) -> int:
    """Set the chat's answer (timed now) unless it has one; returns the rows changed (0 or 1)."""
    async with store.transaction() as db:
        # Conditional: of two replies racing, only the first lands.
        changed = await db.execute(f"UPDATE chats SET answer=?, answered_at=? WHERE org=?"
                                   f" AND {_NUMBERED} AND answered_at IS NULL",
                                   (answer, time.time(), org.lower(), number, number))
        return changed


async def chat_parties(store: Store, number: int, *, org: str | None) -> Row | None:
    """The (agent, sender, org) row of `org`'s chat of this number, or None."""
    return await store.fetchone(f"SELECT agent, sender, org FROM chats WHERE org=? AND"
                                f" {_NUMBERED}", (org.lower() if org else None, number, number))


async def chats_between(store: Store, sender: str, agent: str,
                        limit: int, *, org: str) -> list[Row]:
    """The latest `limit` chats `sender` started with `agent` in `org`, newest first."""
    return await store.fetchall(
        "SELECT * FROM chats WHERE org=? AND sender=? AND agent=? ORDER BY id DESC LIMIT ?",
        (org.lower(), sender, agent, limit))


async def answered_stamp(store: Store, sender: str, *, org: str) -> Row | None:
    """How many of `sender`'s chats in `org` are answered (`n`) and the latest answer's time
    (`at`)."""
    return await store.fetchone(
        "SELECT COUNT(answered_at) AS n, MAX(answered_at) AS at FROM chats WHERE org=?"
        " AND sender=?", (org.lower(), sender))
