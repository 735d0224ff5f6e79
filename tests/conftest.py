from __future__ import annotations

import atexit
import compileall
import contextlib
import gc
import os
import shutil
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest

from tests import scratch

# before anything makes a temp file, pytest's basetemp included (xdist's workers inherit it)
scratch.use_memory_where_there_is_room()

from bot.app.embedded import Embedded, start_embedded  # noqa: E402
from bot.cli.main import GC_THRESHOLDS  # noqa: E402
from bot.store import Store, open_store  # noqa: E402
from tests import needs, pg  # noqa: E402
from tests.support import Actor, ToolClient, app_key  # noqa: E402

# The app in these processes collects garbage as `vaultmail serve` does (bot.cli.main): its
# youngest objects after 10,000 allocations, not Python's 700. Python's own cost the tests'
# processes 6-14 % more CPU (tests/test_mail.py and test_comments.py, 26.3-26.4 s against
# 28.1-30.7 s of user time, two runs each).
gc.set_threshold(*GC_THRESHOLDS)


def pytest_sessionstart(session: pytest.Session) -> None:
    """The README's test command sets up the machine itself (tests/needs.py): before any test,
    in the controlling process only (not in each xdist worker, and before xdist starts them),
    the missing programs' Debian packages (as root; else one line naming each) and the Octokit
    packages. Where everything is there this looks and does nothing."""
    config = session.config
    if hasattr(config, "workerinput"):
        return
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    capture = config.pluginmanager.get_plugin("capturemanager")

    def say(line: str) -> None:
        if reporter is not None:
            reporter.write_line(line)
        else:
            print(line)

    # apt-get's and npm's progress shown as it comes
    with capture.global_and_fixture_disabled() if capture else contextlib.nullcontext():
        needs.set_up(root=os.geteuid() == 0, say=say)
    # the project's own modules compiled once, here: where PYTHONDONTWRITEBYTECODE is set (as
    # on these machines) no process writes them, and each of the suite's hundreds of app and
    # CLI processes compiled every module it imports again (about 0.25 s of CPU an app start)
    root = Path(__file__).resolve().parent.parent
    for package in ("bot", "handlers", "labels", "localforge", "tests"):
        compileall.compile_dir(root / package, quiet=1)


# Every end-to-end test runs on both engines of the index: SQLite (the embedded default) and
# PostgreSQL (several replicas), a fresh database each (tests/pg.py: a throwaway server).
ENGINES = ["sqlite", "postgresql"]


@pytest.fixture(params=ENGINES)
async def database_url(request: pytest.FixtureRequest) -> AsyncIterator[str]:
    """"" for SQLite in the test's data directory, else a fresh PostgreSQL database's URL, at
    this release's schema (as the app's first start leaves it)."""
    async for url in _each_engine(request.param, migrated=True):
        yield url


@pytest.fixture
async def postgres_url() -> AsyncIterator[str]:
    """A fresh PostgreSQL database's URL, at this release's schema: for what only PostgreSQL
    has (a clock of the database's own apart from the replica's, other sessions' locks)."""
    async for url in _each_engine("postgresql", migrated=True):
        yield url


@pytest.fixture(params=ENGINES)
async def empty_database_url(request: pytest.FixtureRequest) -> AsyncIterator[str]:
    """As `database_url`, with nothing in it: for the tests that build an older release's
    index there."""
    async for url in _each_engine(request.param, migrated=False):
        yield url


async def _each_engine(engine: str, *, migrated: bool) -> AsyncIterator[str]:
    if engine == "sqlite":
        yield ""
        return
    url = await _fresh_database(migrated=migrated)
    try:
        yield url
    finally:
        await pg.drop_database(url)


async def _fresh_database(*, migrated: bool = True) -> str:
    """A fresh database on the tests' PostgreSQL, at this release's schema unless not
    `migrated`; where its server is not installed, the test fails with one line naming the
    package (tests/needs.py)."""
    try:
        needs.postgresql()
    except needs.Missing as exc:
        pytest.fail(str(exc), pytrace=False)
    return await pg.fresh_database(migrated=migrated)


_sqlite_templates: list[Path] = []  # this process's migrated SQLite index, once made


async def _sqlite_template() -> Path:
    """An empty SQLite index at this release's schema, made once a process (as tests/pg.py
    makes PostgreSQL's template): the migrations cost a SQLite test more than its copy."""
    if not _sqlite_templates:
        path = Path(tempfile.mkdtemp(prefix="vaultmail-index-")) / "index.sqlite3"
        store = await open_store(path)
        await store.close()  # (its WAL folded into the file: the file alone is the index)
        atexit.register(shutil.rmtree, path.parent, True)
        _sqlite_templates.append(path)
    return _sqlite_templates[0]


@pytest.fixture
async def embedded(tmp_path: Path, database_url: str) -> AsyncIterator[Embedded]:
    """The embedded default (`vaultmail up`) on free loopback ports, with the example office,
    on each engine."""
    if not database_url:  # SQLite: the index as the app's first start leaves it, copied
        shutil.copyfile(await _sqlite_template(), tmp_path / "index.sqlite3")
    emb = await start_embedded(data_dir=tmp_path, port=0, forge_port=0,
                               database_url=database_url, app_key=app_key())
    try:
        yield emb
        # the app paces itself under GitHub's secondary limits: the forge refused it nothing
        # (faults a test injects are not counted here)
        assert not emb.forge.rates.refused, f"secondary limits hit: {emb.forge.rates.refused}"
    finally:
        await emb.stop()


@pytest.fixture
async def session() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as s:
        yield s


@pytest.fixture
def person(embedded: Embedded, session: aiohttp.ClientSession):  # type: ignore[no-untyped-def]
    return lambda login: Actor(session, embedded, login)


@pytest.fixture
def tools(embedded: Embedded, session: aiohttp.ClientSession):  # type: ignore[no-untyped-def]
    return lambda principal: ToolClient(session, embedded, principal)


@pytest.fixture
async def two_replicas() -> AsyncIterator[tuple[Store, Store]]:
    """Two replicas' stores on one fresh PostgreSQL database, each joined under its name."""
    url = await _fresh_database()
    a, b = await open_store(url), await open_store(url)
    await a.join("replica-a")
    await b.join("replica-b")
    try:
        yield a, b
    finally:
        await a.close()
        await b.close()
        await pg.drop_database(url)
