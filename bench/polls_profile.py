"""1,000 real HTTP `list_inbox` long polls woken together (bench.inbox's HTTP row), to find
where the time from the notify to the last answer goes. Each mode runs in one process, the
rows side by side:

  (default)   the store's reads as aiosqlite's cursor makes them (three hops to the
              connection's thread each) against the store as it is (reads batched, one hop
              for all those asked in one turn of the loop), alternating
  --plain     this tree as it is, only (to compare two checkouts, run it in each, alternating)
  --floor     the inbox reads made free (compute and updates_page return empty boxes) against
              the real ones: what HTTP, the wake-up and the JSON cost alone
  --count     how many reads of each kind the 1,000 polls make
  --alone     (with any of the above) each woken poll looks at its inbox for itself, as if
              every poll were another viewer's: without the single flight that shares one
              look among one viewer's polls ended by one wake-up (bench.inbox's 1,000 polls
              are three people's, so with it they make three looks)
  --profile   pyinstrument over the wake-up (from the notify to the last answer), written to
              /tmp/polls_profile.txt
  --python-gc (with any of the above) the process collects garbage with Python's own
              thresholds and nothing frozen, as bench.inbox did before it collected as
              `serve` does (bot.cli.main.collect_as_served)

Run: .venv/bin/python -m bench.polls_profile [ROUNDS] [--plain|--floor|--count|--profile]
[--alone] [--python-gc]
"""

import sys
import tempfile
from collections import Counter
from pathlib import Path
from typing import Any

from bench import inbox as b
from bench.common import run
from bot.app.embedded import start_embedded
from bot.store.db import Store

NEW = (Store.fetchall, Store.fetchone)


async def _old_fetchall(self: Store, sql: str, params: tuple[Any, ...] = ()) -> Any:
    async with self._db.execute(sql, params) as cur:
        return list(await cur.fetchall())


async def _old_fetchone(self: Store, sql: str, params: tuple[Any, ...] = ()) -> Any:
    async with self._db.execute(sql, params) as cur:
        return await cur.fetchone()

COUNTS: Counter[str] = Counter()


def counting(fn: Any) -> Any:
    async def wrapped(self: Store, sql: Any, params: tuple[Any, ...] = ()) -> Any:
        COUNTS[str(sql).split(" WHERE")[0][:70]] += 1
        return await fn(self, sql, params)
    return wrapped


async def main(profile: bool, rounds: int, count: bool) -> None:
    e = await start_embedded(data_dir=Path(tempfile.mkdtemp()), port=0, forge_port=0)
    if "--python-gc" not in sys.argv:  # as bench.inbox: the process collects as `serve` does
        from bot.cli.main import collect_as_served

        collect_as_served()
    if "--alone" in sys.argv:
        together = getattr(e.services.notifier, "together", None)
        if together is not None:  # (a tree before the single flight has none)
            async def once(key: Any, compute: Any, shareable: Any) -> Any:
                return await compute(), False
            together.once = once
    try:
        await b.hold_http_polls(e, 1000, trace=False)  # warm
        if count:  # the engine's own reads (SqliteStore batches them: its methods, not Store's)
            engine = type(e.services.store)
            real = engine.fetchall, engine.fetchone
            engine.fetchall, engine.fetchone = counting(real[0]), counting(real[1])  # type: ignore[method-assign]
            COUNTS.clear()
            await b.hold_http_polls(e, 1000, trace=False)
            for k, v in COUNTS.most_common():
                print(f"{v:6d} {k}")
            engine.fetchall, engine.fetchone = real  # type: ignore[method-assign]
        if "--floor" in sys.argv:  # the inbox reads made free: HTTP, wake-up and JSON alone
            from bot.items import inbox
            real = inbox.compute, inbox.updates_page
            # (shaped as a real look with nothing in it: list_inbox reads `you.unread`)
            empty = inbox.Computed({box: {"yourTurn": [], "unread": [], "waitingOnOthers": []}
                                    for box in ("you", "agents")}, 0, 0)

            async def compute(*a: Any, **k: Any) -> Any:
                return empty

            async def updates_page(*a: Any, **k: Any) -> Any:
                return {"updates": [], "moreUpdatesBefore": None}
            for r in range(rounds):
                for name, fns in (("floor", (compute, updates_page)), ("real", real)):
                    inbox.compute, inbox.updates_page = fns  # type: ignore[assignment]
                    res = await b.hold_http_polls(e, 1000, trace=False)
                    print(f"round {r} {name}: p50 {res['p50']*1000:.1f} p99 "
                          f"{res['p99']*1000:.1f} max {res['max']*1000:.1f} ms", flush=True)
            return
        if "--plain" in sys.argv:  # this tree as it is
            for r in range(rounds):
                res = await b.hold_http_polls(e, 1000, trace=False)
                print(f"round {r} plain: p50 {res['p50']*1000:.1f} p99 {res['p99']*1000:.1f}"
                      f" max {res['max']*1000:.1f} ms", flush=True)
            return
        prof = None
        if profile:
            from pyinstrument import Profiler
            prof = Profiler(interval=0.001, async_mode="disabled")
        for r in range(rounds):
            for name, impl in (("old", (_old_fetchall, _old_fetchone)), ("new", NEW)):
                if profile and name == "old":
                    continue
                Store.fetchall, Store.fetchone = impl
                orig = e.services.notifier.notify
                if prof is not None:
                    def notify(ps: Any, *, org: str, _o: Any = orig) -> None:
                        prof.start()
                        _o(ps, org=org)
                    e.services.notifier.notify = notify  # type: ignore[method-assign]
                res = await b.hold_http_polls(e, 1000, trace=False)
                if prof is not None:
                    prof.stop()
                    e.services.notifier.notify = orig  # type: ignore[method-assign]
                print(f"round {r} {name}: p50 {res['p50']*1000:.1f} p99 {res['p99']*1000:.1f}"
                      f" max {res['max']*1000:.1f} ms", flush=True)
        if prof is not None:
            Path("/tmp/polls_profile.txt").write_text(
                prof.output_text(unicode=False, color=False, show_all=False))
    finally:
        await e.stop()

if __name__ == "__main__":
    if "--client" in sys.argv:
        from bench.common import client_main
        client_main(b._polls)
    else:
        n = [a for a in sys.argv[1:] if a.isdigit()]
        run(main("--profile" in sys.argv, int(n[0]) if n else 3, "--count" in sys.argv))
