"""Replicas on PostgreSQL against one process on SQLite: events a second and p99 answers.

For each cell, an office on the local forge and the app: one process on SQLite, or 1, 2 and 4
replicas sharing one PostgreSQL database (the embedded one and `vaultmail serve` processes, as
`vaultmail up --replicas N` runs them). A load client in its own process POSTs signed
`issues.opened` deliveries, fresh delivery ids, 50 in flight, to the replicas in turn as a load
balancer would. Two workloads:

- intake: an issue in a repository of the org that is no vault (the worker reads the office
  config and finds nothing to do): the store's intake, claims and finishes, no forge write;
- mail: a new issue in an agent's vault each (made beforehand with webhooks dropped): the app
  signs the mail header, records the mail and a ledger entry and PATCHes the issue (one forge
  write each, through the installation's pacing shared by every replica);
- offices: the mail workload spread over `--offices` organisations that each installed the
  App (an office config, a vault and an installation of their own, so each its own forge
  limits and pacing, its own ledger chain): what one deployment serving many orgs sees.

Reported: deliveries answered a second, p50/p99 of the answers, and events handled a second
from the first POST until the shared queue is empty; each with the forge's limits on (GitHub's:
a PATCH costs 5 of an installation's 900 points a minute, so at most 3 a second) and off. In
each cell, the write transactions the replicas committed per event (their /metrics,
`vaultmail_store_write_transactions_total`); on PostgreSQL also, from the database's own
statistics, every transaction committed per event, reads included (`pg_stat_database.
xact_commit`, less what the sampler itself commits), and lock waits, the
sessions `pg_stat_activity` shows waiting for a lock (`wait_event_type = 'Lock'`), sampled every
SAMPLE_EVERY seconds and summed into session-seconds per 1,000 events, by kind of lock
(advisory, a row's transaction, a relation...). And the CPU seconds per 1,000 events each part
used inside the window (Linux's /proc): this process (the bench, the local forge and the first
replica), the other replicas, PostgreSQL's server processes; with the load client's, what
shows whether a cell was bound by the cores or by waits.

With `--warm N`, each cell first has N deliveries handled (for mail, N issues more) and its
queue drained before the window opens: the replicas measured as replicas that have run a while
(their pools' connections open, statements prepared and planned), not just started. Cold, at 4
replicas, 44 of PostgreSQL's backends opened inside a 5-second window and used more than half
of the server's CPU in it.

Run: .venv/bin/python -m bench.replicas [--workloads intake,mail,offices] [--offices 8]
     [--count 1500] [--mails 200] [--cells sqlite,1,2,4] [--limits on|off|both] [--warm 0]
     (needs PostgreSQL's server: tests/pg.py starts a throwaway cluster, or set
     VAULTMAIL_TEST_PG=postgresql://USER@HOST:PORT/postgres)
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp
import asyncpg
import yaml

from bench.common import children_of, cpu_seconds, ms, percentile, run, run_client
from bench.intake import _non_vault_payload
from bot.app.embedded import Embedded, start_embedded
from bot.app.replicas import start_replicas
from bot.office.config import parse_office
from bot.office.seed import seed_office
from tests import pg

IN_FLIGHT = 50
WARMUP = 20
SAMPLE_EVERY = 0.01  # seconds between looks at pg_stat_activity


class CpuSplit:
    """CPU seconds used between start() and stop(), by part: this process (the bench, the
    local forge and the first replica), the other replicas, PostgreSQL's server processes."""

    def __init__(self, replicas: list[int], server: int | None) -> None:
        self.replicas, self.server = replicas, server
        self.used = {"this process": 0.0, "other replicas": 0.0, "PostgreSQL": 0.0}
        self._backends: dict[int, float] = {}

    def _server_now(self) -> dict[int, float]:
        if self.server is None:
            return {}
        return {pid: cpu_seconds([pid]) for pid in [self.server, *children_of(self.server)]}

    def start(self) -> None:
        self.used["this process"] = -sum(os.times()[:2])
        self.used["other replicas"] = -cpu_seconds(self.replicas)
        self._backends = self._server_now()

    def stop(self) -> None:
        self.used["this process"] += sum(os.times()[:2])
        self.used["other replicas"] += cpu_seconds(self.replicas)
        # a backend that began inside the window counts whole; one that ended in it is lost
        self.used["PostgreSQL"] = sum(cpu - self._backends.get(pid, 0.0)
                                      for pid, cpu in self._server_now().items())

    def per_1000(self, events: int) -> str:
        parts = [f"{k} {v * 1000 / events:.1f}" for k, v in self.used.items()
                 if k != "PostgreSQL" or self.server is not None]
        return f"{sum(self.used.values()) * 1000 / events:.1f} ({', '.join(parts)})"


class LockWaits:
    """Samples, on a session of its own, the sessions of one database waiting for a lock."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.samples = 0
        self.waiting: dict[str, int] = {}  # wait_event -> sessions seen waiting, summed
        self.commits = 0
        self._task: asyncio.Task[None] | None = None
        self._conn: asyncpg.Connection | None = None
        self.server = 0  # the PostgreSQL server's pid

    async def __aenter__(self) -> LockWaits:
        self._conn = await asyncpg.connect(self.url)
        self.commits = -await self._xact_commit()
        self.server = await self._server_pid()  # (before the sampler: one query at a time)
        self._task = asyncio.create_task(self._sample())
        return self

    async def _xact_commit(self) -> int:
        assert self._conn is not None
        return int(await self._conn.fetchval(
            "SELECT xact_commit FROM pg_stat_database WHERE datname=current_database()"))

    async def _sample(self) -> None:
        assert self._conn is not None
        while True:
            rows = await self._conn.fetch(
                "SELECT wait_event, count(*) AS n FROM pg_stat_activity WHERE"
                " datname=current_database() AND wait_event_type='Lock' GROUP BY wait_event")
            self.samples += 1
            for r in rows:
                self.waiting[r["wait_event"]] = self.waiting.get(r["wait_event"], 0) + r["n"]
            await asyncio.sleep(SAMPLE_EVERY)

    async def __aexit__(self, *exc: object) -> None:
        assert self._task is not None and self._conn is not None
        self._task.cancel()
        await asyncio.gather(self._task, return_exceptions=True)
        await asyncio.sleep(1.5)  # sessions flush their statistics at most once a second
        self.commits += await self._xact_commit() - self.samples - 1
        await self._conn.close()

    async def _server_pid(self) -> int:
        """The PostgreSQL server's (postmaster's) pid: the parent of this session's backend."""
        assert self._conn is not None
        backend = int(await self._conn.fetchval("SELECT pg_backend_pid()"))
        stat = Path(f"/proc/{backend}/stat").read_text()
        return int(stat[stat.rfind(")") + 2:].split()[1])

    def seconds_per_1000(self, events: int) -> str:
        """Lock-wait session-seconds per 1,000 events, in all and by kind."""
        total = sum(self.waiting.values()) * SAMPLE_EVERY * 1000 / events
        kinds = ", ".join(f"{k} {n * SAMPLE_EVERY * 1000 / events:.2f}"
                          for k, n in sorted(self.waiting.items()))
        return f"{total:.2f}" + (f" ({kinds})" if kinds else "")


def _more_offices(embedded: Embedded, offices: int) -> list[tuple[str, str]]:
    """(vault, person's token) of each office: the embedded one's scout vault, then offices
    `office2`... seeded on its forge (a person, an agent `scout`, its vault) and the App
    installed on each, as organisations installing it would."""
    forge = embedded.forge
    vaults = [(f"{embedded.office.org}/scout-vault", embedded.forge_tokens["marco"])]
    (app_id,) = forge.state.apps
    for k in range(2, offices + 1):
        org = f"office{k}"
        tokens = seed_office(forge, parse_office(yaml.safe_dump({
            "org": org, "vault_pattern": "{slug}-vault",
            "humans": [{"email": f"p@{org}.example", "login": f"p-{org}",
                        "permissions": ["mail.send"]}],
            "agents": [{"slug": "scout", "login": f"scout-{org}", "person": f"p@{org}.example",
                        "run": {"triggers": [], "dispatch": "none"}}]}), f"{org}.yml",
            repository=False))
        forge.install_app(int(app_id), org)
        vaults.append((f"{org}/scout-vault", tokens[f"p-{org}"]))
    return vaults


async def _vault_payloads(embedded: Embedded, n: int,
                          vaults: list[tuple[str, str]] | None = None) -> list[dict[str, Any]]:
    """The `issues.opened` payloads of n new issues in scout's vault (or spread over `vaults`,
    in turn), opened by a person with the forge's webhooks dropped (the load client delivers
    them), and forgotten by the forge so that no reconciliation asks for them."""
    forge = embedded.forge
    vaults = vaults or [(f"{embedded.office.org}/scout-vault", embedded.forge_tokens["marco"])]
    limits = forge.limits.as_dict()  # set-up goes without the forge's limits (its own 80/min)
    forge.limits.update({"secondary_per_minute": 0, "secondary_per_hour": 0,
                         "endpoint_points_per_minute": 0})
    forge.faults.drop_webhooks(rate=1.0)
    todo = list(range(n))
    async with aiohttp.ClientSession() as session:
        async def maker() -> None:
            while todo:
                i = todo.pop()
                vault, token = vaults[i % len(vaults)]
                async with session.post(f"{forge.url}/repos/{vault}/issues", json={
                        "title": f"Bench mail {i}",
                        "body": f"Please look at item {i} of the quarterly numbers."},
                        headers={"Authorization": f"token {token}"}) as resp:
                    assert resp.status == 201, resp.status

        await asyncio.gather(*(maker() for _ in range(8)))
    forge.faults.drop_webhooks(rate=0.0)
    forge.limits.update(limits)
    payloads = []
    for d in list(forge.state.deliveries.values()):
        if d.event == "issues" and d.action == "opened" and d.payload["issue"]["title"].startswith(
                "Bench mail"):
            payloads.append(d.payload)
            del forge.state.deliveries[d.id]
    assert len(payloads) == n, len(payloads)
    return payloads


async def _write_transactions(session: aiohttp.ClientSession, apps: list[str]) -> float:
    """Write transactions every replica has committed so far (their /metrics, summed)."""
    total = 0.0
    for app in apps:
        async with session.get(f"{app}/metrics") as resp:
            for line in (await resp.text()).splitlines():
                if line.startswith("vaultmail_store_write_transactions_total "):
                    total += float(line.split()[1])
    return total


async def _until_drained(embedded: Embedded) -> None:
    for _ in range(12000):  # every replica's queue is the one table: until it is empty
        if not await embedded.services.store.pending_count():
            return
        await asyncio.sleep(0.05)


async def _cell(cell: str, workload: str, limits_on: bool, count: int,
                offices: int = 1, warm: int = 0) -> list[str]:
    url = "" if cell == "sqlite" else await pg.fresh_database()
    replicas = 1 if cell == "sqlite" else int(cell)
    embedded = await start_embedded(data_dir=Path(tempfile.mkdtemp()), port=0, forge_port=0,
                                    database_url=url,
                                    replica_id="replica-1" if replicas > 1 else "")
    others = []
    try:
        if not limits_on:
            # the forge's; the app still paces itself to GitHub's limits
            embedded.forge.limits.update({"secondary_per_minute": 0, "secondary_per_hour": 0,
                                          "endpoint_points_per_minute": 0})
        if workload == "mail":
            payloads = await _vault_payloads(embedded, warm + count + WARMUP)
        elif workload == "offices":
            vaults = _more_offices(embedded, offices)
            await embedded.settle()  # the installations' own webhooks handled first
            payloads = await _vault_payloads(embedded, warm + count + WARMUP, vaults)
        else:
            payloads = [await _non_vault_payload(embedded)]
        if replicas > 1:
            others = await start_replicas(embedded.services.settings, replicas - 1)
        urls = [embedded.app_url + "/webhook", *(r.url + "/webhook" for r in others)]
        if warm:  # handled and drained before the window: every replica's pool and caches
            # as a replica that has run a while has them (its connections opened, statements
            # prepared and planned), not as one just started
            spec = {"urls": urls, "event": "issues", "rate": None,
                    "secret": embedded.services.settings.webhook_secret,
                    "payloads": payloads[:warm] if len(payloads) > 1 else payloads,
                    "concurrency": IN_FLIGHT, "count": warm, "warmup": 0}
            await run_client("bench.intake", spec)
            await _until_drained(embedded)
            payloads = payloads[warm:] if len(payloads) > 1 else payloads
        waits = LockWaits(url) if url else None
        apps = [embedded.app_url, *(r.url for r in others)]
        async with aiohttp.ClientSession() as session:
            writes = -await _write_transactions(session, apps)
        async with waits or contextlib.nullcontext():
            cpu = CpuSplit([r.proc.pid for r in others if r.proc is not None],
                           waits.server if waits else None)
            cpu.start()
            start = time.perf_counter()
            result = await run_client("bench.intake", {  # its load client, in its own process
                "urls": urls, "event": "issues", "rate": None,
                "secret": embedded.services.settings.webhook_secret,
                "payloads": payloads, "concurrency": IN_FLIGHT, "count": count,
                "warmup": WARMUP})
            await _until_drained(embedded)
            handled = time.perf_counter() - start
            cpu.stop()
        async with aiohttp.ClientSession() as session:
            writes += await _write_transactions(session, apps)
        lat: list[float] = result["latencies"]
        bad = {s: n for s, n in result["statuses"].items() if s != "202"}
        refused = dict(embedded.forge.rates.refused)
        engine = "SQLite, 1 process" if cell == "sqlite" else f"PostgreSQL, {replicas} replica(s)"
        name = f"{offices} offices" if workload == "offices" else workload
        return [name, engine, "on" if limits_on else "off", f"{count / result['elapsed']:.0f}",
                ms(percentile(lat, 50)), ms(percentile(lat, 99)),
                f"{(count + WARMUP) / handled:.0f}",
                f"{writes / (count + WARMUP):.2f}",
                "-" if waits is None else f"{waits.commits / (count + WARMUP):.1f}",
                "-" if waits is None else waits.seconds_per_1000(count + WARMUP),
                cpu.per_1000(count + WARMUP),
                f"{bad or 'none'}; refused {refused or 'none'}"]
    finally:
        await asyncio.gather(*(r.stop() for r in others))
        await embedded.stop()
        if url:
            await pg.drop_database(url)


async def main(workloads: list[str], cells: list[str], count: int, mails: int,
               limits: str = "both", offices: int = 8, warm: int = 0) -> None:
    rows = []
    for workload, n in (("intake", count), ("mail", mails), ("offices", mails)):
        if workload not in workloads:
            continue
        for limits_on in (True, False) if limits == "both" else (limits == "on",):
            for cell in cells:
                rows.append(await _cell(cell, workload, limits_on, n, offices, warm))
                print("  ".join(rows[-1]), file=sys.stderr, flush=True)
    head = ["workload", "engine", "forge limits", "answered/s", "p50 ms", "p99 ms", "handled/s",
            "write transactions/event", "PostgreSQL transactions/event (reads too)",
            "lock-wait s per 1,000 events (by lock)",
            "CPU s per 1,000 events (by part; the load client's not counted)",
            "other answers; forge refusals"]
    print(f"command: .venv/bin/python -m bench.replicas --workloads {','.join(workloads)} "
          f"--count {count} --mails {mails} --cells {','.join(cells)} --limits {limits}"
          f" --offices {offices}" + (f" --warm {warm}" if warm else "") + "\n")
    print("| " + " | ".join(head) + " |")
    print("|" + "|".join("---" for _ in head) + "|")
    for row in rows:
        print("| " + " | ".join(row) + " |")


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--count", type=int, default=1500)
    parser.add_argument("--mails", type=int, default=200)
    parser.add_argument("--cells", default="sqlite,1,2,4")
    parser.add_argument("--workloads", default="intake,mail")
    parser.add_argument("--limits", choices=["on", "off", "both"], default="both")
    parser.add_argument("--offices", type=int, default=8,
                        help="organisations of the offices workload")
    parser.add_argument("--warm", type=int, default=0,
                        help="deliveries handled before each cell's window, not counted")
    args = parser.parse_args()
    run(main(args.workloads.split(","), args.cells.split(","), args.count, args.mails,
                     args.limits, args.offices, args.warm))
