"""The long soak under a trickle of mixed load, by hand (issues 27 and 28): nothing grows
without bound. The fault harness's cluster (tests/harness: the local forge and three `vaultmail
serve` replicas on PostgreSQL, or one on SQLite) takes one operation every `--every` seconds
for `--minutes` (builder's keyed sends through the tools, marco opening and closing issues in
scout's vault, scout's replies copied to builder), with no faults and the forge's own limits
off. Every `--sample` minutes it records each process's resident memory and open file
descriptors, the rows of every table, the database's size and the bytes of log written; at
the end, once the queue is empty, it checks every mail was indexed once and the ledger
verifies, then prunes as the leader would once the retention time has passed
(`bot.store.prune`, the clock moved on by it) and shows what is left: the office's record
(mail, comments, ledger), which is never pruned.

    python -m bench.trickle --minutes 30 --engine postgresql
    python -m bench.trickle --minutes 30 --engine sqlite
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

import aiohttp

from bot.store import ledger, open_store
from bot.store.prune import DAY, prune
from tests.harness import runner
from tests.harness.schedule import Engine, Schedule, make_schedule

Sample = dict[str, float]


def _proc(pid: int) -> tuple[float, int]:
    """(resident memory in MiB, open file descriptors) of a live process."""
    rss_kb = 0
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                rss_kb = int(line.split()[1])
    return rss_kb / 1024, len(os.listdir(f"/proc/{pid}/fd"))


async def _tables(store: object, engine: Engine) -> dict[str, int]:
    from bot.store.db import Store
    assert isinstance(store, Store)
    if engine == "postgresql":
        names = [r[0] for r in await store.fetchall(
            "SELECT tablename FROM pg_tables WHERE schemaname = current_schema()")]
    else:
        names = [r[0] for r in await store.fetchall(
            "SELECT name FROM sqlite_master WHERE type='table' AND name NOT LIKE 'sqlite_%'")]
    counts = {}
    for name in sorted(names):
        row = await store.fetchone(f'SELECT count(*) FROM "{name}"')
        counts[name] = int(row[0]) if row else 0
    return counts


async def _db_bytes(c: runner.Cluster, engine: Engine) -> int:
    if engine == "sqlite":
        base = Path(c.database_url)
        return sum(p.stat().st_size for p in base.parent.glob(base.name + "*"))
    store = await open_store(c.database_url)
    try:
        row = await store.fetchone("SELECT pg_database_size(current_database())")
        return int(row[0]) if row else 0
    finally:
        await store.close()


async def sample(c: runner.Cluster, engine: Engine, ops: int) -> tuple[Sample, dict[str, int]]:
    s: Sample = {"ops": ops}
    for n, p in enumerate(c.procs):
        assert p.proc is not None
        rss, fds = _proc(p.proc.pid)
        s[f"replica-{n + 1} RSS MiB"] = round(rss, 1)
        s[f"replica-{n + 1} fds"] = fds
    rss, fds = _proc(os.getpid())
    s["forge+clients RSS MiB"], s["forge+clients fds"] = round(rss, 1), fds
    s["log KiB"] = round(sum(p.log_path.stat().st_size for p in c.procs
                             if p.log_path and p.log_path.exists()) / 1024, 1)
    s["database KiB"] = round(await _db_bytes(c, engine) / 1024, 1)
    store = await open_store(c.database_url)
    try:
        tables = await _tables(store, engine)
    finally:
        await store.close()
    return s, tables


async def soak(engine: Engine, minutes: float, every: float, sample_minutes: float,
               seed: int, workdir: Path) -> int:
    steps = int(minutes * 60 / every) + 1
    plan = make_schedule(seed, engine=engine, steps=steps, faults=0)
    schedule = Schedule(seed, engine, plan.replicas, plan.ops, ())
    samples: list[tuple[str, Sample, dict[str, int]]] = []
    failures: list[str] = []
    async with runner.cluster(schedule, workdir) as c:
        # the forge's own limits off: people's clients here do not pace themselves, and what
        # is measured is growth, not GitHub's limits (the app still paces its writes to them)
        c.forge.limits.update({"secondary_per_minute": 0, "secondary_per_hour": 0,
                               "endpoint_points_per_minute": 0})
        player = runner.Player(schedule, c)
        async with aiohttp.ClientSession(timeout=runner.CLIENT_TIMEOUT) as player.session:
            asks = sum(op.kind == "ask" for op in schedule.ops)
            for k in range(-(-asks // runner.PER_ITEM)):  # the outcomes questions are asked on
                item = await player.forge(
                    "POST", f"/repos/{runner.SCOUT}/issues", "marco",
                    {"title": f"Trickle outcome {k}", "body": "questions",
                     "labels": ["outcome"], "assignees": ["scout-bot"]}, 201)
                player.items.append(f"{runner.SCOUT}#{item['number']}")
            loop = asyncio.get_running_loop()
            start = loop.time()
            next_sample = start
            for step, op in enumerate(schedule.ops):
                now = loop.time()
                if now >= next_sample:
                    s, t = await sample(c, engine, step)
                    samples.append((f"{(now - start) / 60:.0f} min", s, t))
                    print(f"{samples[-1][0]}: {s}", flush=True)
                    next_sample += sample_minutes * 60
                await player.do(op)
                await asyncio.sleep(max(0.0, start + (step + 1) * every - loop.time()))
            await asyncio.wait_for(asyncio.gather(*player.tasks), 600.0)  # paced writes land
            await c.forge.webhooks_idle()
            for _ in range(3000):  # the queue draining: polled, another process's state
                if not await player.pending():
                    break
                await asyncio.sleep(0.2)
            s, t = await sample(c, engine, len(schedule.ops))
            samples.append(("end", s, t))
            expected = len(player.expected())
            store = await open_store(c.database_url)
            try:
                mails = (await store.fetchone("SELECT count(*) FROM mails"))
                if mails is None or int(mails[0]) != expected:
                    failures.append(f"index holds {mails and mails[0]} mails, expected "
                                    f"{expected}")
                if (broken := await ledger.verify_chain(store)) is not None:
                    failures.append(f"the ledger's chain breaks at seq {broken}")
                keep = c.env.get("VAULTMAIL_RETENTION_DAYS") or "7"
                deleted = await prune(store, now=time.time() + float(keep) * DAY + 1,
                                      keep=float(keep) * DAY)
                after = await _tables(store, engine)
            finally:
                await store.close()
            failures += [f"refused: {r}" for r in player.refused]
    _print(engine, minutes, every, seed, samples, deleted, after, expected)
    for f in failures:
        print("FAILED:", f)
    return 1 if failures else 0


def _print(engine: Engine, minutes: float, every: float, seed: int,
           samples: Sequence[tuple[str, Sample, dict[str, int]]], deleted: dict[str, int],
           after: dict[str, int], mails: int) -> None:
    print(f"\n`python -m bench.trickle --engine {engine} --minutes {minutes:g} --every "
          f"{every:g} --seed {seed}`: {mails} mails\n")
    heads = [label for label, _, _ in samples]
    print("| | " + " | ".join(heads) + " |")
    print("|---|" + "---|" * len(heads))
    for key in samples[0][1]:
        print(f"| {key} | " + " | ".join(f"{s.get(key, 0):g}" for _, s, _ in samples) + " |")
    tables = sorted({name for _, _, t in samples for name in t} | set(after))
    print(f"\n| table (rows) | {' | '.join(heads)} | after pruning at +retention |")
    print("|---|" + "---|" * (len(heads) + 1))
    for name in tables:
        if any(t.get(name) for _, _, t in samples):
            print(f"| {name} | " + " | ".join(str(t.get(name, 0)) for _, _, t in samples)
                  + f" | {after.get(name, 0)} |")
    print(f"\npruned: {deleted}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--engine", choices=("postgresql", "sqlite"), default="postgresql")
    p.add_argument("--minutes", type=float, default=30.0)
    p.add_argument("--every", type=float, default=6.0, help="seconds between operations")
    p.add_argument("--sample", type=float, default=5.0, help="minutes between samples")
    p.add_argument("--seed", type=int, default=2030)
    a = p.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="vaultmail-trickle-"))
    try:
        code = asyncio.run(soak(a.engine, a.minutes, a.every, a.sample, a.seed, work))
    finally:
        if not os.environ.get("VAULTMAIL_KEEP"):
            shutil.rmtree(work, ignore_errors=True)
    return code


if __name__ == "__main__":
    sys.exit(main())
