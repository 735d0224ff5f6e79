"""A person's close or reopen by hand is recorded whatever order its deliveries arrive in.

marco closed an adopted mail (its delivery dropped, later redelivered), then added a label
(delivered at once): the label's review took the index's stale state (mail:new, open) as the
issue's and reopened marco's closed issue, though the label change accepted no new state; the
close, when it came, found the issue open and was dropped as stale. marco's close was lost. The
mirror (a reopen, then a label) closed the issue again. A label change that moves no mail state
now leaves open/closed alone."""

from __future__ import annotations

from typing import Any

from bot.app.embedded import Embedded
from bot.store import mails
from tests.support import Actor, label_names

VAULT = "acme/scout-vault"


async def _adopted(embedded: Embedded, marco: Actor) -> int:
    issue = await marco.open_issue(VAULT, "Prices", "EU prices please")
    await embedded.settle()
    assert await mails.mail_at(embedded.services.store, VAULT, issue["number"]) is not None
    return int(issue["number"])


async def _is(embedded: Embedded, marco: Actor, n: int, state: str, mail_state: str) -> None:
    found = await marco.issue(VAULT, n)
    row = await mails.mail_at(embedded.services.store, VAULT, n)
    assert (found["state"], row.state if row else None) == (state, mail_state), (
        found["state"], label_names(found), row)
    assert "urgent" in label_names(found) and mail_state in label_names(found), found


async def _label(embedded: Embedded, marco: Actor, n: int) -> None:
    await marco.call("POST", f"/repos/{VAULT}/issues/{n}/labels", {"labels": ["urgent"]})
    await embedded.settle()


async def test_a_close_reconciled_after_a_later_label_change_still_closes(
        embedded: Embedded, person: Any) -> None:
    marco: Actor = person("marco")
    n = await _adopted(embedded, marco)
    embedded.forge.faults.drop_webhooks(count=1)  # the close's delivery lost for now
    await marco.call("PATCH", f"/repos/{VAULT}/issues/{n}", {"state": "closed"}, expect=200)
    await embedded.settle()
    await _label(embedded, marco, n)
    assert (await marco.issue(VAULT, n))["state"] == "closed", "the label reopened it"
    assert await embedded.reconciler.run_once() == 1  # the lost close, redelivered
    await embedded.settle()
    await _is(embedded, marco, n, "closed", "mail:closed")


async def test_a_reopen_reconciled_after_a_later_label_change_still_reopens(
        embedded: Embedded, person: Any) -> None:
    marco: Actor = person("marco")
    n = await _adopted(embedded, marco)
    await marco.call("PATCH", f"/repos/{VAULT}/issues/{n}", {"state": "closed"}, expect=200)
    await embedded.settle()
    embedded.forge.faults.drop_webhooks(count=1)  # the reopen's delivery lost for now
    await marco.call("PATCH", f"/repos/{VAULT}/issues/{n}", {"state": "open"}, expect=200)
    await embedded.settle()
    await _label(embedded, marco, n)
    assert (await marco.issue(VAULT, n))["state"] == "open", "the label closed it again"
    assert await embedded.reconciler.run_once() == 1  # the lost reopen, redelivered
    await embedded.settle()
    await _is(embedded, marco, n, "open", "mail:new")

