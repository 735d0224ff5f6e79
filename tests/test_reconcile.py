"""Missing webhooks: reconciliation asks the forge again for what it failed to deliver."""

from __future__ import annotations

from typing import Any

from bot.app.embedded import Embedded
from tests.support import Actor, label_names

SCOUT_VAULT = "acme/scout-vault"


async def test_a_dropped_webhook_is_redelivered_and_handled_once(
        embedded: Embedded, person: Any) -> None:
    embedded.forge.faults.drop_webhooks(count=1)
    marco: Actor = person("marco")
    issue = await marco.open_issue(SCOUT_VAULT, "Lost?", "This webhook is dropped")
    await embedded.settle()
    assert label_names(await marco.issue(SCOUT_VAULT, issue["number"])) == []
    assert await embedded.reconciler.run_once() == 1
    await embedded.settle()
    assert label_names(await marco.issue(SCOUT_VAULT, issue["number"])) == ["mail:new"]
    assert await embedded.reconciler.run_once() == 0, "nothing left to ask for"
    assert len(await embedded.ledger_events("mail.sent")) == 1


async def test_with_a_fifth_of_webhooks_dropped_every_mail_is_adopted_once(
        embedded: Embedded, person: Any) -> None:
    embedded.forge.faults.seed(7)
    embedded.forge.faults.drop_webhooks(rate=0.2)
    marco: Actor = person("marco")
    numbers = [(await marco.open_issue(SCOUT_VAULT, f"Mail {i}", f"body {i}"))["number"]
               for i in range(15)]
    await embedded.settle()
    embedded.forge.faults.drop_webhooks(rate=0.0)
    for _ in range(3):  # a redelivery can itself be dropped while the fault is on
        await embedded.reconciler.run_once()
        await embedded.settle()
    for n in numbers:
        assert label_names(await marco.issue(SCOUT_VAULT, n)) == ["mail:new"], n
    assert len(await embedded.ledger_events("mail.sent")) == 15
