"""What an operator's probes and scrapers see: `/healthz` (alive), `/readyz` (able to work,
or which part is not), `/metrics` (Prometheus)."""

from __future__ import annotations

from typing import Any

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from bot.app import web as app_web
from bot.app.embedded import Embedded
from tests.support import Actor


async def _get(session: aiohttp.ClientSession, url: str) -> tuple[int, Any, str]:
    async with session.get(url) as resp:
        text = await resp.text()
        body = await resp.json() if resp.content_type == "application/json" else None
        return resp.status, body, text


async def test_readyz_says_ready_when_every_check_passes(embedded: Embedded,
                                                         session: aiohttp.ClientSession) -> None:
    status, body, _ = await _get(session, f"{embedded.app_url}/readyz")
    assert status == 200, body
    assert body["status"] == "ready" and body["failed"] == []
    assert set(body["checks"]) == {"database", "forge", "installations", "queue"}


async def test_readyz_names_the_forge_when_it_cannot_be_reached(
        embedded: Embedded, session: aiohttp.ClientSession) -> None:
    embedded.forge.faults.add(route="GET /", status=502)
    status, body, _ = await _get(session, f"{embedded.app_url}/readyz")
    assert status == 503
    assert body["failed"] == ["forge"], body
    assert "502" in body["checks"]["forge"]["detail"]
    status, _, _ = await _get(session, f"{embedded.app_url}/healthz")
    assert status == 200, "liveness does not depend on the forge"


async def test_readyz_names_a_stuck_queue(embedded: Embedded, session: aiohttp.ClientSession,
                                          person: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    await embedded.worker.stop()
    marco: Actor = person("marco")
    await marco.open_issue("acme/scout-vault", "Prices", "EU prices please")
    await embedded.forge.webhooks_idle()
    monkeypatch.setattr(app_web, "STUCK_AFTER", -1.0)  # any wait at all counts as stuck
    status, body, _ = await _get(session, f"{embedded.app_url}/readyz")
    assert status == 503 and body["failed"] == ["queue"], body
    assert "oldest due delivery has waited" in body["checks"]["queue"]["detail"]


def _samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


async def test_metrics_count_deliveries_by_event_and_outcome(
        embedded: Embedded, session: aiohttp.ClientSession, person: Any) -> None:
    key = ("vaultmail_deliveries_total", (("event", "issues"), ("outcome", "handled")))
    status, _, before = await _get(session, f"{embedded.app_url}/metrics")
    assert status == 200
    handled_before = _samples(before).get(key, 0.0)
    marco: Actor = person("marco")
    await marco.open_issue("acme/scout-vault", "Prices", "EU prices please")
    await embedded.settle()
    _, _, after = await _get(session, f"{embedded.app_url}/metrics")
    samples = _samples(after)
    assert samples[key] > handled_before
    received = ("vaultmail_deliveries_total", (("event", "issues"), ("outcome", "received")))
    assert samples[received] >= samples[key] - handled_before
    assert samples[("vaultmail_queue_pending", ())] == 0
    assert any(name == "vaultmail_handler_seconds_count" for name, _ in samples)


async def test_metrics_count_tool_calls_forge_requests_and_the_rate_limit_left(
        embedded: Embedded, session: aiohttp.ClientSession, tools: Any) -> None:
    ok = ("vaultmail_tool_calls_total", (("outcome", "ok"), ("tool", "mail_send")))
    _, _, before = await _get(session, f"{embedded.app_url}/metrics")
    sent_before = _samples(before).get(ok, 0.0)
    await tools("human:marco@acme.com")("mail_send", to="scout", subject="Hi", body="Hello")
    refused = await tools("human:lee@acme.com").raw(
        "mail_send", {"to": "scout", "subject": "Hi", "body": "Hello"})
    assert refused[0] == 403
    await embedded.settle()
    _, _, after = await _get(session, f"{embedded.app_url}/metrics")
    samples = _samples(after)
    assert samples[ok] == sent_before + 1
    assert samples[("vaultmail_tool_calls_total", (("outcome", "denied"), ("tool", "mail_send")))]
    creates = [v for (name, labels), v in samples.items()
               if name == "vaultmail_forge_requests_total"
               and dict(labels) == {"method": "POST", "route": "/repos/{owner}/{repo}/issues",
                                    "status": "201"}]
    assert creates and creates[0] >= 1, "forge requests by route template and status"
    inst = str(embedded.services.default_installation)
    assert samples[("vaultmail_forge_rate_limit_remaining", (("installation", inst),))] > 0
