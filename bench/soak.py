"""The fault harness's long soak, by hand (issues 27 and 28): random seeds (or `--seed N`
first), each a schedule of faults over a mixed workload played against the local forge and the
app (tests/harness), on PostgreSQL with three replicas (one with its host clock off) and on
SQLite with one process, some of the app's own writes lost by the forge after it answered them
(`vaultmail doctor`, run while settling, is to repair them), until `--minutes` are spent.
Prints each schedule tried (faults by kind, and what they did) and its result as a table,
with the command that runs it again.

    python -m bench.soak --minutes 5
    python -m bench.soak --seed 2027 --engine postgresql --minutes 0   # one seed again
"""

from __future__ import annotations

import argparse
import asyncio
import random
import shutil
import sys
import tempfile
import time
from pathlib import Path

from tests.harness import runner
from tests.harness.schedule import Engine, make_schedule


def _counts(counts: dict[str, int]) -> str:
    return " ".join(f"{k}={v}" for k, v in counts.items()) or "-"


def _skew(skew: tuple[int, float] | None) -> str:
    return "-" if skew is None else f"replica {skew[0] + 1} {skew[1]:+.0f} s"


async def soak(seeds: list[int], engines: list[Engine], minutes: float, steps: int,
               faults: int, close_unseen: bool = True) -> int:
    rows: list[tuple[str, ...]] = []
    failed = 0
    deadline = time.monotonic() + minutes * 60
    rng = random.Random()
    n = 0
    while True:
        seed = seeds[n] if n < len(seeds) else rng.randrange(1, 1_000_000)
        engine = engines[n % len(engines)]
        n += 1
        schedule = make_schedule(seed, engine=engine, steps=steps, faults=faults)
        work = Path(tempfile.mkdtemp(prefix=f"vaultmail-soak-{seed}-"))
        try:
            report = await runner.run(schedule, work, close_unseen=close_unseen)
        except Exception as exc:  # the harness itself gave way: reported, not hidden
            report = runner.Report(schedule, failures=[f"harness error: {exc!r}"])
        command = (f"python -m bench.soak --seed {seed} --engine {engine} --steps {steps} "
                   f"--faults {faults} --minutes 0"
                   + ("" if close_unseen else " --close-seen"))
        if report.ok:
            shutil.rmtree(work, ignore_errors=True)
        else:
            failed += 1
            print(report.explain(), f"\n(logs kept in {work})", file=sys.stderr)
        rows.append((str(seed), engine, _counts(schedule.op_counts()),
                     _counts(schedule.fault_counts()), _counts(report.fired),
                     _skew(schedule.skew), str(report.repaired), str(report.mails),
                     f"{report.seconds:.0f}",
                     "ok" if report.ok else f"FAILED ({len(report.failures)})", command))
        print(" | ".join(rows[-1]), flush=True)
        if n >= len(seeds) and time.monotonic() >= deadline:
            break
    head = ("seed", "engine", "workload", "faults scheduled", "faults that fired", "clock skew",
            "doctor repaired", "mails", "s", "result", "again")
    print()
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    for row in rows:
        print("| " + " | ".join(row[:-1]) + f" | `{row[-1]}` |")
    return 1 if failed else 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.soak", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seed", type=int, action="append", default=[],
                   help="a seed to run first (repeatable); then random seeds")
    p.add_argument("--minutes", type=float, default=5.0,
                   help="go on with random seeds until this many minutes are spent")
    p.add_argument("--engine", choices=("both", "postgresql", "sqlite"), default="both")
    p.add_argument("--steps", type=int, default=40, help="workload steps a schedule")
    p.add_argument("--faults", type=int, default=14, help="faults a schedule")
    p.add_argument("--close-seen", dest="close_unseen", action="store_false",
                   help="marco closes an issue only once he sees it labelled as mail (by "
                        "default he closes it at its step, taken in by the app or not)")
    p.add_argument("--close-unseen", dest="close_unseen", action="store_true",
                   help=argparse.SUPPRESS)  # the default now (issue 28); kept for old commands
    args = p.parse_args(argv)
    engines: list[Engine] = (["postgresql", "sqlite"] if args.engine == "both"
                             else [args.engine])
    return asyncio.run(soak(args.seed, engines, args.minutes, args.steps, args.faults,
                            args.close_unseen))


if __name__ == "__main__":
    raise SystemExit(main())
