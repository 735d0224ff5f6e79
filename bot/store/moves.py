"""Mail moves in the order they happened on the forge (issue 28).

Deliveries are handled in the order they arrive, which is not always the order their changes
were made: a reply comment whose webhook came late (dropped, then redelivered) must not reopen
a mail closed after it. Each state move carries the forge time it happened at (the comment's
or event's timestamp, or the answer to the app's own write), and `mail_moves` keeps the
latest applied per mail; a move older than it is refused. Times are the forge's clock (GitHub
gives whole seconds): two moves in one second both apply, in the order handled.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from bot.store.db import Connection, Store, register_schema
from bot.store.sql import greatest

VERSION = 7

register_schema("""
CREATE TABLE IF NOT EXISTS mail_moves (
    mail_id {text} PRIMARY KEY,
    forge_at {real} NOT NULL        -- the forge time of the mail's latest state move applied
);
""", version=VERSION)


def forge_time(value: Any) -> float | None:
    """A forge timestamp (`2026-12-04T18:02:35Z`, Gitea's `+01:00` form) as epoch seconds;
    None when there is none."""
    if not isinstance(value, str) or not value:
        return None
    try:
        return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def edited_since_written(posted: dict[str, Any]) -> bool:
    """Whether the forge shows a comment edited since it was written (its `updated_at` is not
    its `created_at`; one without a `created_at` counts as edited). Both stamps are to the
    second, so an edit within it goes unseen."""
    written = forge_time(posted.get("created_at"))
    return written is None or forge_time(posted.get("updated_at")) != written


async def is_stale(db: Connection, mail_id: str, at: float | None) -> bool:
    """Whether a move that happened at forge time `at` is older than the mail's latest
    applied move (read in the caller's transaction; None: a move of unknown time, never)."""
    if at is None:
        return False
    row = await db.fetchone("SELECT forge_at FROM mail_moves WHERE mail_id=?",
                            (mail_id,))
    return row is not None and at < float(row[0])


async def note(db: Connection, mail_id: str, at: float | None) -> None:
    """The mail moved at forge time `at` (in the caller's transaction); never back."""
    if at is None:
        return
    await db.execute("INSERT INTO mail_moves(mail_id, forge_at) VALUES (?,?)"
                     " ON CONFLICT(mail_id) DO UPDATE"
                     " SET forge_at=" + greatest("mail_moves.forge_at", "excluded.forge_at"),
                     (mail_id, at))


async def last_move(store: Store, mail_id: str) -> float | None:
    row = await store.fetchone("SELECT forge_at FROM mail_moves WHERE mail_id=?", (mail_id,))
    return float(row[0]) if row else None
