"""vaultmail against a minimal Probot app, side by side in one run (DESIGN §6).

One local forge (localforge.LocalForge, in this process) holds two copies of the example
office: `acme` (vaultmail, seeded, registered and installed as bot.app.embedded does it, and run as
deployed, `vaultmail serve`, in its own process; with --embedded, start_embedded instead, so the
forge and vaultmail share one event loop) and `globex` (the same office under another org; the
Probot app in bench/probot/index.js, registered through the forge's Python API with its own key
and webhook URL, in its own Node process, installed on globex only, so neither app hears the
other's writes). The representative event is `issues.opened` in an agent's vault: both
apps read the office config `{org}/.github/vaultmail.yml` (kept 60 s, so one GET per run) and
PATCH the issue once (marked body, `mail:new` label). vaultmail also signs the mail header and
records the mail in its store; Probot does no more than the two requests.

The issues are made beforehand (webhooks dropped meanwhile, and those failed deliveries then
removed so no reconciliation replays them); their `issues.opened` payloads, as the forge
rendered them, are signed with each app's secret and POSTed straight to each app's webhook
endpoint by a load client in its own process: the same count, at the same number in flight,
vaultmail first then Probot, one issue per delivery. Measured per app: deliveries accepted a
second, p50/p99 answer latency, and events fully handled a second — from the first POST until
the forge's request log holds the resulting PATCH (status 200, by that app's installation) for
every delivery. Probot answers after its handler ran (its webhook middleware awaits it);
vaultmail answers once the delivery is queued, and a single worker then handles them in order.

Probot is run with @octokit/plugin-throttling off (like vaultmail here: no write pacing); its
default throttling lets one write through a second, which a short extra row shows.

Run: .venv/bin/python -m bench.probot_compare [--embedded]   (`npm ci` in bench/probot once)
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import hmac
import json
import os
import re
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from asyncio.subprocess import Process
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

from bench.common import client_main, ms, percentile, run_client
from bot.app.embedded import (
    APP_EVENTS,
    APP_PERMISSIONS,
    APP_SLUG,
    Embedded,
    _new_private_key,
    _office_text,
    start_embedded,
)
from bot.office.config import Office, load_office
from bot.office.seed import seed_office
from bot.office.source import CONFIG_PATH, CONFIG_REPO
from localforge import Limits, LocalForge

PROBOT_DIR = Path(__file__).parent / "probot"
PROBOT_ORG = "globex"
VAULT = "scout-vault"
PATCH_ROUTE = "PATCH /repos/{owner}/{repo}/issues/{issue_number}"
# (in flight, deliveries) for both apps; then Probot with its default throttling, briefly.
LEVELS: list[tuple[int, int]] = [(10, 1000), (50, 1000)]
STOCK_LEVEL = (10, 10)
WARMUP = 20
HANDLED_TIMEOUT = 60.0
ISSUE_NUMBER = re.compile(r"/issues/(\d+)$")


# -- the load client (its own process) --------------------------------------------------------
async def _load(spec: dict[str, Any]) -> dict[str, Any]:
    """POST every body once, `concurrency` in flight; answer latencies and statuses."""
    secret = spec["secret"].encode()
    signed = [(body.encode(), "sha256=" + hmac.new(secret, body.encode(), hashlib.sha256)
               .hexdigest()) for body in spec["bodies"]]
    latencies: list[float] = []
    statuses: dict[str, int] = {}
    queue = list(reversed(signed))
    connector = aiohttp.TCPConnector(limit=spec["concurrency"])
    async with aiohttp.ClientSession(connector=connector) as session:
        async def sender() -> None:
            while queue:
                body, signature = queue.pop()
                headers = {"X-GitHub-Event": spec["event"],
                           "X-GitHub-Delivery": str(uuid.uuid4()),
                           "X-Hub-Signature-256": signature,
                           "Content-Type": "application/json",
                           "User-Agent": "GitHub-Hookshot/bench"}
                t = time.perf_counter()
                async with session.post(spec["url"], data=body, headers=headers) as resp:
                    await resp.read()
                latencies.append(time.perf_counter() - t)
                statuses[str(resp.status)] = statuses.get(str(resp.status), 0) + 1

        started_wall = time.time()
        start = time.perf_counter()
        await asyncio.gather(*(sender() for _ in range(spec["concurrency"])))
        elapsed = time.perf_counter() - start
    return {"latencies": latencies, "statuses": statuses, "elapsed": elapsed,
            "started_wall": started_wall}


# -- set-up -----------------------------------------------------------------------------------
Settle = Callable[[], Awaitable[None]]


@dataclass
class Target:
    name: str
    url: str  # the app's webhook endpoint
    secret: str
    installation_id: int
    org: str
    settle: Settle  # until the app has handled everything it was sent
    payloads: list[dict[str, Any]] = field(default_factory=list)  # issues.opened, in order

    def take(self, n: int) -> list[dict[str, Any]]:
        taken, self.payloads = self.payloads[:n], self.payloads[n:]
        if len(taken) < n:
            raise RuntimeError(f"{self.name}: only {len(taken)} prepared issues left, {n} needed")
        return taken


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _key_file(directory: Path, name: str) -> tuple[str, Path]:
    pem = _new_private_key()
    path = directory / name
    path.write_text(pem)
    path.chmod(0o600)
    return pem, path


async def _start(argv: list[str], cwd: Path, env: dict[str, str], health: str,
                 what: str) -> Process:
    """Start a server process and wait until `health` answers 200."""
    proc = await asyncio.create_subprocess_exec(*argv, cwd=cwd, env={**os.environ, **env})
    deadline = time.monotonic() + 30
    async with aiohttp.ClientSession() as session:
        while time.monotonic() < deadline:
            if proc.returncode is not None:
                raise RuntimeError(f"{what} exited with {proc.returncode} at start")
            with contextlib.suppress(aiohttp.ClientError):
                async with session.get(health) as resp:
                    if resp.status == 200:
                        return proc
            await asyncio.sleep(0.1)
    await _stop(proc)
    raise RuntimeError(f"{what} did not answer {health} within 30 s")


async def _stop(proc: Process) -> None:
    if proc.returncode is None:
        proc.terminate()
        try:
            await asyncio.wait_for(proc.wait(), 10)
        except TimeoutError:
            proc.kill()
            await proc.wait()


async def _start_probot(forge: LocalForge, app_id: int, key_path: Path, secret: str,
                        port: int, *, throttle: bool) -> Process:
    node = shutil.which("node")
    if node is None:
        raise RuntimeError("node is not on PATH (the Probot app needs Node 20 or later)")
    if not (PROBOT_DIR / "node_modules" / "probot").is_dir():
        raise RuntimeError(f"run `npm ci` in {PROBOT_DIR} first (installs probot@14)")
    env = {"APP_ID": str(app_id), "PRIVATE_KEY_PATH": str(key_path), "WEBHOOK_SECRET": secret,
           "PORT": str(port), "HOST": "127.0.0.1", "FORGE_URL": forge.url,
           "LOG_LEVEL": "warn", "NODE_ENV": "production",
           "PROBOT_THROTTLE": "on" if throttle else "off"}
    return await _start([node, "index.js"], PROBOT_DIR, env,
                        f"http://127.0.0.1:{port}/ping", "the Probot app")


async def _vaultmail_process(forge: LocalForge, office: Office, data_dir: Path,
                             procs: list[Process]) -> tuple[Target, dict[str, str]]:
    """vaultmail as deployed (`vaultmail serve`, its own process), registered and installed
    on the forge as bot.app.embedded does it."""
    forge_tokens = seed_office(forge, office)
    forge.put_file(f"{office.org}/{CONFIG_REPO}", CONFIG_PATH, _office_text(None))
    pem, key_path = _key_file(data_dir, "vaultmail-key.pem")
    secret = secrets.token_hex(20)
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    app_id = forge.register_app(
        slug=APP_SLUG, name="vaultmail", public_key_pem=pem, webhook_url=f"{url}/webhook",
        webhook_secret=secret, events=APP_EVENTS, permissions=APP_PERMISSIONS)
    procs.append(await _start(
        [str(Path(sys.executable).parent / "vaultmail"), "serve"], Path.cwd(),
        {"GITHUB_API_URL": forge.url, "GITHUB_APP_ID": str(app_id),
         "GITHUB_PRIVATE_KEY_PATH": str(key_path), "GITHUB_WEBHOOK_SECRET": secret,
         "VAULTMAIL_DATA": str(data_dir / "vaultmail"), "HOST": "127.0.0.1",
         "PORT": str(port)}, f"{url}/healthz", "vaultmail serve"))
    installation = forge.install_app(app_id, office.org)

    async def settle() -> None:
        async with aiohttp.ClientSession() as session:
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline:
                await forge.webhooks_idle()
                async with session.get(f"{url}/healthz") as resp:
                    health = await resp.json()
                if health["queue_pending"] == 0:
                    await forge.webhooks_idle()
                    if forge.webhooks.queue.empty():
                        return
                await asyncio.sleep(0.02)
        raise TimeoutError("vaultmail still busy")

    return (Target("vaultmail", f"{url}/webhook", secret, installation, office.org, settle),
            forge_tokens)


def _vaultmail_embedded(embedded: Embedded) -> Target:
    async def settle() -> None:
        await embedded.settle(timeout=120)
        await embedded.forge.webhooks_idle()

    services = embedded.services
    return Target("vaultmail", embedded.app_url + "/webhook", services.settings.webhook_secret,
                  int(services.default_installation or 0), embedded.office.org, settle)


async def _make_issues(forge: LocalForge, token: str, repo: str, count: int) -> None:
    async with aiohttp.ClientSession(
            headers={"Authorization": f"token {token}"}) as session:
        remaining = list(range(count))

        async def maker() -> None:
            while remaining:
                i = remaining.pop()
                async with session.post(f"{forge.url}/repos/{repo}/issues", json={
                        "title": f"Bench mail {i}",
                        "body": f"Please look at item {i} of the quarterly numbers."}) as resp:
                    if resp.status != 201:
                        raise RuntimeError(f"creating an issue in {repo}: {resp.status} "
                                           f"{await resp.text()}")

        await asyncio.gather(*(maker() for _ in range(16)))


def _take_opened(forge: LocalForge, installation_id: int) -> list[dict[str, Any]]:
    """The (dropped) issues.opened deliveries to an installation: their payloads; and forget
    them, so no reconciliation asks for them again."""
    found = [d for d in forge.state.deliveries.values()
             if d.installation_id == installation_id and d.event == "issues"
             and d.action == "opened"]
    for d in found:
        del forge.state.deliveries[d.id]
    return [d.payload for d in sorted(found, key=lambda d: d.payload["issue"]["number"])]


# -- measuring --------------------------------------------------------------------------------
async def _until_handled(forge: LocalForge, installation_id: int, repo: str,
                         numbers: set[int], since: int) -> float:
    """Wait until the forge has answered 200 to a PATCH of every issue in `numbers` by this
    installation; the forge-clock time of the last one."""
    waiting = set(numbers)
    last = 0.0
    index = since
    deadline = time.monotonic() + HANDLED_TIMEOUT
    prefix = f"/repos/{repo}/issues/"
    while waiting:
        records = forge.requests.records
        for rec in records[index:]:
            if (rec.installation_id == installation_id and rec.route == PATCH_ROUTE
                    and rec.status == 200 and rec.path.startswith(prefix)):
                m = ISSUE_NUMBER.search(rec.path.split("?")[0])
                if m and int(m.group(1)) in waiting:
                    waiting.discard(int(m.group(1)))
                    last = max(last, rec.at)
        index = len(records)
        if waiting:
            if time.monotonic() > deadline:
                raise TimeoutError(f"{len(waiting)} deliveries never led to their PATCH")
            await asyncio.sleep(0.005)
    return last


async def _measure(forge: LocalForge, target: Target, concurrency: int,
                   count: int) -> dict[str, Any]:
    await target.settle()
    payloads = target.take(count)
    repo = f"{target.org}/{VAULT}"
    since = len(forge.requests.records)
    result = await run_client("bench.probot_compare", {
        "url": target.url, "secret": target.secret, "event": "issues",
        "concurrency": concurrency,
        "bodies": [json.dumps(p, separators=(",", ":")) for p in payloads]})
    last = await _until_handled(forge, target.installation_id, repo,
                                {int(p["issue"]["number"]) for p in payloads}, since)
    handled_window = last - forge.clock.offset - result["started_wall"]
    routes: dict[str, int] = {}
    for r in forge.requests.records[since:]:
        if r.installation_id == target.installation_id:
            routes[r.route] = routes.get(r.route, 0) + 1
    await target.settle()
    lat: list[float] = result["latencies"]
    return {"count": count, "concurrency": concurrency, "latencies": lat,
            "statuses": result["statuses"], "accepted": len(lat) / result["elapsed"],
            "handled": count / handled_window, "routes": routes}


async def main(embedded_mode: bool) -> None:
    t0 = time.perf_counter()
    data_dir = Path(tempfile.mkdtemp(prefix="vaultmail-probot-"))
    procs: list[Process] = []
    embedded: Embedded | None = None
    rows: list[tuple[str, dict[str, Any], dict[str, Any]]] = []
    stock: dict[str, Any] | None = None
    try:
        if embedded_mode:  # the forge and vaultmail in this process, on one event loop
            embedded = await start_embedded(data_dir=data_dir / "embedded", port=0,
                                            forge_port=0)
            forge, office = embedded.forge, embedded.office
            vm, tokens = _vaultmail_embedded(embedded), embedded.forge_tokens
        else:  # the forge here; vaultmail and Probot each in its own process
            forge, office = LocalForge(), load_office(None)
            await forge.start()
            vm, tokens = await _vaultmail_process(forge, office, data_dir, procs)
        await vm.settle()

        # The Probot app's org: the same office, under another org.
        seed_office(forge, office.model_copy(update={"org": PROBOT_ORG}))
        probot_pem, key_path = _key_file(data_dir, "probot-key.pem")
        probot_secret = secrets.token_hex(20)
        port = _free_port()
        probot_app = forge.register_app(
            slug="probot-bench", name="probot-bench", public_key_pem=probot_pem,
            webhook_url=f"http://127.0.0.1:{port}/api/github/webhooks",
            webhook_secret=probot_secret, events=["issues"],
            permissions={"issues": "write", "metadata": "read", "contents": "read"})
        procs.append(await _start_probot(forge, probot_app, key_path, probot_secret, port,
                                         throttle=False))
        probot_inst = forge.install_app(probot_app, PROBOT_ORG)

        async def probot_settle() -> None:
            await forge.webhooks_idle()

        pb = Target("Probot", f"http://127.0.0.1:{port}/api/github/webhooks", probot_secret,
                    probot_inst, PROBOT_ORG, probot_settle)
        await vm.settle()

        # The issues, made while every webhook is dropped; their payloads kept for the load.
        needed = WARMUP + sum(n for _, n in LEVELS)
        forge.limits.update({"primary": 10**7, "secondary_per_minute": 10**7,
                             "secondary_per_hour": 10**7})
        forge.faults.drop_webhooks(rate=1.0)
        await asyncio.gather(
            _make_issues(forge, tokens["marco"], f"{office.org}/{VAULT}", needed),
            _make_issues(forge, tokens["marco"], f"{PROBOT_ORG}/{VAULT}",
                         needed + STOCK_LEVEL[1]))
        await forge.webhooks_idle()
        forge.faults.drop_webhooks(rate=0.0)
        forge.limits.update(Limits().as_dict())  # the run itself under GitHub's limits
        vm.payloads = _take_opened(forge, vm.installation_id)
        pb.payloads = _take_opened(forge, pb.installation_id)
        setup = time.perf_counter() - t0

        for target in (vm, pb):  # warm-up: token, config, connections, JIT
            await _measure(forge, target, 5, WARMUP)
        for concurrency, count in LEVELS:
            a = await _measure(forge, vm, concurrency, count)
            b = await _measure(forge, pb, concurrency, count)
            rows.append((f"{concurrency} in flight", a, b))

        # Probot as it ships: @octokit/plugin-throttling paces writes one a second.
        await _stop(procs.pop())
        port = _free_port()
        pb.url = f"http://127.0.0.1:{port}/api/github/webhooks"
        forge.set_webhook(probot_app, url=pb.url)
        procs.append(await _start_probot(forge, probot_app, key_path, probot_secret, port,
                                         throttle=True))
        stock = await _measure(forge, pb, *STOCK_LEVEL)
    finally:
        for proc in procs:
            await _stop(proc)
        if embedded is not None:
            await embedded.stop()
        else:
            await forge.stop()
        shutil.rmtree(data_dir, ignore_errors=True)
    total = time.perf_counter() - t0
    _report(rows, stock, embedded_mode, setup, total)


def _report(rows: list[tuple[str, dict[str, Any], dict[str, Any]]],
            stock: dict[str, Any] | None, embedded_mode: bool, setup: float,
            total: float) -> None:
    notes: list[str] = []
    flag = " --embedded" if embedded_mode else ""
    print(f"command: .venv/bin/python -m bench.probot_compare{flag}\n")
    head = ["load", "app", "deliveries", "p50 ms", "p99 ms", "accepted/s", "handled/s",
            "forge requests by its installation", "handled/s vaultmail ÷ Probot"]
    print("| " + " | ".join(head) + " |")
    print("|" + "|".join("---" for _ in head) + "|")

    def line(load: str, name: str, r: dict[str, Any], ratio: str) -> str:
        bad = {s: n for s, n in r["statuses"].items() if not s.startswith("2")}
        if bad:
            notes.append(f"{name}, {load}: answers other than 2xx: {bad}")
        routes = ", ".join(f"{n} {route}" for route, n in sorted(r["routes"].items()))
        lat = r["latencies"]
        return (f"| {load} | {name} | {r['count']} | {ms(percentile(lat, 50))} | "
                f"{ms(percentile(lat, 99))} | {r['accepted']:.0f} | {r['handled']:.0f} | "
                f"{routes} | {ratio} |")

    for load, a, b in rows:
        print(line(load, "vaultmail", a, f"**{a['handled'] / b['handled']:.2f}**"))
        print(line(load, "Probot 14.3.2, throttling off", b, ""))
    if stock is not None:
        print(line(f"{STOCK_LEVEL[0]} in flight", "Probot 14.3.2, default throttling", stock,
                   "(not compared)"))
    where = ("the forge and vaultmail share this process's event loop (start_embedded)"
             if embedded_mode else
             "the forge in this process, vaultmail (`vaultmail serve`) and Probot each in its "
             "own")
    print(f"\nOne issue per delivery; {WARMUP} warm-up deliveries per app not counted; load "
          f"client in its own process; {where}; Probot on Node {_node_version()}; "
          f"{os.cpu_count()} cores; set-up {setup:.1f} s, whole run {total:.1f} s.")
    for note in notes:
        print(f"- {note}")


def _node_version() -> str:
    node = shutil.which("node")
    if node is None:
        return "?"
    return subprocess.run([node, "--version"], capture_output=True, text=True).stdout.strip()


if __name__ == "__main__":
    if "--client" in sys.argv:
        client_main(_load)
    else:
        asyncio.run(main(embedded_mode="--embedded" in sys.argv))
