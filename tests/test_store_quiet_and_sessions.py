"""Console sessions and strangers' quiet periods, each one office's (review of issue 22): a
sign-in touches no other office's sessions (expired ones are refused when read and deleted by
the prune), and a stranger refused by one office is still answered by another."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from bot.store import open_store, sessions, strangers
from bot.store.db import Store
from bot.store.prune import DAY, prune

NOW = 2_000_000_000.0


@pytest.fixture
async def store(tmp_path: Path, database_url: str) -> AsyncIterator[Store]:
    opened = await open_store(database_url or tmp_path / "index.sqlite3")
    try:
        yield opened
    finally:
        await opened.close()


async def test_an_expired_session_is_refused_then_pruned(store: Store) -> None:
    await sessions.add_session(store, "old", "human:x", "acme", "x", "gh", "c", NOW - 100,
                               NOW - 50)
    await sessions.add_session(store, "new", "human:y", "globex", "y", "gh", "c", NOW,
                               NOW + 3600)
    assert await sessions.live_session(store, "old", NOW) is None
    assert await sessions.live_session(store, "new", NOW) is not None
    assert (await prune(store, now=NOW, keep=7 * DAY))["console_sessions"] == 1
    assert [r["id_hash"] for r in await store.fetchall(
        "SELECT id_hash FROM console_sessions")] == ["new"]


async def test_a_stranger_refused_by_one_office_is_still_answered_by_another(
        store: Store) -> None:
    """acme's refusal of `troll` quiets troll in acme for QUIET_FOR, not in globex (found by
    review: the quiet was keyed by the login alone, across every office)."""
    assert await strangers.may_reply(store, "Troll", "d1", org="acme", now=NOW)
    assert not await strangers.may_reply(store, "troll", "d2", org="ACME", now=NOW + 1)
    assert await strangers.may_reply(store, "troll", "d3", org="globex", now=NOW + 2)
    assert not await strangers.may_reply(store, "troll", "d4", org="globex", now=NOW + 3)
    assert {r["login"] for r in await store.fetchall("SELECT login FROM stranger_replies")} \
        == {"acme/troll", "globex/troll"}
