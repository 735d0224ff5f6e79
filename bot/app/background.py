"""A task the app runs beside its requests for as long as it lives (the reconciler, pruning,
the doctor's schedule, the ledger's outbound webhooks, the email outbox): started once,
cancelled on stop."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Coroutine
from typing import Any


def backoff(failures: int, cap: float, base: float = 0.5) -> float:
    """The wait after `failures` failures in a row: `base` doubling, at most `cap`. A sender
    fails for good when its receiver is gone, and its count keeps climbing: 2 ** failures as a
    float overflows past 1,023 of them (3.5 days at 5 minutes apart), so the exponent stops
    where `cap` was long reached."""
    return min(cap, base * 2.0 ** min(max(failures, 0), 62))


log = logging.getLogger("vaultmail.background")
Work = Callable[[], Coroutine[Any, Any, None]]  # one key's work in a round (`Rounds`)


class Background:
    """Subclasses name the task and give its `_run` loop."""

    task_name = "vaultmail-background"

    def __init__(self) -> None:
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name=self.task_name)

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    async def _run(self) -> None:
        raise NotImplementedError


class Rounds(Background):
    """A loop of rounds, run by one replica at a time (`_leading`), each woken by `wake()` or
    `poll` seconds after the last: a round names the work there is by key (`_round`), and each
    key's work runs in a task of its own, one at a time per key, so a key whose work is slow
    (a receiver that never answers, a forge waiting out one office's limits) holds up no
    other key's."""

    poll = 0.5  # seconds between rounds when nothing woke the loop

    def __init__(self) -> None:
        super().__init__()
        self._wake = asyncio.Event()

    def wake(self) -> None:
        self._wake.set()

    async def _leading(self) -> bool:
        raise NotImplementedError

    async def _round(self) -> list[tuple[str, Work]]:
        """(key, work) for this round; a key whose work from an earlier round still runs is
        left to it."""
        raise NotImplementedError

    async def _run(self) -> None:
        running: dict[str, asyncio.Task[None]] = {}
        try:
            while True:
                try:
                    if await self._leading():
                        running = {k: t for k, t in running.items() if not t.done()}
                        for key, work in await self._round():
                            if key not in running:
                                running[key] = asyncio.create_task(
                                    work(), name=f"{self.task_name}:{key}")
                except Exception as exc:  # keep going whatever one round did
                    log.warning("%s: a round failed: %r", self.task_name, exc)
                self._wake.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), self.poll)
        finally:
            for task in running.values():
                task.cancel()
            await asyncio.gather(*running.values(), return_exceptions=True)
