"""Moving an office aside (bot.store.offices.retire_in), when its org's name went to another
account: nothing of it is left where the new office reads, whatever table or reference
holds it, and nothing chains onto it meanwhile."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import pytest

from bot.items.model import Item
from bot.store import chats, ledger, open_store
from bot.store import comments as db
from bot.store import outbound as cursors
from bot.store.idempotency import Settlement, claim_held_in, resumed
from bot.store.offices import _COLUMNS, _TEXT, rename_in, rename_vault_in, retire_in
from tests.support import until

HOOK = "https://hooks.acme.example/vaultmail"


async def test_nothing_of_the_old_office_is_left_where_the_new_one_reads(
        tmp_path: Path, database_url: str) -> None:
    """An item is keyed by its reference (acme/plans#1), a plan by its parent's, a question by
    the scope it waits in: the new owner of the name `acme` makes acme/plans and its issue #1,
    and read the old office's outcome, its plan, and its open question (review)."""
    store = await open_store(database_url or tmp_path / "index.sqlite3")
    try:
        async with store.transaction() as tx:
            await db.put_item(tx, Item("acme/plans", 1, "outcome", "Acquire globex (secret)",
                                       "open", "marco"))
            await db.put_item(tx, Item("acme/plans", 2, "plan", "Offer $40M", "open", "marco",
                                       parent="acme/plans#1"))
            await tx.execute(
                "INSERT INTO threads(id, item, scope, asker, is_question, open, state,"
                " updated_at, org) VALUES (?,?,?,?,?,?,?,?,?)",
                ("c1", "acme/plans#1", "acme/plans#1", "agent:scout", 1, 1,
                 json.dumps({"waiting_on": ["human:marco@acme.com"]}), time.time(), "acme"))
            await tx.execute("INSERT INTO mail_shown(principal, upto) VALUES (?,?)",
                             ("acme/agent:scout", 3))
            await tx.execute("INSERT INTO inbox_agent_marks(owner, agent, seq) VALUES (?,?,?)",
                             ("acme/human:marco@acme.com", "agent:scout", 2))
            # acme-labs, whose name acme's begins, is another office: left as it is
            await db.put_item(tx, Item("acme-labs/plans", 1, "outcome", "Theirs", "open", "x"))
        # its webhook's cursor (keyed `acme <url>`): the new acme's forwarder starts its own
        await cursors.save_cursor(store, "acme", HOOK, 41, 3, time.time() + 300, "503")
        await cursors.save_cursor(store, "acme-labs", HOOK, 40, 0, 0.0, None)
        async with store.transaction("installation:acme") as tx:
            await retire_in(tx, "acme", "acme~7")
        assert await cursors.get_cursor(store, "acme", HOOK) is None
        kept = await cursors.get_cursor(store, "acme~7", HOOK)
        assert kept is not None and (kept["seq"], kept["org"]) == (41, "acme~7")
        theirs = await cursors.get_cursor(store, "acme-labs", HOOK)
        assert theirs is not None and theirs["seq"] == 40
        assert await db.get_item(store, "acme/plans#1") is None
        assert await db.children(store, "acme/plans#1") == []
        assert not await store.fetchall("SELECT id FROM threads WHERE scope=?",
                                        ("acme/plans#1",))
        assert await db.get_item(store, "acme~7/plans#1") is not None, "kept, aside"
        assert await db.get_item(store, "acme-labs/plans#1") is not None
        # every text column of every table: nothing begins with the office's name now
        left = []
        for row in await store.fetchall(_COLUMNS):
            table, column = str(row["t"]), str(row["c"])
            if str(row["type"]) not in _TEXT or table == "ledger":
                continue
            found = await store.fetchone(
                f"SELECT COUNT(*) AS n FROM {table} WHERE {column}=? OR"
                f" substr({column}, 1, 5)=?", ("acme", "acme/"))
            if found is not None and found["n"]:
                left.append(f"{table}.{column}")
        assert not left, left
    finally:
        await store.close()


async def test_an_append_beside_the_move_starts_the_new_offices_chain(
        tmp_path: Path, database_url: str) -> None:
    """On PostgreSQL an append beside the move, uncommitted yet, read the old office's last
    entry and chained the new office's first entry onto it (its position too): the move
    holds the office's ledger, and the append waits for it (review)."""
    store = await open_store(database_url or tmp_path / "index.sqlite3")
    try:
        for n in range(3):  # the old office's entries
            async with store.transaction(ledger.key("acme")) as tx:
                await ledger.append(tx, "mail.sent", "human:a", f"old {n}", org="acme")

        async def append() -> None:
            async with store.transaction(ledger.key("acme")) as tx:
                await chats.add_chat(tx, "agent:scout", "human:b", "hello", 0.0, org="acme")
                await ledger.append(tx, "mail.sent", "human:b", "the new office's first",
                                    org="acme")

        if database_url:
            from tests.pg import waiting_behind

            async with store.transaction("installation:acme") as tx:
                await retire_in(tx, "acme", "acme~1")
                me = await tx.fetchone("SELECT pg_backend_pid() AS pid")
                assert me is not None
                beside = asyncio.create_task(append())
                await until(lambda: waiting_behind(database_url, int(me["pid"])))
            await beside
        else:  # one writer: the append comes before or after the move, whole
            async with store.transaction("installation:acme") as tx:
                await retire_in(tx, "acme", "acme~1")
            await append()
        assert await ledger.verify_chain(store) is None
        new = await store.fetchall("SELECT pos, prev_hash FROM ledger WHERE org='acme'")
        assert [(r["pos"], r["prev_hash"]) for r in new] == [(1, ledger.GENESIS)]
    finally:
        await store.close()


async def test_a_repository_gone_to_another_owner_takes_no_office_rows(
        tmp_path: Path, database_url: str) -> None:
    """rename_vault_in(acme/plans, eve/plans): before, acme's rows were made to name
    eve/plans, a repository of another owner's (a transfer, which GitHub's old name leads
    to, taken as a rename). A repository is renamed within its office only."""
    store = await open_store(database_url or tmp_path / "index.sqlite3")
    try:
        async with store.transaction() as tx:
            await db.put_item(tx, Item("acme/plans", 1, "outcome", "Acquire globex (secret)",
                                       "open", "marco"))
        async with store.transaction("installation:eve") as tx:
            with pytest.raises(ValueError, match="another owner"):
                await rename_vault_in(tx, "acme/plans", "eve/plans")
        assert await db.get_item(store, "acme/plans#1") is not None
        assert await db.get_item(store, "eve/plans#1") is None
    finally:
        await store.close()


async def test_a_retry_in_the_office_that_took_a_freed_name_finds_none_of_the_old_ones_steps(
        tmp_path: Path, database_url: str) -> None:
    """globex replied to globex/scout-vault#1 with the key reply-1 and renamed itself
    initech (its entry keeps the name it was hashed under); another account's new globex
    office asks whether its own #1 was replied to with reply-1. Before, `recorded`,
    `first_recorded` and `recorded_with` looked at the subject alone, in every office's
    chain: yes, and a retried reply there skipped its move (record_once, by chain, did not)."""
    store = await open_store(database_url or tmp_path / "index.sqlite3")
    try:
        await ledger.record(store, "mail.replied", "agent:scout", "globex/scout-vault#1",
                            {"reply": "reply-1"}, org="globex")
        async with store.transaction("installation:globex") as tx:
            await rename_in(tx, "globex", "initech")
        ref, renamed = "globex/scout-vault#1", {"globex": "initech"}
        assert not await ledger.recorded(store, "mail.replied", ref, "reply", "reply-1",
                                         org="globex", renamed={})
        assert await ledger.first_recorded(store, "mail.replied", ref, "reply", "reply-1",
                                           org="globex", renamed={}) is None
        assert await ledger.recorded_with(store, ("mail.replied",), ref, "reply", "reply-1",
                                          org="globex", renamed={}) == []
        # initech's own retry still finds it, under the name it had
        assert await ledger.recorded(store, "mail.replied", "initech/scout-vault#1", "reply",
                                     "reply-1", org="initech", renamed=renamed)
    finally:
        await store.close()


@pytest.mark.parametrize(("step", "now"), [
    (("forge", "issue_comment.created:acme:7:t"), ("forge", "issue_comment.created:initech:7:t")),
    (("tool:mail_send:acme:agent:scout", "k1"), ("tool:mail_send:initech:agent:scout", "k1")),
])
@pytest.mark.parametrize("later", [False, True], ids=["own", "worker"])
async def test_a_step_at_work_while_its_office_is_renamed_keeps_its_result_there(
        tmp_path: Path, database_url: str, step: tuple[str, str], now: tuple[str, str],
        later: bool) -> None:
    """acme renames itself initech while one of its steps (a forge change, a tool call) is at
    work: the rename moves the step's claim to the new name (`_move_steps`). Before, the
    finished try wrote its result under the old key only: nowhere, the claim left unfinished
    under the new key, its fence (`claim_held_in`) said lost meanwhile, and a redelivery
    after the rename ran the step again as a retry. The try's claim is its row wherever the
    office's name takes it."""
    store = await open_store(database_url or tmp_path / "index.sqlite3")
    runs: list[bool] = []
    held: list[bool] = []

    async def work() -> dict[str, str]:
        runs.append(resumed())
        async with store.transaction("installation:acme", "installation:initech") as tx:
            await rename_in(tx, "acme", "initech")
        held.append(await claim_held_in(store))  # (the fence before a forge write)
        return {"delivery": "d1"}

    try:
        settling: list[Settlement] = []
        assert await store.once(*step, "", work, later=settling if later else None) == {
            "delivery": "d1"}
        if later:  # (the worker's: recorded with the delivery's finish)
            async with store.transaction() as tx:
                assert await store.settle_in(tx, settling) == []
            store.settled(settling)
        row = await store.fetchone("SELECT result FROM idempotency WHERE scope=? AND key=?",
                                   now)
        assert row is not None and row["result"] is not None, "the result is kept"
        assert json.loads(row["result"]) == {"delivery": "d1"}
        # delivered again after the rename, keyed by the office's name now: done, not run
        assert await store.once(*now, "", work) == {"delivery": "d1"}
        assert (runs, held) == ([False], [True])
    finally:
        await store.close()


@pytest.mark.parametrize(("step", "now"), [
    (("forge", "issue_comment.created:acme:7:t"), ("forge", "issue_comment.created:initech:7:t")),
    (("tool:mail_send:acme:agent:scout", "k1"), ("tool:mail_send:initech:agent:scout", "k1")),
])
async def test_a_step_delivered_again_under_the_new_name_waits_for_this_replicas_try(
        tmp_path: Path, database_url: str, step: tuple[str, str], now: tuple[str, str]) -> None:
    """acme renames itself initech while one of its steps is at work on this replica, its
    result left for the worker to record; the step comes again, keyed by the office's name
    now, to the same replica. Before, the claim's row named this replica as its owner, which
    a claim takes for a dead incarnation of itself: the second call took it over and ran the
    step beside the first. It waits for this process's try, and returns its result."""
    store = await open_store(database_url or tmp_path / "index.sqlite3")
    ran: list[str] = []

    async def first() -> dict[str, str]:
        ran.append("first")
        async with store.transaction("installation:acme", "installation:initech") as tx:
            await rename_in(tx, "acme", "initech")
        return {"delivery": "d1"}

    async def again() -> dict[str, str]:
        ran.append("again")
        return {"delivery": "d2"}

    try:
        settling: list[Settlement] = []
        assert await store.once(*step, "", first, later=settling) == {"delivery": "d1"}
        waits = store.claim_waits
        second = asyncio.create_task(store.once(*now, "", again))
        await until(lambda: second.done() or store.claim_waits > waits)
        async with store.transaction() as tx:  # (the worker's, with the delivery's finish)
            assert await store.settle_in(tx, settling) == []
        store.settled(settling)
        assert await asyncio.wait_for(second, 10) == {"delivery": "d1"}
        assert ran == ["first"]
    finally:
        await store.close()
