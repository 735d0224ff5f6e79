"""Waiting made visible in the forge (issue 25, bot/items/waiting.py): for each repository and
each principal an outcome there waits on, the "Waiting on <who>" tracking issue the outcome is
shown blocked by. One tracker a person a repository, reused for every outcome and every wait,
so the forge's own view of the tracker ("blocking") lists what waits on them now.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from bot.items.threads import ThreadState
from bot.store.db import Connection, Store, register_schema
from bot.store.offices import org_of
from bot.store.sql import upsert

VERSION = 12

register_schema("""
CREATE TABLE IF NOT EXISTS waiting_trackers (
    repo {text} NOT NULL,           -- owner/name, lower-case: where the tracker and outcome are
    principal {text} NOT NULL,      -- who it says the outcomes wait on (human:..., agent:...)
    org {text} NOT NULL,
    number {int} NOT NULL,      -- the tracking issue
    issue_id {int} NOT NULL,    -- its id, as dependencies name it
    PRIMARY KEY (repo, principal)
);
""", version=VERSION)


@dataclass(frozen=True)
class Tracker:
    repo: str
    principal: str
    number: int
    issue_id: int


_PUT = upsert("waiting_trackers", ["repo", "principal", "org", "number", "issue_id"],
              ["repo", "principal"])


async def put(db: Connection, t: Tracker) -> None:
    await db.execute(_PUT, (t.repo, t.principal, org_of(t.repo), t.number, t.issue_id))


async def trackers(store: Store, repo: str) -> list[Tracker]:
    rows = await store.fetchall(
        "SELECT repo, principal, number, issue_id FROM waiting_trackers WHERE repo=?",
        (repo.lower(),))
    return [Tracker(r["repo"], r["principal"], r["number"], r["issue_id"]) for r in rows]


async def waiting_on(store: Store, scope: str, repo: str) -> set[str]:
    """Who the questions counting for `scope` wait on while unanswered, of those on items in
    `repo` (the outcome's: whoever reads it on the forge reads them too)."""
    rows = await store.fetchall(
        "SELECT item, state FROM threads WHERE scope=? AND is_question=1 AND open=1", (scope,))
    out: set[str] = set()
    for r in rows:
        if str(r["item"]).lower().partition("#")[0] != repo.lower():
            continue
        s = ThreadState.from_json(json.loads(r["state"]))
        if s.answer is None:
            out.update(s.waiting_on)
    return out
