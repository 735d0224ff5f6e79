"""Webhook intake latency under load.

Signed deliveries (valid X-Hub-Signature-256 with the app's secret, a fresh X-GitHub-Delivery
uuid each) are POSTed straight to the embedded app's /webhook by a load client running in its
own process: `issues.opened` in a repository of the org that is no vault (the payload the local
forge itself sent for such an issue; the worker reads the office config, a 304, and finds
nothing to do) at 1, 10 and 50 in flight (closed loop) and at a fixed 40 and 150 a second (open
loop: below and above what the worker drains), then `ping` at 50 in flight (no handler: intake
and queue alone).
Reported: answer latency p50/p95/p99/max, deliveries accepted a second, and the worker's
drain: seconds from the last answer until the queue is empty, deliveries handled a second from
the first POST to the empty queue, and a second by the worker alone once the load has stopped.
Each level is drained before the next starts.

Run: .venv/bin/python -m bench.intake [--levels 3,6]
     BENCH_PROFILE=/tmp/profiles/intake: py-spy's raw stacks of this process while each level's
     load runs (not its drain), to /tmp/profiles/intake.<event>.<load>; summarise them with
     bench.profile_summary
Target (DESIGN §6): webhook intake answered in under 50 ms at p99 under load.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import aiohttp

from bench.common import client_main, ms, percentile, run, run_client
from bot.app.embedded import Embedded, start_embedded

# (event, in flight, offered rate a second, deliveries): a fixed number in flight (closed loop:
# each sender posts again as soon as answered), or a fixed arrival rate (open loop) when given.
LEVELS: list[tuple[str, int, float | None, int]] = [
    ("issues", 1, None, 300), ("issues", 10, None, 1000), ("issues", 50, None, 1500),
    ("issues", 0, 40.0, 600), ("issues", 0, 150.0, 900), ("ping", 50, None, 1000)]
WARMUP = 20
TARGET_P99 = 0.050


# -- the load client (its own process) --------------------------------------------------------
async def _load(spec: dict[str, Any]) -> dict[str, Any]:
    """Signed deliveries of spec's payloads in turn, to its URLs in turn (a load balancer's
    round robin: bench.replicas), fresh delivery ids."""
    bodies = [json.dumps(p).encode() for p in spec["payloads"]]
    signatures = ["sha256=" + hmac.new(spec["secret"].encode(), b, hashlib.sha256).hexdigest()
                  for b in bodies]
    urls, event = spec["urls"], spec["event"]
    sent = 0
    latencies: list[float] = []
    statuses: dict[str, int] = {}
    remaining = spec["count"]
    connector = aiohttp.TCPConnector(limit=spec["concurrency"] or 500)
    async with aiohttp.ClientSession(connector=connector) as session:
        async def post() -> None:
            nonlocal sent
            url, body = urls[sent % len(urls)], bodies[sent % len(bodies)]
            headers = {"X-GitHub-Event": event, "X-GitHub-Delivery": str(uuid.uuid4()),
                       "X-Hub-Signature-256": signatures[sent % len(bodies)],
                       "Content-Type": "application/json", "User-Agent": "GitHub-Hookshot/bench"}
            sent += 1
            t = time.perf_counter()
            async with session.post(url, data=body, headers=headers) as resp:
                await resp.read()
            latencies.append(time.perf_counter() - t)
            statuses[str(resp.status)] = statuses.get(str(resp.status), 0) + 1

        async def sender() -> None:
            nonlocal remaining
            while remaining > 0:
                remaining -= 1
                await post()

        async def at(when: float) -> None:
            await asyncio.sleep(max(0.0, when - time.perf_counter()))
            await post()

        for _ in range(spec["warmup"]):
            await post()
        latencies.clear()
        statuses.clear()
        start = time.perf_counter()
        if spec["rate"]:
            await asyncio.gather(*(at(start + i / spec["rate"]) for i in range(spec["count"])))
        else:
            await asyncio.gather(*(sender() for _ in range(spec["concurrency"])))
        elapsed = time.perf_counter() - start
    return {"latencies": latencies, "statuses": statuses, "elapsed": elapsed}


# -- the run ----------------------------------------------------------------------------------
async def _non_vault_payload(embedded: Embedded) -> dict[str, Any]:
    """The `issues.opened` payload the forge sends for an issue in acme/website (no vault)."""
    org = embedded.office.org
    embedded.forge.add_repo(org, "website")
    embedded.forge.set_permission(f"{org}/website", "marco", "write")
    await embedded.settle()
    async with aiohttp.ClientSession() as session, session.post(
            f"{embedded.forge.url}/repos/{org}/website/issues",
            json={"title": "Fix the footer", "body": "The footer overlaps on mobile."},
            headers={"Authorization": f"token {embedded.forge_tokens['marco']}"}) as resp:
        assert resp.status == 201, resp.status
    await embedded.settle()
    row = await embedded.services.store.fetchone(
        "SELECT payload FROM queue WHERE event='issues' ORDER BY id DESC LIMIT 1")
    assert row is not None
    payload: dict[str, Any] = json.loads(row["payload"])
    assert payload["action"] == "opened" and payload["repository"]["name"] == "website"
    return payload


PING = {"zen": "Keep it logically awesome.", "hook_id": 1,
        "hook": {"type": "App", "id": 1, "events": ["issues"], "active": True}}


async def main(levels: list[tuple[str, int, float | None, int]]) -> None:
    embedded = await start_embedded(data_dir=Path(tempfile.mkdtemp()), port=0, forge_port=0)
    rows: list[list[str]] = []
    failures: list[str] = []
    try:
        store = embedded.services.store
        issue = await _non_vault_payload(embedded)
        for event, concurrency, rate, count in levels:
            await embedded.settle()
            done_before = await store.fetchone("SELECT count(*) AS n FROM queue")
            profiler = None
            if profile := os.environ.get("BENCH_PROFILE"):
                # py-spy's raw stacks of this process (app, worker and forge: one event loop)
                # while the load client posts, one file per level; --gil: the GIL holder only
                gil = ["--gil"] if os.environ.get("BENCH_PROFILE_GIL") else []
                profiler = await asyncio.create_subprocess_exec(
                    str(Path(sys.executable).parent / "py-spy"), "record", "-r", "250", "-f",
                    "raw", "--threads", *gil, "-o",
                    f"{profile}.{event}.{concurrency or f'{rate:.0f}s'}",
                    "--pid", str(os.getpid()),
                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                await asyncio.sleep(1.0)  # py-spy attached before the first POST
            start = time.perf_counter()
            result = await run_client("bench.intake", {
                "urls": [embedded.app_url + "/webhook"],
                "secret": embedded.services.settings.webhook_secret,
                "event": event, "payloads": [issue if event == "issues" else PING],
                "concurrency": concurrency, "rate": rate, "count": count, "warmup": WARMUP})
            answered = time.perf_counter()
            if profiler is not None:  # py-spy writes its stacks on SIGINT
                profiler.send_signal(signal.SIGINT)
                await profiler.wait()
            backlog = await store.pending_count()
            await embedded.worker.idle(timeout=300)
            drained = time.perf_counter()
            after = await store.fetchone("SELECT count(*) AS n FROM queue")
            queued = (after["n"] if after else 0) - (done_before["n"] if done_before else 0)
            lat: list[float] = result["latencies"]
            bad = {s: n for s, n in result["statuses"].items() if s != "202"}
            load = f"{rate:.0f}/s offered" if rate else f"{concurrency} in flight"
            if bad:
                failures.append(f"{event}, {load}: answers other than 202: {bad}")
            dead = await store.dead_letters()
            if dead:
                failures.append(f"{event}, {load}: {len(dead)} dead letters")
            p99 = percentile(lat, 99)
            rows.append([
                f"{event}{'.opened (no vault)' if event == 'issues' else ''}", load,
                f"{len(lat)} ({queued} queued)", ms(percentile(lat, 50)), ms(percentile(lat, 95)),
                ms(p99), ms(max(lat)), f"{len(lat) / result['elapsed']:.0f}",
                f"{drained - answered:.2f}", f"{count / (drained - start):.0f}",
                f"{backlog / (drained - answered):.0f}" if backlog > 20 else "-",
                f"{'OK' if p99 < TARGET_P99 else 'FAIL'} (<{TARGET_P99 * 1000:.0f} ms)"])
    finally:
        await embedded.stop()
    args = "".join(f" {a}" for a in sys.argv[1:])
    print(f"command: .venv/bin/python -m bench.intake{args}\n")
    head = ["event", "load", "deliveries", "p50 ms", "p95 ms", "p99 ms", "max ms",
            "accepted/s", "drain after last answer s", "handled/s (first POST to empty queue)",
            "handled/s (worker alone)", "p99 target"]
    print("| " + " | ".join(head) + " |")
    print("|" + "|".join("---" for _ in head) + "|")
    for row in rows:
        print("| " + " | ".join(row) + " |")
    print(f"\n{WARMUP} warm-up deliveries per level not counted; load client in its own process; "
          "2-core machine shared with other work.")
    for line in failures:
        print(f"- {line}")


if __name__ == "__main__":
    if "--client" in sys.argv:
        client_main(_load)
    else:
        # --levels 3,6: only those rows of LEVELS (1-based), e.g. under a profiler
        chosen = LEVELS
        if "--levels" in sys.argv:
            picks = sys.argv[sys.argv.index("--levels") + 1]
            chosen = [LEVELS[int(i) - 1] for i in picks.split(",")]
        run(main(chosen))
