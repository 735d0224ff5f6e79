"""A task the app runs beside its requests for as long as it lives (the reconciler, pruning,
the doctor's schedule, the ledger's outbound webhooks, the email outbox): started once,
cancelled on stop."""

from __future__ import annotations

import asyncio


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
