"""Issue 23: the tests' throwaway PostgreSQL (tests/pg.py) leaves nothing behind in the temp
directory, even after a test process is killed (its exit handler never runs): the next test
process stops a cluster whose owner is gone and removes its directory. Clusters whose owner
still runs are left alone. Each process here is a real one, killed as a worker would be."""

from __future__ import annotations

import asyncio
import os
import sys
import tempfile
from pathlib import Path

import pytest

from tests import needs, pg

ROOT = Path(__file__).resolve().parent.parent
# a test process: start the cluster, say where, then die without its exit handlers (SIGKILL)
# or end normally
START = ("import os, signal, sys; from tests import pg; print(pg.cluster_url(), flush=True); "
         "sys.stdin.readline(); "
         "os.kill(os.getpid(), signal.SIGKILL) if sys.argv[1] == 'kill' else None")


async def _process(how: str, tmp: Path) -> tuple[asyncio.subprocess.Process, str]:
    env = {k: v for k, v in os.environ.items() if k != "VAULTMAIL_TEST_PG"}
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-c", START, how, cwd=str(ROOT), env={**env, "TMPDIR": str(tmp)},
        stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE)
    assert proc.stdout is not None
    url = (await asyncio.wait_for(proc.stdout.readline(), 120)).decode().strip()
    assert url.startswith("postgresql://"), url
    return proc, url


async def _end(proc: asyncio.subprocess.Process) -> int:
    assert proc.stdin is not None
    proc.stdin.write(b"\n")
    await proc.stdin.drain()
    return await asyncio.wait_for(proc.wait(), 120)


def _clusters(tmp: Path) -> list[Path]:
    return sorted(tmp.glob("vaultmail-pg-*"))


async def _answers(url: str) -> bool:
    import asyncpg

    try:
        conn = await asyncpg.connect(url, timeout=10)
    except (OSError, asyncpg.PostgresError):
        return False
    await conn.close()
    return True


async def test_a_killed_test_process_leaves_no_cluster_behind() -> None:
    try:
        needs.postgresql()
    except needs.Missing as exc:
        pytest.fail(str(exc), pytrace=False)
    # a temp directory the cluster's own user can reach (pytest's tmp_path is root's alone)
    with tempfile.TemporaryDirectory(prefix="vm-pg-leftovers-") as name:
        tmp = Path(name)
        tmp.chmod(0o755)
        try:
            await _leftovers(tmp)
        finally:  # whatever a failure left running here
            for home in _clusters(tmp):
                stop = await asyncio.create_subprocess_exec(
                    *pg._as_user(), str(pg.bin_dir() / "pg_ctl"), "-D", str(home / "data"),
                    "-m", "immediate", "stop", stdout=asyncio.subprocess.DEVNULL,
                    stderr=asyncio.subprocess.DEVNULL)
                await stop.wait()


async def _leftovers(tmp: Path) -> None:
    killed, killed_url = await _process("kill", tmp)
    assert await _end(killed) == -9
    [left] = _clusters(tmp)
    assert await _answers(killed_url), "a killed owner leaves its server running"

    alive, alive_url = await _process("stay", tmp)  # the next test process
    try:
        assert not left.exists(), "the next test process removes what the killed one left"
        assert not await _answers(killed_url), "and stops its server"
        assert await _answers(alive_url)
        survivor, survivor_url = await _process("stay", tmp)  # a worker beside it
        assert await _answers(alive_url), "a cluster whose owner runs is left alone"
        assert await _end(survivor) == 0
    finally:
        assert await _end(alive) == 0
    assert _clusters(tmp) == [], "a process that ends normally removes its own"
    assert not await _answers(survivor_url)
