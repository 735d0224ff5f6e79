"""Exactly once under chaos: the forge fails a tenth of requests and drops a fifth of webhooks;
every mail still lands once, once reconciliation has caught up."""

from __future__ import annotations

import dataclasses
from typing import Any

from bot.app.embedded import Embedded
from tests.support import Actor, label_names

SCOUT_VAULT = "acme/scout-vault"


async def _retrying(fn: Any, *args: Any, **kwargs: Any) -> Any:
    """What a person's client does: try again when the forge or the app answers 5xx."""
    for _ in range(20):
        try:
            return await fn(*args, **kwargs)
        except AssertionError as exc:
            if " 50" not in str(exc) and "502" not in str(exc):
                raise
    raise AssertionError("still failing after 20 tries")


async def test_no_mail_lost_or_duplicated_with_failing_forge_and_dropped_webhooks(
        embedded: Embedded, person: Any, tools: Any) -> None:
    services = embedded.services
    forge = services.forge_for(None)
    forge.config = dataclasses.replace(  # type: ignore[attr-defined]
        forge.config, backoff_base=0.01, backoff_max=0.05)
    embedded.worker.base_backoff = 0.02
    faults = embedded.forge.faults
    faults.seed(11)
    failing = faults.add(route="*", status=502, rate=0.1)
    faults.drop_webhooks(rate=0.2)

    marco: Actor = person("marco")
    opened = []
    for i in range(10):
        issue = await _retrying(marco.open_issue, SCOUT_VAULT, f"By hand {i}", f"body {i}")
        opened.append(issue["number"])
    builder = tools("agent:builder")
    for i in range(10):
        await _retrying(builder, "mail_send", to="scout", subject=f"By tool {i}",
                        body=f"tool body {i}", idempotencyKey=f"chaos-{i}")
    await embedded.settle(timeout=60)

    assert failing.fired >= 1, "the forge really failed requests"
    dropped = [d async for d in services.forge_client.app().iter_deliveries(status="failure")]
    assert len(dropped) >= 1, "and really dropped webhooks"
    faults.clear()
    for _ in range(3):
        await embedded.reconciler.run_once()
        await embedded.settle(timeout=60)
    await services.store.replay()  # anything that ran out of retries while the forge failed
    embedded.worker.wake()
    await embedded.settle(timeout=60)

    issues = await person("admin").issues(SCOUT_VAULT)
    titles = sorted(i["title"] for i in issues)
    assert titles == sorted([f"By hand {i}" for i in range(10)] +
                            [f"By tool {i}" for i in range(10)]), "none lost, none twice"
    for n in opened:
        found = await marco.issue(SCOUT_VAULT, n)
        assert label_names(found) == ["mail:new"] and found["body"].count(
            "vaultmail:header") == 1
    assert len(await embedded.ledger_events("mail.sent")) == 20
