"""`vaultmail serve` as an operator's container runs it: it starts before the forge answers and
becomes ready once it does, a port in use fails at once, and SIGTERM drains promptly."""

from __future__ import annotations

import asyncio
import json
import signal
import socket
import sys
import time
from collections.abc import AsyncIterator
from importlib import resources
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa

from bot.app.embedded import APP_EVENTS, APP_PERMISSIONS
from bot.app.web import RETRY_MAX
from bot.office.config import load_office
from bot.office.seed import seed_office
from bot.store import open_store
from localforge import LocalForge
from tests.support import free_port

ROOT = Path(__file__).resolve().parents[2]


def _key_pair() -> tuple[str, str]:
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    private = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                serialization.NoEncryption()).decode()
    public = key.public_key().public_bytes(serialization.Encoding.PEM,
                                           serialization.PublicFormat.SubjectPublicKeyInfo)
    return private, public.decode()


async def _serve(env: dict[str, str], cwd: Path) -> asyncio.subprocess.Process:
    return await asyncio.create_subprocess_exec(
        sys.executable, "-m", "bot.cli.main", "serve", cwd=str(cwd),
        env={"PATH": "/usr/bin:/bin", "HOME": str(cwd), "PYTHONPATH": str(ROOT), **env},
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)


async def _json(session: aiohttp.ClientSession, method: str, url: str,
                **kw: Any) -> tuple[int, Any]:
    async with session.request(method, url, **kw) as resp:
        return resp.status, await resp.json(content_type=None)


OPERATOR = {"Authorization": "Bearer operator-token-of-the-tests"}  # /readyz's detail


async def _until_ready(session: aiohttp.ClientSession, url: str, tries: int = 300) -> Any:
    """Poll /readyz (the operator's probe) until it says ready; bounded."""
    body: Any = None
    for _ in range(tries):
        status, body = await _json(session, "GET", url + "/readyz", headers=OPERATOR)
        if status == 200:
            return body
        await asyncio.sleep(0.1)
    raise AssertionError(f"never ready: {body}")


@pytest.fixture
async def session() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as s:
        yield s


async def _serving(tmp_path: Path, app_id: int, private: str, secret: str, forge_port: int,
                   app_port: int) -> asyncio.subprocess.Process:
    """`serve` for App `app_id` of the forge at `forge_port` (which need not answer yet),
    once it says it listens on `app_port`; the operator's token is OPERATOR's."""
    proc = await _serve({"APP_ID": str(app_id), "PRIVATE_KEY": private, "WEBHOOK_SECRET": secret,
                         "GITHUB_API_URL": f"http://127.0.0.1:{forge_port}", "HOST": "127.0.0.1",
                         "PORT": str(app_port), "VAULTMAIL_DATA": str(tmp_path / "data"),
                         "VAULTMAIL_OPERATOR_TOKEN": "operator-token-of-the-tests"},
                        tmp_path)
    try:
        assert proc.stdout is not None
        line = (await asyncio.wait_for(proc.stdout.readline(), 60)).decode()
        assert line.strip() == f"vaultmail serving on http://127.0.0.1:{app_port}"
    except BaseException:
        proc.kill()  # (no test goes on with it, and none leaves it behind)
        await proc.wait()
        raise
    return proc


async def test_serve_starts_while_the_forge_is_unreachable_and_becomes_ready_once_it_answers(
        tmp_path: Path, session: aiohttp.ClientSession) -> None:
    forge_port, app_port = free_port(), free_port()
    app_url = f"http://127.0.0.1:{app_port}"
    private, public = _key_pair()
    secret = "whsec-test"
    forge = LocalForge()  # set up as an organisation would be, but not listening yet
    seed_office(forge, load_office())
    app_id = forge.register_app(slug="vaultmail", name="vaultmail", public_key_pem=public,
                                webhook_url=app_url + "/webhook", webhook_secret=secret,
                                events=APP_EVENTS, permissions=APP_PERMISSIONS)
    forge.install_app(app_id, "acme")
    proc = await _serving(tmp_path, app_id, private, secret, forge_port, app_port)
    try:
        status, health = await _json(session, "GET", app_url + "/healthz")
        assert (status, health["status"]) == (200, "starting"), "alive before the forge answers"
        status, ready = await _json(session, "GET", app_url + "/readyz")
        assert status == 503 and ready["failed"] == ["forge"], ready
        status, refused = await _json(session, "POST", app_url + "/webhook", data=b"{}")
        assert status == 503 and refused["error"]["code"] == "starting"
        # each says when to look again: at the start's next try at the forge, at most
        # RETRY_MAX away (acted out: /readyz said nothing, the refusal a fixed 5 s)
        for path in ("/readyz", "/webhook"):
            async with session.request("GET" if path == "/readyz" else "POST", app_url + path,
                                       data=b"{}") as resp:
                assert resp.status == 503
                assert 1 <= int(resp.headers.get("Retry-After", "0")) <= RETRY_MAX, resp.headers
        # why the start waits (the forge's address, an exception) is the operator's, as at
        # /healthz and /readyz
        for said in (health, ready, refused):
            assert f":{forge_port}" not in json.dumps(said), said
        status, told = await _json(session, "POST", app_url + "/webhook", data=b"{}",
                                   headers=OPERATOR)
        assert status == 503 and f":{forge_port}" in told["error"]["message"], told

        await forge.start(port=forge_port)
        ready = await _until_ready(session, app_url)
        assert ready["failed"] == [] and ready["checks"]["forge"]["ok"]
    finally:
        proc.send_signal(signal.SIGTERM)
        await asyncio.wait_for(proc.wait(), 30)
        await forge.stop()
    assert proc.returncode == 0


async def test_while_the_first_try_at_the_forge_is_under_way_the_operator_is_told_so(
        tmp_path: Path, session: aiohttp.ClientSession) -> None:
    """A forge that takes the connection and says nothing holds the start's first try: the
    operator was told "the forge is not reachable yet (None)" (acted out on CI: a probe
    made before the first try had failed), /readyz "not reached yet: None". They name the
    forge and that the first try is under way."""
    app_port = free_port()
    app_url = f"http://127.0.0.1:{app_port}"
    private, _ = _key_pair()
    with socket.socket() as silent:  # listens, and never answers
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        forge_port = silent.getsockname()[1]
        proc = await _serving(tmp_path, 1, private, "whsec", forge_port, app_port)
        try:
            said = [
                (await _json(session, "GET", app_url + "/healthz", headers=OPERATOR))[1]
                ["error"],
                (await _json(session, "GET", app_url + "/readyz", headers=OPERATOR))[1]
                ["checks"]["forge"]["detail"],
                (await _json(session, "POST", app_url + "/webhook", data=b"{}",
                             headers=OPERATOR))[1]["error"]["message"]]
            for text in said:
                assert f":{forge_port}" in text and "first try" in text, said
                assert "None" not in text, said
        finally:
            proc.send_signal(signal.SIGTERM)
            await asyncio.wait_for(proc.wait(), 30)
    assert proc.returncode == 0


async def test_a_port_in_use_fails_start_up_at_once_with_a_clear_message(
        tmp_path: Path) -> None:
    private, _ = _key_pair()
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        proc = await _serve({"APP_ID": "1", "PRIVATE_KEY": private, "WEBHOOK_SECRET": "s",
                             "GITHUB_API_URL": "http://127.0.0.1:9", "HOST": "127.0.0.1",
                             "PORT": str(port)}, tmp_path)
        out, err = await asyncio.wait_for(proc.communicate(), 30)
    assert proc.returncode == 2
    assert err.decode().strip().splitlines() == [
        f"vaultmail: cannot listen on 127.0.0.1:{port}: Address already in use: stop what uses "
        "that port or choose another (PORT / --port)"]


async def test_sigterm_answers_long_polls_at_once_and_exits_0(
        tmp_path: Path, session: aiohttp.ClientSession) -> None:
    port, forge_port = free_port(), free_port()
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "bot.cli.main", "up", "--data", str(tmp_path), "--port",
        str(port), "--forge-port", str(forge_port), stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.DEVNULL)
    assert proc.stdout is not None
    line = (await asyncio.wait_for(proc.stdout.readline(), 60)).decode()
    assert "ready" in line
    tokens = json.loads((tmp_path / "tokens.json").read_text())
    headers = {"Authorization": f"Bearer {tokens['api_tokens']['agent:scout']}"}
    url = tokens["app_url"] + "/api/v1/tools/list_inbox"
    poll = asyncio.create_task(_json(session, "POST", url, headers=headers, json={"wait": 50}))
    # the poll is held once the app counts it among the waiting (its own metric)
    for _ in range(200):
        async with session.get(tokens["app_url"] + "/metrics", headers=OPERATOR) as resp:
            text = await resp.text()
        held = [ln for ln in text.splitlines() if ln.startswith("vaultmail_long_polls_held ")]
        if held and float(held[0].split()[1]) >= 1:
            break
        await asyncio.sleep(0.05)
    else:
        raise AssertionError("the long poll was never held")
    proc.send_signal(signal.SIGTERM)
    status, body = await asyncio.wait_for(poll, 10)  # not the 50 s it asked for
    assert status == 200 and "inbox" in body, body
    assert await asyncio.wait_for(proc.wait(), 10) == 0


LABEL_WRITE = "PATCH /repos/{owner}/{repo}/issues/{issue_number}"  # the app labels a new mail
DRAIN = 10.0  # seconds SIGTERM may take (Docker's and Kubernetes' default grace period)


class _Office:
    """A local forge set up as an organisation would be, with the App installed, and
    `vaultmail serve` processes run against it on one data directory."""

    def __init__(self, tmp_path: Path) -> None:
        self.tmp_path = tmp_path
        self.app_port, forge_port = free_port(), free_port()
        self.app_url = f"http://127.0.0.1:{self.app_port}"
        private, public = _key_pair()
        self.forge = LocalForge()
        self.forge_port = forge_port
        self.tokens = seed_office(self.forge, load_office())
        example = resources.files("bot").joinpath("example_office.yml").read_text()
        self.forge.put_file("acme/.github", "vaultmail.yml", example)
        app_id = self.forge.register_app(
            slug="vaultmail", name="vaultmail", public_key_pem=public,
            webhook_url=self.app_url + "/webhook", webhook_secret="whsec-test",
            events=APP_EVENTS, permissions=APP_PERMISSIONS)
        self.forge.install_app(app_id, "acme")
        self.env = {"APP_ID": str(app_id), "PRIVATE_KEY": private,
                    "WEBHOOK_SECRET": "whsec-test",
                    "GITHUB_API_URL": f"http://127.0.0.1:{forge_port}", "HOST": "127.0.0.1",
                    "PORT": str(self.app_port), "VAULTMAIL_DATA": str(tmp_path / "data")}
        self.runs = 0

    async def serve(self, session: aiohttp.ClientSession) -> asyncio.subprocess.Process:
        """`vaultmail serve`, once it is ready; its log goes to serve-N.log."""
        self.runs += 1
        with (self.tmp_path / f"serve-{self.runs}.log").open("wb") as log:
            proc = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "bot.cli.main", "serve", cwd=str(self.tmp_path),
                env={"PATH": "/usr/bin:/bin", "HOME": str(self.tmp_path), **self.env},
                stdout=asyncio.subprocess.PIPE, stderr=log)
        assert proc.stdout is not None
        line = (await asyncio.wait_for(proc.stdout.readline(), 60)).decode()
        assert line.strip() == f"vaultmail serving on {self.app_url}", self.log()
        await _until_ready(session, self.app_url)
        return proc

    def log(self) -> str:
        return (self.tmp_path / f"serve-{self.runs}.log").read_text()

    async def open_issue(self, session: aiohttp.ClientSession, login: str, repo: str,
                         title: str, body: str) -> Any:
        status, issue = await _json(
            session, "POST", f"{self.forge.url}/repos/{repo}/issues",
            headers={"Authorization": f"token {self.tokens[login]}"},
            json={"title": title, "body": body})
        assert status == 201, issue
        return issue

    async def deliveries(self, event: str) -> list[dict[str, Any]]:
        """The queue's rows for `event`, read from the data directory (serve stopped)."""
        store = await open_store(Path(self.env["VAULTMAIL_DATA"]) / "index.sqlite3")
        try:
            rows = await store.fetchall(
                "SELECT guid, state, attempts FROM queue WHERE event=? ORDER BY id", (event,))
            return [dict(r) for r in rows]
        finally:
            await store.close()


async def _handled(session: aiohttp.ClientSession, url: str, tries: int = 300) -> None:
    """Poll /healthz until nothing is pending (bounded)."""
    body: Any = None
    for _ in range(tries):
        status, body = await _json(session, "GET", url + "/healthz", headers=OPERATOR)
        if status == 200 and body["queue_pending"] == 0:
            return
        await asyncio.sleep(0.1)
    raise AssertionError(f"still pending: {body}")


async def test_sigterm_while_a_delivery_is_in_progress_exits_0_in_time_and_it_is_handled_once(
        tmp_path: Path, session: aiohttp.ClientSession) -> None:
    """The forge holds the delivery's write while SIGTERM arrives: serve exits 0 within the
    grace period, the delivery goes back to the queue (not counted as failed, not lost), and
    the next start takes it, once."""
    office = _Office(tmp_path)
    await office.forge.start(port=office.forge_port)
    try:
        proc = await office.serve(session)
        held = office.forge.faults.hold(LABEL_WRITE)
        await office.open_issue(session, "marco", "acme/scout-vault", "Prices",
                                "EU prices please")
        await held.arrived.wait()  # the delivery is being handled, its write at the forge
        started = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        code = await asyncio.wait_for(proc.wait(), 30)
        took = time.monotonic() - started
        assert code == 0, office.log()
        assert took < DRAIN, f"SIGTERM took {took:.1f} s"
        [row] = await office.deliveries("issues")
        assert (row["state"], row["attempts"]) == ("pending", 0), row
        held.release()  # (the write the stopped app had sent lands now, as it may on GitHub)

        proc = await office.serve(session)
        await _handled(session, office.app_url)
        proc.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(proc.wait(), 30) == 0, office.log()
    finally:
        office.forge.faults.clear()  # (a hold left by a failure would keep the forge waiting)
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
        await office.forge.stop()
    assert await office.deliveries("issues") == [
        {"guid": row["guid"], "state": "done", "attempts": 0}], "handled once, by the restart"
    # handled as mail, not as an issue of an office without a config (in whole-suite runs the
    # restart asked for the config while its first read was being parsed, and got none)
    store = await open_store(Path(office.env["VAULTMAIL_DATA"]) / "index.sqlite3")
    try:
        assert [r["vault"] for r in await store.fetchall("SELECT vault FROM mails")] == [
            "acme/scout-vault"], office.log()
    finally:
        await store.close()
