"""An agent's command gets its own stdin, stdout and stderr, and no descriptor of the app's.

`vaultmail serve` runs on uvloop, whose subprocesses ignore close_fds: a descriptor the app
was started with (a supervisor's socket, a launcher's pipe) would reach every command it
runs. Checked on the event loop the CLI runs (`bot.cli.main.loop_factory`)."""

from __future__ import annotations

import asyncio
import os
import sys

import pytest

from bot.app.runs import _execute
from bot.cli.main import loop_factory

# (the listing's own descriptor is gone by the time it is read: `|| true`)
LIST = 'for f in /proc/self/fd/*; do readlink "$f" || true; done'


def _child_sees() -> list[str]:
    async def run() -> list[str]:
        result = await _execute(["sh", "-c", LIST], 10.0, dict(os.environ), b"", "/")
        assert result["exit"] == 0, result
        return str(result["stdout"]).split()

    with asyncio.Runner(loop_factory=loop_factory()) as runner:
        return runner.run(run())


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/fd")
def test_a_descriptor_the_app_was_started_with_does_not_reach_an_agents_command() -> None:
    read, write = os.pipe()
    os.set_inheritable(read, True)  # as a launcher hands one down
    os.set_inheritable(write, True)
    target = os.readlink(f"/proc/self/fd/{read}")
    try:
        seen = _child_sees()
    finally:
        os.close(read)
        os.close(write)
    assert target not in seen
