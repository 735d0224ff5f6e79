"""`python -m tests.harness.skewed ARGS...`: `vaultmail ARGS...` (bot.cli.main) on a host whose
clock is off by `HARNESS_CLOCK_SKEW` seconds (negative: behind), as the fault harness starts a
replica with a skewed clock. `time.time` and `time.time_ns` are offset before the app is
imported; the monotonic clocks (asyncio's timers) are not, nor `datetime.now`, which reads the
system clock in C."""

from __future__ import annotations

import os
import runpy
import time

ENV = "HARNESS_CLOCK_SKEW"


def skew(seconds: float) -> None:
    """Offset this process's wall clock by `seconds`."""
    real_time, real_time_ns = time.time, time.time_ns
    offset_ns = round(seconds * 1e9)

    def skewed_time() -> float:
        return real_time() + seconds

    def skewed_time_ns() -> int:
        return real_time_ns() + offset_ns

    time.time = skewed_time
    time.time_ns = skewed_time_ns


def main() -> None:
    skew(float(os.environ.get(ENV) or 0))
    runpy.run_module("bot.cli.main", run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
