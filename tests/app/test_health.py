"""What an operator's probes and scrapers see: `/healthz` (alive), `/readyz` (able to work,
or which part is not), `/metrics` (Prometheus)."""

from __future__ import annotations

import contextlib
import dataclasses
import sqlite3
import time
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import asyncpg
import pytest
from prometheus_client.parser import text_string_to_metric_families

from bot.app import web as app_web
from bot.app.embedded import Embedded
from tests.support import Actor

OPERATOR = {"Authorization": "Bearer operator-token-of-the-tests"}


@pytest.fixture(autouse=True)
def _operator(embedded: Embedded) -> None:
    """The readiness checks' detail is the operator's: these tests hold its token."""
    settings = embedded.services.settings
    embedded.services.settings = dataclasses.replace(
        settings, operator_token=OPERATOR["Authorization"].removeprefix("Bearer "))


async def _get(session: aiohttp.ClientSession, url: str) -> tuple[int, Any, str]:
    async with session.get(url, headers=OPERATOR if url.endswith(("/readyz", "/metrics"))
                           else None) as resp:
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


async def _timed_get(session: aiohttp.ClientSession, url: str) -> tuple[int, Any, float]:
    started = time.monotonic()
    status, body, _ = await _get(session, url)
    return status, body, time.monotonic() - started


PROBE_TIMEOUT = 4.0  # the Dockerfile's health check gives /healthz 4 s (urlopen timeout)


@contextlib.asynccontextmanager
async def _holding_the_write_lock(embedded: Embedded) -> AsyncIterator[None]:
    settings = embedded.services.settings
    if not settings.database_url:
        other = sqlite3.connect(settings.db_path, timeout=0, isolation_level=None)
        try:
            other.execute("BEGIN EXCLUSIVE")
            yield
        finally:
            other.execute("ROLLBACK")
            other.close()
        return
    conn = await asyncpg.connect(settings.database_url)
    try:
        async with conn.transaction():  # as a CREATE INDEX without CONCURRENTLY would
            await conn.execute("LOCK TABLE queue IN SHARE MODE")
            yield
    finally:
        await conn.close()


async def test_readyz_names_the_database_when_another_connection_holds_its_write_lock(
        embedded: Embedded, session: aiohttp.ClientSession, person: Any) -> None:
    """An operator's `sqlite3 index.sqlite3` left in a transaction (or a backup tool holding
    the lock): the index cannot take a write. Readiness says so within a probe's timeout and
    names the lock; liveness still answers; once the lock is let go, all is well again. On
    PostgreSQL: another session keeping writes out of the queue (a CREATE INDEX)."""
    async with _holding_the_write_lock(embedded):
        status, body, took = await _timed_get(session, f"{embedded.app_url}/readyz")
        health_status, health, health_took = await _timed_get(
            session, f"{embedded.app_url}/healthz")
        assert status == 503 and body["failed"] == ["database"], body
        assert "locked" in body["checks"]["database"]["detail"], body
        assert took < PROBE_TIMEOUT, f"/readyz took {took:.1f} s"
        assert health_status == 200 and health["status"] == "ok", health
        assert health_took < PROBE_TIMEOUT, f"/healthz took {health_took:.1f} s meanwhile"
    status, body, _ = await _get(session, f"{embedded.app_url}/readyz")
    assert status == 200 and body["failed"] == [], body
    # the index takes writes again: a delivery is queued and handled
    marco: Actor = person("marco")
    issue = await marco.open_issue("acme/scout-vault", "Prices", "EU prices please")
    await embedded.settle()
    labels = [x["name"] for x in (await marco.issue("acme/scout-vault", issue["number"]))["labels"]]
    assert labels == ["mail:new"]


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


def _value(samples: dict[tuple[str, tuple[tuple[str, str], ...]], float], name: str,
           **labels: str) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


def _short_retries(embedded: Embedded) -> Any:
    """Deliveries and the forge client each try twice, quickly; returns the client."""
    embedded.worker.base_backoff, embedded.worker.max_attempts = 0.01, 2
    forge: Any = embedded.services.forge_for(None)
    forge.config = dataclasses.replace(forge.config, backoff_base=0.001, max_attempts=2)
    return forge


LABEL_WRITE = "PATCH /repos/{owner}/{repo}/issues/{issue_number}"  # the app labels a new mail


async def test_metrics_follow_a_delivery_that_fails_until_it_is_dead_lettered(
        embedded: Embedded, session: aiohttp.ClientSession, person: Any) -> None:
    """A delivery whose forge write keeps failing: while it is in progress the queue's depth
    and age count it; each failed attempt but the last is `retried`, the last is `dead`, and
    the queue is empty again, its dead letter counted."""
    _short_retries(embedded)
    _, _, text = await _get(session, f"{embedded.app_url}/metrics")
    before = _samples(text)

    held = embedded.forge.faults.hold(LABEL_WRITE)
    marco: Actor = person("marco")
    opened = time.time()
    await marco.open_issue("acme/scout-vault", "Prices", "EU prices please")
    await held.arrived.wait()  # the delivery is being handled: its write waits at the forge
    _, _, text = await _get(session, f"{embedded.app_url}/metrics")
    waited = time.time() - opened
    during = _samples(text)
    assert _value(during, "vaultmail_queue_pending") == 1
    age = _value(during, "vaultmail_queue_oldest_due_seconds")
    assert 0 < age <= waited, (age, waited)

    embedded.forge.faults.add(LABEL_WRITE, status=503)  # every try of it fails from now on
    held.release()
    await embedded.settle()
    _, _, text = await _get(session, f"{embedded.app_url}/metrics")
    after = _samples(text)

    def delta(outcome: str) -> float:
        name = "vaultmail_deliveries_total"
        return (_value(after, name, event="issues", outcome=outcome)
                - _value(before, name, event="issues", outcome=outcome))

    assert (delta("retried"), delta("dead"), delta("handled")) == (1, 1, 0)
    assert _value(after, "vaultmail_queue_pending") == 0
    assert _value(after, "vaultmail_queue_dead_letters") == 1
    assert _value(after, "vaultmail_queue_oldest_due_seconds") == 0
    route = (("method", "PATCH"), ("route", "/repos/{owner}/{repo}/issues/{number}"),
             ("status", "503"))  # (the app's URI template)
    failed = (after.get(("vaultmail_forge_requests_total", route), 0.0)
              - before.get(("vaultmail_forge_requests_total", route), 0.0))
    assert failed == 4, "two attempts of the delivery, two tries of the write in each"


async def test_pacing_wait_seconds_count_the_turns_a_failed_write_waits_for_its_retry(
        embedded: Embedded, session: aiohttp.ClientSession, person: Any) -> None:
    """The forge refuses the label write once; the client tries again once pacing lets it
    (writes 0.2 s apart here). Every second waited for a write turn is in the metric."""
    forge = _short_retries(embedded)
    forge.pacer.min_interval = 0.2
    stats = embedded.services.forge_client.stats  # every installation's and the App's calls
    await embedded.settle()
    _, _, text = await _get(session, f"{embedded.app_url}/metrics")
    metric_before, paced_before = _value(_samples(text), PACING), stats.paced
    embedded.forge.faults.add(LABEL_WRITE, status=503, count=1)
    marco: Actor = person("marco")
    issue = await marco.open_issue("acme/scout-vault", "Prices", "EU prices please")
    await embedded.settle()
    got = await marco.issue("acme/scout-vault", issue["number"])
    assert [x["name"] for x in got["labels"]] == ["mail:new"], "the retry landed"
    _, _, text = await _get(session, f"{embedded.app_url}/metrics")
    paced = stats.paced - paced_before
    assert paced >= 0.1, f"the retry waited for its turn ({paced:.3f} s)"
    assert _value(_samples(text), PACING) - metric_before == pytest.approx(paced, abs=1e-6)


PACING = "vaultmail_pacing_wait_seconds_total"


async def test_metrics_carry_the_process_and_python_collectors(
        embedded: Embedded, session: aiohttp.ClientSession) -> None:
    """Issue 23: what every Prometheus client serves by default (the process's memory, CPU
    and file descriptors; the Python runtime's), beside the app's own."""
    status, _, body = await _get(session, f"{embedded.app_url}/metrics")
    assert status == 200
    names = {name for name, _ in _samples(body)}
    assert {"process_resident_memory_bytes", "process_open_fds", "python_info"} <= names
    assert any(name.startswith("python_gc_") for name in names)


async def test_metrics_are_the_operators_once_there_is_one(
        embedded: Embedded, session: aiohttp.ClientSession) -> None:
    """The metrics name each installation (its rate limit left: how many tenants, how busy
    each): with an operator's token set, they are the operator's, as readiness's detail is;
    anyone else is told what to send (found by review: anyone read them)."""
    async with session.get(f"{embedded.app_url}/metrics") as resp:
        assert resp.status == 401
        assert "VAULTMAIL_OPERATOR_TOKEN" in (await resp.json())["error"]["message"]
    async with session.get(f"{embedded.app_url}/metrics", headers={
            "Authorization": "Bearer not-the-operators"}) as resp:
        assert resp.status == 401
    status, _, text = await _get(session, f"{embedded.app_url}/metrics")
    assert status == 200 and "vaultmail_deliveries_total" in text
