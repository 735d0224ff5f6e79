"""Prometheus metrics (`GET /metrics`): what an operator watches.

The counters and histograms live in one registry for the process (one app a process in
production); gauges about the queue are read from the store when scraped, so they are never
stale. Parts of the app record into these directly; nothing here does I/O but `render`.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable
from typing import TYPE_CHECKING

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    GC_COLLECTOR,
    PLATFORM_COLLECTOR,
    PROCESS_COLLECTOR,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)
from prometheus_client.core import CounterMetricFamily, Metric
from prometheus_client.registry import Collector

if TYPE_CHECKING:
    from bot.store import Store

REGISTRY = CollectorRegistry()
# what every Prometheus client serves by default: the process (memory, CPU, file descriptors)
# and the Python runtime (its version, the garbage collector)
for _collector in (PROCESS_COLLECTOR, PLATFORM_COLLECTOR, GC_COLLECTOR):
    REGISTRY.register(_collector)

# the events a delivery may name that are label values; any other is `other`: on Gitea an
# org's own webhook signs what its admins send, the event header included, and a label value
# per name it chose would grow this process's memory (and every scrape) without end
KNOWN_EVENTS = frozenset({
    "issues", "issue_comment", "label", "push", "sub_issues", "issue_dependencies",
    "pull_request", "installation", "installation_repositories", "ping", "repository",
    "create", "delete", "issue_label", "issue_assign", "issue_milestone", "check_run",
    "check_suite", "github_app_authorization", "meta"})


def event_label(event: str) -> str:
    """The label value of a delivery's event: the event when it is one the app knows."""
    return event if event in KNOWN_EVENTS else "other"


DELIVERIES = Counter(
    "vaultmail_deliveries_total",
    "Webhook deliveries by event and outcome (received, handled, ignored, retried, dead, "
    "put_off: waiting for the forge's budget, no attempt counted; redelivered: a delivery id "
    "already recorded; superseded: taken over by another replica before this one recorded "
    "its outcome)",
    ["event", "outcome"], registry=REGISTRY)


def deliveries(event: str, outcome: str) -> Counter:
    """DELIVERIES' child for a delivery of `event` (its label value: `event_label`)."""
    return _delivery_child(event_label(event), outcome)


# Children kept once made: `labels()` checks and looks up under a lock at every call, which was
# 3 % of the app's CPU per webhook (a py-spy profile of bench.probot_compare). Both label sets
# are bounded (KNOWN_EVENTS and "other"; the outcomes the code names).
@functools.cache
def _delivery_child(event: str, outcome: str) -> Counter:
    return DELIVERIES.labels(event=event, outcome=outcome)


def handler_seconds(event: str) -> Histogram:
    """HANDLER_SECONDS' child for a delivery of `event`."""
    return _handler_child(event_label(event))


@functools.cache
def _handler_child(event: str) -> Histogram:
    return HANDLER_SECONDS.labels(event=event)


HANDLER_SECONDS = Histogram(
    "vaultmail_handler_seconds", "Time to handle one delivery, by event", ["event"],
    registry=REGISTRY, buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30))
QUEUE_PENDING = Gauge("vaultmail_queue_pending", "Deliveries waiting to be handled",
                      registry=REGISTRY)
QUEUE_DEAD = Gauge("vaultmail_queue_dead_letters", "Deliveries that kept failing",
                   registry=REGISTRY)
QUEUE_AGE = Gauge("vaultmail_queue_oldest_due_seconds",
                  "How long the oldest due delivery has waited", registry=REGISTRY)
FORGE_REQUESTS = Counter(
    "vaultmail_forge_requests_total", "Requests to the forge by method, route and status",
    ["method", "route", "status"], registry=REGISTRY)
RATE_REMAINING = Gauge(
    "vaultmail_forge_rate_limit_remaining", "The forge's primary rate limit left, per "
    "installation (x-ratelimit-remaining)", ["installation"], registry=REGISTRY)
PACING_SECONDS = Counter(
    "vaultmail_pacing_wait_seconds_total", "Seconds writes waited for the creation budget",
    registry=REGISTRY)
BUDGET_WAIT = Gauge(
    "vaultmail_forge_budget_wait_seconds",
    "The longest wait left of a write waiting now for its place in the forge's budget",
    registry=REGISTRY)
PACING_WAIT = Histogram(
    "vaultmail_forge_pacing_wait_seconds",
    "Seconds each forge write waited for its budget and its turn, by kind (creation: issues "
    "and comments, GitHub's content-creation budget; write: label moves and other edits)",
    ["kind"], buckets=(0.01, 0.1, 1.0, 5.0, 30.0, 60.0, 300.0, 900.0, 3600.0),
    registry=REGISTRY)
LONG_POLLS = Gauge("vaultmail_long_polls_held", "list_inbox / chat waits being held now",
                   registry=REGISTRY)
TOOL_CALLS = Counter(
    "vaultmail_tool_calls_total", "Tool calls by tool and outcome (ok or the error code)",
    ["tool", "outcome"], registry=REGISTRY)
FAILED_TRIES = Counter(
    "vaultmail_failed_token_tries_total",
    "API tokens offered and refused, by where (sign_in: the console's form; bearer: "
    "Authorization on the tools, /mcp and console pages) and outcome (failed: unknown or "
    "revoked, counted against the address; refused: 429, over the limit, not looked up)",
    ["place", "outcome"], registry=REGISTRY)


class _StoreTransactions(Collector):
    """`vaultmail_store_write_transactions_total`, as the store counts them (the store imports
    nothing of this module)."""

    def __init__(self) -> None:
        self.store: Store | None = None

    def collect(self) -> Iterable[Metric]:
        family = CounterMetricFamily(
            "vaultmail_store_write_transactions",
            "Write transactions the index committed (intake's group commits, claims, a "
            "handled event's results, finishes...): the cost of an event in the store")
        family.add_metric([], self.store.write_transactions if self.store is not None else 0)
        yield family


_STORE_TRANSACTIONS = _StoreTransactions()
REGISTRY.register(_STORE_TRANSACTIONS)


async def render(store: Store | None) -> tuple[bytes, str]:
    """The exposition text, the queue gauges read now; returns (body, content type)."""
    _STORE_TRANSACTIONS.store = store
    if store is not None:  # None while start-up waits for the forge
        stats = await store.queue_stats()
        QUEUE_PENDING.set(stats["pending"])
        QUEUE_DEAD.set(stats["dead"])
        QUEUE_AGE.set(stats["oldest_due_age"])
    return generate_latest(REGISTRY), CONTENT_TYPE_LATEST
