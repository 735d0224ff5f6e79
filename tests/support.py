"""Test helpers: act as a person or agent on the local forge, or call the app's tools.

Everything goes over real HTTP: people use the forge's REST API with their own tokens, agents
the app's tool endpoint with their API tokens.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import inspect
import os
import socket
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, TypeVar

import aiohttp
from aiohttp import web
from jsonschema import Draft202012Validator
from jsonschema.exceptions import best_match

from bot.app.embedded import Embedded, new_private_key
from bot.tools import TOOLS


async def older_index(tmp_path: Path, database_url: str, upto: int,
                      statements: Sequence[tuple[str, Sequence[Any]]]) -> str:
    """An index left at schema `upto` by an older release, with `statements` (SQL with `?`
    placeholders, and their parameters) run in it: on PostgreSQL at `database_url` (an empty
    database), else a SQLite file in `tmp_path`. What `open_store` upgrades: its target."""
    import sqlite3

    import asyncpg

    from bot.store import postgres, sqlite
    from bot.store.sql import numbered

    if database_url:
        await postgres._migrate(database_url, upto=upto)  # noqa: SLF001
        conn = await asyncpg.connect(database_url)
        try:
            for sql, params in statements:
                await conn.execute(numbered(sql), *params)
        finally:
            await conn.close()
        return database_url
    target = str(tmp_path / "index.sqlite3")
    sqlite._migrate_file(target, upto=upto)  # noqa: SLF001
    lite = sqlite3.connect(target, isolation_level=None)
    try:
        for sql, params in statements:
            lite.execute(sql, tuple(params))
    finally:
        lite.close()
    return target


@functools.cache
def app_key() -> str:
    """One App key for every embedded app a test process starts (`start_embedded(app_key=)`):
    each has a forge of its own, and a new 2048-bit key costs a tenth of a second."""
    return new_private_key()


class Actor:
    """Someone on the forge, acting with their personal token."""

    def __init__(self, session: aiohttp.ClientSession, embedded: Embedded, login: str) -> None:
        self.session = session
        self.base = embedded.forge.url
        self.login = login
        self.headers = {"Authorization": f"token {embedded.forge_tokens[login]}",
                        "Accept": "application/vnd.github+json"}

    async def call(self, method: str, path: str, json: Any = None,
                   expect: int | None = None) -> Any:
        async with self.session.request(method, self.base + path, json=json,
                                        headers=self.headers) as resp:
            body = await resp.json(content_type=None) if resp.status != 204 else None
            if expect is not None:
                assert resp.status == expect, (method, path, resp.status, body)
            return body

    async def open_issue(self, repo: str, title: str, body: str, **extra: Any) -> Any:
        return await self.call("POST", f"/repos/{repo}/issues",
                               {"title": title, "body": body, **extra}, expect=201)

    async def comment(self, repo: str, number: int, body: str) -> Any:
        return await self.call("POST", f"/repos/{repo}/issues/{number}/comments",
                               {"body": body}, expect=201)

    async def issue(self, repo: str, number: int) -> Any:
        return await self.call("GET", f"/repos/{repo}/issues/{number}", expect=200)

    async def comments(self, repo: str, number: int) -> list[Any]:
        return list(await self.call("GET", f"/repos/{repo}/issues/{number}/comments",
                                    expect=200))

    async def issues(self, repo: str, **query: str) -> list[Any]:
        qs = "&".join(f"{k}={v}" for k, v in {"state": "all", **query}.items())
        return list(await self.call("GET", f"/repos/{repo}/issues?{qs}", expect=200))


def label_names(issue: dict[str, Any]) -> list[str]:
    return sorted(label["name"] for label in issue["labels"])


def gitea_api(session: aiohttp.ClientSession, embedded: Embedded,
              login: str) -> Callable[..., Awaitable[Any]]:
    """`call(method, path, body=None, expect=200)`: the embedded office's local Gitea API
    (`/api/v1`) as `login`, its answer's JSON once the status is the one expected."""
    base = embedded.forge.url + "/api/v1"
    headers = {"Authorization": f"token {embedded.forge_tokens[login]}"}

    async def call(method: str, path: str, body: Any = None, expect: int = 200) -> Any:
        async with session.request(method, base + path, json=body, headers=headers) as resp:
            got = await resp.json(content_type=None)
            assert resp.status == expect, (path, resp.status, got)
            return got

    return call


class ToolClient:
    """A principal calling the app's tools over HTTP with its API token."""

    def __init__(self, session: aiohttp.ClientSession, embedded: Embedded,
                 principal: str, token: str | None = None) -> None:
        self.session = session
        self.url = embedded.app_url + "/api/v1/tools/"
        self.token = token or embedded.api_tokens[principal]  # (another office's: given)

    async def raw(self, name: str, args: Any, token: str | None = None) -> tuple[int, Any]:
        headers = {"Authorization": f"Bearer {token or self.token}"}
        async with self.session.post(self.url + name, json=args, headers=headers) as resp:
            return resp.status, await resp.json()

    async def __call__(self, name: str, **args: Any) -> Any:
        status, body = await self.raw(name, args)
        assert status == 200, (name, status, body)
        check_output(name, body)
        return body


_validators: dict[str, Draft202012Validator] = {}


def check_output(name: str, result: Any) -> None:
    """Every result a test gets from a tool matches the outputSchema the tool declares."""
    validator = _validators.get(name)
    if validator is None:  # (made once a tool: a schema and its checks are costly to build)
        schema = TOOLS[name].output_schema() if name in TOOLS else None
        if schema is None:
            return
        validator = _validators[name] = Draft202012Validator(schema)
    error = best_match(validator.iter_errors(result))
    assert error is None, (f"{name}: the result does not match its output schema "
                           f"(bot/tools/outputs.py): {error.message} at "
                           f"{list(error.absolute_path)}")


async def forge_sign_in(browser: aiohttp.ClientSession, embedded: Embedded, start: str,
                        forge_token: str) -> aiohttp.ClientResponse:
    """The forge's OAuth web flow from the console's `start` link, the person already signed
    in on the forge (their token) and the App already authorized: the callback's answer."""
    async with browser.get(embedded.app_url + start, allow_redirects=False) as resp:
        authorize = resp.headers["Location"]
    async with browser.get(authorize, allow_redirects=False,
                           headers={"Authorization": f"token {forge_token}"}) as resp:
        back = resp.headers["Location"]
    async with browser.get(back, allow_redirects=False) as resp:
        await resp.read()
        return resp


async def until(what: Callable[[], Awaitable[bool] | bool], timeout: float = 10.0) -> None:
    """Wait for a condition the app reaches by itself (a failed attempt recorded)."""
    deadline = time.monotonic() + timeout
    while True:
        seen = what()
        if await seen if inspect.isawaitable(seen) else seen:
            return
        assert time.monotonic() < deadline, "the condition never came true"
        await asyncio.sleep(0.01)


T = TypeVar("T")


async def sqlite_steps(store: Any, read: Callable[[], Awaitable[T]],
                       every: int = 1) -> tuple[int, T]:
    """What one read of a SQLite store costs, counted rather than timed: its virtual machine's
    steps (in units of `every`), and what it read."""
    steps = 0

    def step() -> int:
        nonlocal steps
        steps += 1
        return 0  # go on

    conn = store._db
    await conn.set_progress_handler(step, every)
    try:
        found = await read()
    finally:
        await conn.set_progress_handler(None, every)
    return steps, found


@contextlib.asynccontextmanager
async def redirected_elsewhere() -> AsyncIterator[tuple[str, list[dict[str, Any]]]]:
    """A forge whose every answer is a 307 to the same path on another server, which records
    what reaches it (and answers as a forge would: a token, a login): the forge's URL, and
    what reached elsewhere."""
    seen: list[dict[str, Any]] = []

    async def elsewhere(request: web.Request) -> web.Response:
        seen.append({"path": request.path, "form": dict(await request.post())
                     if request.method == "POST" else {}})
        if request.path.endswith("/access_token"):
            return web.json_response({"access_token": "from-elsewhere"})
        return web.json_response({"login": "org-admin"})

    evil, forge = web.Application(), web.Application()
    evil.router.add_route("*", "/{tail:.*}", elsewhere)
    async with served(evil) as away:
        async def moved(request: web.Request) -> web.Response:
            return web.Response(status=307, headers={"Location": f"{away}{request.path}"})

        forge.router.add_route("*", "/{tail:.*}", moved)
        async with served(forge) as url:
            yield url, seen


@contextlib.asynccontextmanager
async def served(app: web.Application) -> AsyncIterator[str]:
    """`app` listening on a free loopback port while inside: its base URL."""
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        await runner.cleanup()


def port_share(worker: str = "", workers: int = 1) -> range:
    """The ports this test process may hand out (`free_port`): below the kernel's ephemeral
    range, where bind(0) and outgoing connections take theirs (or above it, where that leaves
    more), split evenly among pytest-xdist's workers `gw0`, `gw1`, ... ("" alone: the whole)."""
    try:
        low, high = map(int, Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
    except (OSError, ValueError):
        low, high = 32768, 60999  # Linux's default
    ports = max(range(10000, low), range(high + 1, 65536), key=len)
    n = int(worker.removeprefix("gw") or 0)
    return ports[n * len(ports) // workers:(n + 1) * len(ports) // workers]


def _in_share() -> Iterator[int]:
    share = port_share(os.environ.get("PYTEST_XDIST_WORKER", ""),
                       int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")))
    start = os.getpid() % len(share)  # (another test run beside this one starts elsewhere)
    for i in range(len(share)):
        yield share[(start + i) % len(share)]


_ports = _in_share()


def free_port() -> int:
    """A port for a server a test starts later on it (a subprocess given `--port`): free now,
    and handed to no one else meanwhile: not twice in this process, not by another xdist worker
    (another share), not by the kernel to a bind(0) or an outgoing connection (outside its
    ephemeral range). Nothing listens there until the test starts its server: a closed port."""
    for port in _ports:
        with socket.socket() as s:
            try:  # on every address, as a server on 0.0.0.0 would
                s.bind(("0.0.0.0", port))
            except OSError:
                continue  # someone else's (or lingering in TIME_WAIT)
        return port
    raise RuntimeError("every port of this test process's share was handed out")
