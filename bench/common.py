"""Helpers shared by the benchmarks: percentiles, and a load client in its own process (so the
app's event loop is not also the load generator's)."""

from __future__ import annotations

import asyncio
import json
import math
import os
import sys
import tempfile
from collections.abc import Coroutine, Sequence
from pathlib import Path
from typing import Any, TypeVar

from bot.cli.main import loop_factory

RESULT_ENV = "VAULTMAIL_BENCH_RESULT"  # where a --client writes its JSON result

T = TypeVar("T")


def percentile(values: Sequence[float], p: float) -> float:
    """Nearest-rank percentile (p in 0..100) of `values`; 0.0 for no values."""
    if not values:
        return 0.0
    ordered = sorted(values)
    rank = max(1, math.ceil(p / 100 * len(ordered)))
    return ordered[rank - 1]


def ms(seconds: float) -> str:
    return f"{seconds * 1000:.1f}"


async def run_client(module: str, spec: dict[str, Any]) -> dict[str, Any]:
    """Run `python -m MODULE --client` with `spec` as JSON on stdin; its JSON result back.

    The app keeps serving on this process's loop meanwhile. The result comes through a file
    named in the environment, not stdout: a pipe read by one event loop and written by a
    process whose loop made it non-blocking cut results past 64 KiB now and then."""
    with tempfile.TemporaryDirectory(prefix="vaultmail-bench-") as tmp:
        path = Path(tmp) / "result.json"
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", module, "--client", stdin=asyncio.subprocess.PIPE,
            env={**os.environ, RESULT_ENV: str(path)})
        await proc.communicate(json.dumps(spec).encode())
        if proc.returncode != 0:
            raise RuntimeError(f"{module} --client exited with {proc.returncode}")
        result: dict[str, Any] = json.loads(path.read_bytes())
    return result


def cpu_seconds(pids: Sequence[int]) -> float:
    """User and system CPU seconds the live processes `pids` have used so far (Linux's /proc;
    0.0 for one that is gone)."""
    total = 0.0
    for pid in pids:
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rfind(")") + 2:].split()  # after the command, which may hold spaces
        total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return total


def children_of(parent: int) -> list[int]:
    """The pids of `parent`'s live child processes (a PostgreSQL server's backends)."""
    kids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            if int(stat[stat.rfind(")") + 2:].split()[1]) == parent:
                kids.append(int(entry.name))
    return kids


def run(main: Coroutine[Any, Any, T]) -> T:
    """Run a bench (or its load client) on the event loop `vaultmail serve` runs on: uvloop's
    where it is installed. An app started in-process then runs as deployed, and a client on
    the same cores costs what it must."""
    with asyncio.Runner(loop_factory=loop_factory()) as runner:
        return runner.run(main)


def client_main(handler: Any) -> None:
    """Entry of a `--client` subprocess: spec on stdin, `await handler(spec)` as JSON to the file
    run_client names."""
    spec = json.loads(sys.stdin.read())
    result = run(handler(spec))
    Path(os.environ[RESULT_ENV]).write_text(json.dumps(result))
    # Leave without the interpreter's teardown of the bench's imports (0.25 s of CPU on this
    # 2-core machine): an app that answers every POST early, as vaultmail does, would otherwise
    # do its writes beside it, inside the window being measured.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
