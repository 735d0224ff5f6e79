"""A delivery run again after its process died mid-way is a retry to its handlers (issue 27):
the first run may have written to the forge before it died, so the next looks before it writes
(`ctx.retry`, which `Scene.say` and the mail writes ask) instead of saying it all again."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from bot.app.context import was_tried
from bot.store import open_store
from tests.support import label_names


async def test_a_delivery_claimed_by_a_process_that_died_is_a_retry_when_run_again(
        tmp_path: Path) -> None:
    path = tmp_path / "index.sqlite3"
    first = await open_store(path)
    assert await first.enqueue_delivery("g", "issue_comment", {}, b"{}")
    await first.join(sole=True)
    [item] = await first.due_items(1)
    assert not was_tried(item), "a first run is no retry"
    await first.close()  # it dies after its forge write, before finishing the row
    second = await open_store(path)  # the process started again on its data directory
    try:
        await second.join(sole=True)
        [again] = await second.due_items(1)
        assert again.guid == "g"
        assert again.attempts == 0, "it never failed: only claimed"
        assert was_tried(again), "but an earlier run may have written: a retry"
    finally:
        await second.close()


async def test_a_refusal_run_again_is_ledgered_once(embedded: Any, person: Any) -> None:
    """lee, who neither sent nor received the mail, labels it closed: the app refuses,
    ledgered as `run.denied`, and puts the label back. Putting it back fails (the forge
    answers 502 to every try), so the delivery runs again and refuses again: the ledger says
    it once (issue 27: a re-run repeated what it said)."""
    marco, lee = person("marco"), person("lee")
    client = embedded.services.forge_for(None)  # retries short: what is counted is the same
    client.config = dataclasses.replace(client.config, backoff_base=0.01, backoff_max=0.05)
    embedded.worker.base_backoff = 0.05
    issue = await marco.open_issue("acme/scout-vault", "Prices", "EU prices, please")
    await embedded.settle()
    embedded.forge.faults.add("PATCH /repos/{owner}/{repo}/issues/{issue_number}",
                              status=502, count=4)
    await lee.call("POST", f"/repos/acme/scout-vault/issues/{issue['number']}/labels",
                   {"labels": ["mail:closed"]}, expect=200)
    await embedded.settle()
    assert label_names(await lee.issue("acme/scout-vault", issue["number"])) == ["mail:new"]
    ref = f"acme/scout-vault#{issue['number']}"
    denied = [e for e in await embedded.ledger_events("run.denied") if e.subject == ref]
    assert len(denied) == 1, [e.data for e in denied]
