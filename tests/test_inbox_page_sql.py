"""The inbox's question lists are cut in the query, with visibility a condition of it (issue 22,
`bench.inbox`): whatever the store hands back for a caller's inbox is at most a page of each
list, and nothing of a repository the caller cannot see, on both engines."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

from bot.items import inbox
from bot.items.questions import Option, Question
from bot.items.threads import Answer, ThreadState
from bot.office.config import load_office
from bot.store import comments as db
from bot.store import open_store

MARCO, SARA = "human:marco@acme.com", "human:sara@acme.com"
SHOWN, HIDDEN = "acme/shown", "acme/hidden"
MANY = inbox.PAGE + 15  # more than a page in each repository


def _question(tid: str, item: str, asker: str, waiting: tuple[str, ...], *,
              answered: bool = False) -> db.ThreadRow:
    state = ThreadState(
        asker=asker, members={asker: "personal", **{w: "personal" for w in waiting}},
        asked=waiting, waiting_on=waiting,
        question=Question(body="EU or US first?", header="Launch order",
                          options=(Option("EU first"), Option("US first"))),
        answer=Answer(comment="c1", by=SARA, at=1.7e9, option="EU first") if answered else None)
    return db.ThreadRow(tid, item, item, state, None, None, 1.7e9 if answered else None, 0.0)


async def test_only_a_page_of_what_the_caller_sees_leaves_the_database(
        tmp_path: Path, database_url: str) -> None:
    store = await open_store(database_url or tmp_path / "index.sqlite3")
    try:
        async with store.transaction() as tx:
            for n in range(MANY):  # written in order: the higher the number, the newer
                for repo in (HIDDEN, SHOWN):
                    item = f"{repo}#{n + 1}"
                    await db.put_thread(tx, _question(f"{repo}-turn-{n:03}", item, SARA,
                                                      (MARCO,)))
                    await db.put_thread(tx, _question(f"{repo}-asked-{n:03}", item, MARCO,
                                                      (SARA,), answered=n % 5 == 0))
        returned: list[Any] = []
        fetchall = store.fetchall

        async def spy(sql: Any, params: Any = ()) -> list[Any]:
            rows = await fetchall(sql, params)
            returned.extend(rows)
            return rows

        store.fetchall = spy  # type: ignore[method-assign]

        async def sees(refs: Iterable[str]) -> set[str]:  # acme/shown only, as the forge says
            return {r for r in refs if r.lower().startswith(SHOWN + "#")}

        computed = await inbox.compute(store, load_office(), MARCO, mark_you=False,
                                       mark_agents=False, sees=sees)
        you = computed.boxes["you"]
        unanswered = [n for n in range(MANY) if n % 5]
        assert [c["item"] for c in you["yourTurn"]] == [
            f"{SHOWN}#{n + 1}" for n in reversed(range(MANY))][:inbox.PAGE]
        assert you["moreYourTurn"] == MANY - inbox.PAGE
        assert computed.person_waiting == MANY  # the count is of what the caller can see
        assert [c["item"] for c in you["waitingOnOthers"]] == [
            f"{SHOWN}#{n + 1}" for n in reversed(unanswered)][:inbox.PAGE]
        assert you["moreWaitingOnOthers"] == len(unanswered) - inbox.PAGE
        # what left the database: no thread of the hidden repository (only its name, to ask
        # the forge whether the caller sees it), and a page of each list
        values = [str(v) for row in returned for v in tuple(row)]
        assert not [v for v in values if HIDDEN + "#" in v or HIDDEN + "-" in v], (
            "a hidden repository's threads left the database")
        threads = {v for v in values if v.startswith(SHOWN + "-")}
        assert len(threads) <= 2 * inbox.PAGE, len(threads)
    finally:
        await store.close()


async def test_an_index_at_version_14_gets_each_waiting_rows_office_and_repository(
        tmp_path: Path, empty_database_url: str) -> None:
    """Schema 15 puts each open question's office, repository and asker beside who it waits
    on: a question written at version 14 (under its triggers) is filled in when the index
    opens, so it is listed as before, and later writes keep the rows in step (both engines)."""
    import json

    from tests.support import older_index

    state = json.dumps(_question("old", "Acme/Shown#7", SARA, (MARCO,)).state.to_json())
    insert = ("INSERT INTO threads(id, item, scope, asker, is_question, open, state,"
              " updated_at, org) VALUES ('old', 'Acme/Shown#7', 'Acme/Shown#7', ?, 1, 1, ?,"
              " 1.0, 'acme')")
    target = await older_index(tmp_path, empty_database_url, 14, [(insert, (SARA, state))])
    store = await open_store(target)  # version 15: the backfill
    try:
        [row] = await store.fetchall("SELECT principal, org, repo, asker FROM thread_waiting")
        assert (row["principal"], row["org"], row["repo"], row["asker"]) == (
            MARCO, "acme", "acme/shown", SARA)
        assert await db.question_repos(store, [MARCO, SARA], org="acme") == ["acme/shown"]
        async with store.transaction() as tx:  # a later write: the triggers fill them
            await db.put_thread(tx, _question("new", "acme/other#2", MARCO, (SARA,)))
        pages = await db.inbox_questions(
            store, {"turn": (db.WAITING_ON, [MARCO]), "asked": (db.ASKED_BY, [MARCO]),
                    "theirs": (db.WAITING_ON, [SARA])},
            viewer=MARCO, repos=["acme/shown", "acme/other"], org="acme", limit=inbox.PAGE)
        assert [(t.id, p.total) for p in pages.values() for t in p.threads] == [
            ("old", 1), ("new", 1), ("new", 1)]
        hidden = await db.inbox_questions(store, {"turn": (db.WAITING_ON, [MARCO])},
                                          viewer=MARCO, repos=["acme/other"], org="acme",
                                          limit=inbox.PAGE)
        assert hidden["turn"].threads == [] and hidden["turn"].total == 0
    finally:
        await store.close()
