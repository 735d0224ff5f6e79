"""vaultmail against a minimal Probot app, side by side in one run, under every GitHub
secondary limit (DESIGN §6, issue 14).

One local forge (localforge.LocalForge, in this process) with its GitHub limits as shipped
(`localforge.Limits()`: 100 requests in flight, 900 points a minute per endpoint with a write
at 5, 80 creations a minute and 500 an hour, 5,000 requests an hour, per installation). Three
apps, each in its own process and installed on its own organisations so that none hears the
others' writes, every organisation a copy of the example office:

- vaultmail as deployed (`vaultmail serve`), as shipped;
- the Probot app of bench/probot/index.js (probot 14) as users run it: @octokit/plugin-throttling
  on, its default (writes one at a time a second per process, whatever the installation);
- the same Probot app with the throttling turned off.

The representative event is `issues.opened` in an agent's vault: every app reads the office
config `{org}/.github/vaultmail.yml` (kept 60 s) and PATCHes the issue once (marked body,
`mail:new` label); vaultmail also signs the mail header and records the mail and a ledger entry.

A cell is a number of installations (1, 10, 50): the deliveries are spread round-robin over
that many organisations, fresh ones for each cell and app (so one cell's minute of points does
not fall into the next, and each cell pays its own token and config reads). Each cell's issues
are made just before it runs, with webhooks dropped; their `issues.opened` payloads, as the
forge rendered them, are signed with each app's secret and POSTed to its webhook endpoint by a
load client in its own process, 50 in flight, each answer waited for at most 10 s (GitHub's
webhook timeout).

Measured per cell and app: events a second (deliveries whose PATCH the forge answered 200,
from the first POST to the last such PATCH); p50/p99 to acknowledge (the webhook answer) and
to the forge write (the POST to its PATCH's 200); the secondary-limit refusals the app received
(403/429 to its installations); CPU seconds per 1,000 events and peak RSS of the app's process
(/proc: utime+stime, VmHWM reset per cell); and the ratio vaultmail / Probot. Where the limits
themselves cap a cell (more than 180 PATCHes per installation, the endpoint's points in a minute),
the fastest they allow is computed (the k-th write to an endpoint no sooner than a minute after
the (k-180)-th) and vaultmail's time compared with it.

Run: .venv/bin/python -m bench.probot_compare   (`npm ci` in bench/probot once)
     [--count N] [--stock-count N] [--cells 1,10,50] [--apps vm,po] [--rounds N]
     --rounds N: each cell N times, the apps' order flipped every other round, each round
     on fresh organisations; a second table gives each round's ratio, their median and the
     lowest (this machine's noise moved one round's ratio by a quarter either way).
     BENCH_PROFILE=/tmp/profiles/vm: py-spy's raw stacks of `vaultmail serve` (the GIL holder)
     per cell, to /tmp/profiles/vm.<cell>; summarise with bench.profile_summary.
     BENCH_TRACE=/tmp/profiles/trace: wall-clock spans of `vaultmail serve` (its write lock,
     SQLite hops, forge requests; bench.store_trace), summarised by
     `.venv/bin/python -m bench.store_trace /tmp/profiles/trace`.
     BENCH_SQL=/tmp/profiles/sql: the SQL statements `vaultmail serve` runs per event, and
     the commonest, per cell (bench.sql_count).
     BENCH_DEBUG=1: per cell and app, each thread's CPU, the forge's requests, how busy the
     machine was, and a timeline (per 50 ms: posted, answered, read, written).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import hmac
import json
import math
import os
import re
import secrets
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from asyncio.subprocess import Process
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

from bench import sql_count
from bench.common import client_main, ms, percentile, run_client
from bot.app.embedded import APP_EVENTS, APP_PERMISSIONS, APP_SLUG, new_private_key
from bot.office.config import Office, load_office
from bot.office.seed import seed_office
from localforge import Limits, LocalForge

PROBOT_DIR = Path(__file__).parent / "probot"
VAULT = "scout-vault"
PATCH_ROUTE = "PATCH /repos/{owner}/{repo}/issues/{issue_number}"
GET_ISSUE_ROUTE = "GET /repos/{owner}/{repo}/issues/{issue_number}"
CELLS = (1, 10, 50)  # installations the deliveries are spread over
COUNT = 600  # deliveries per cell for vaultmail and Probot without throttling
STOCK_COUNT = 120  # ... for Probot with its default throttling (a write a second: 2 minutes)
IN_FLIGHT = 50
ACK_TIMEOUT = 10.0  # GitHub gives up on a webhook answer after 10 s
WARMUP = 20
TARGET_CAP = 0.05  # within 5 % of the fastest the limits allow
ROUND_APART = 61.0  # seconds from one round's start to the next's, at least (--rounds)
ISSUE_NUMBER = re.compile(r"/repos/([^/]+)/([^/]+)/issues/(\d+)$")
FIRST_TRY = "the first try is under way"  # bot.app.web.Startup's error before an answer
WRITES_PER_MINUTE = Limits().endpoint_points_per_minute // 5  # a PATCH costs 5 points


# -- the load client (its own process) --------------------------------------------------------
async def _load(spec: dict[str, Any]) -> dict[str, Any]:
    """POST every body once, `concurrency` in flight; per body: when it was sent (wall clock),
    how long its answer took, its status ("timeout" past the ack timeout)."""
    secret = spec["secret"].encode()
    signed = [(i, body.encode(), "sha256=" + hmac.new(secret, body.encode(), hashlib.sha256)
               .hexdigest()) for i, body in enumerate(spec["bodies"])]
    sent: list[float] = [0.0] * len(signed)
    latency: list[float] = [0.0] * len(signed)
    status: list[str] = [""] * len(signed)
    queue = list(reversed(signed))
    timeout = aiohttp.ClientTimeout(total=spec["timeout"])
    connector = aiohttp.TCPConnector(limit=spec["concurrency"])
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        async def sender() -> None:
            while queue:
                i, body, signature = queue.pop()
                headers = {"X-GitHub-Event": spec["event"],
                           "X-GitHub-Delivery": str(uuid.uuid4()),
                           "X-Hub-Signature-256": signature,
                           "Content-Type": "application/json",
                           "User-Agent": "GitHub-Hookshot/bench"}
                sent[i] = time.time()
                t = time.perf_counter()
                try:
                    async with session.post(spec["url"], data=body, headers=headers) as resp:
                        await resp.read()
                    status[i] = str(resp.status)
                except TimeoutError:
                    status[i] = "timeout"
                latency[i] = time.perf_counter() - t

        await asyncio.gather(*(sender() for _ in range(spec["concurrency"])))
    return {"sent": sent, "latency": latency, "status": status}


# -- processes --------------------------------------------------------------------------------
def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _key_file(directory: Path, name: str) -> tuple[str, Path]:
    pem = new_private_key()
    path = directory / name
    path.write_text(pem)
    path.chmod(0o600)
    return pem, path


async def _start(argv: list[str], cwd: Path, env: dict[str, str], health: str,
                 what: str, log: Path) -> Process:
    """Start a server process (its output to `log`) and wait until `health` answers 200."""
    with log.open("ab") as out:
        proc = await asyncio.create_subprocess_exec(*argv, cwd=cwd, env={**os.environ, **env},
                                                    stdout=out, stderr=out)
    deadline = time.monotonic() + 30
    async with aiohttp.ClientSession() as session:
        while time.monotonic() < deadline:
            if proc.returncode is not None:
                raise RuntimeError(f"{what} exited with {proc.returncode} at start")
            with contextlib.suppress(aiohttp.ClientError):
                async with session.get(health) as resp:
                    if resp.status == 200:
                        return proc
            await asyncio.sleep(0.1)  # a bounded poll of another process's probe
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


def _cpu_seconds(pid: int) -> float:
    """utime + stime of a process (all its threads), from /proc."""
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _machine_busy() -> tuple[float, float]:
    """(busy, all) core-seconds of the whole machine so far, from /proc/stat."""
    ticks = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = ticks[3] + ticks[4]  # idle + iowait
    total = sum(ticks[:8])
    return (total - idle) / os.sysconf("SC_CLK_TCK"), total / os.sysconf("SC_CLK_TCK")


def _thread_cpu(pid: int) -> dict[str, float]:
    """CPU seconds per thread of a process (name:tid), from /proc."""
    out: dict[str, float] = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        with contextlib.suppress(OSError):
            stat = (task / "stat").read_text()
            name = stat[stat.index("(") + 1:stat.rindex(")")]
            fields = stat.rpartition(")")[2].split()
            out[f"{name}:{task.name}"] = (int(fields[11]) + int(fields[12])) / os.sysconf(
                "SC_CLK_TCK")
    return out


def _reset_peak(pid: int) -> None:
    """Start VmHWM over from the current RSS (Linux: clear_refs 5)."""
    with contextlib.suppress(OSError):
        Path(f"/proc/{pid}/clear_refs").write_text("5")


def _peak_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return 0.0


# -- the apps ---------------------------------------------------------------------------------
@dataclass
class App:
    name: str
    key: str  # prefix of its organisations
    app_id: int
    secret: str
    url: str  # its webhook endpoint
    proc: Process
    idle: Callable[[], Awaitable[bool]]  # nothing left to do (answers in, queue empty)
    count: int  # deliveries per cell
    # an answer after which the app still works on the delivery: vaultmail's 202 (queued; its
    # queue says when it is done), Probot's 202 (@octokit/webhooks answers "still processing"
    # after 9 s and its handler runs on): only with none of these is an app's idle() final
    unfinished: frozenset[str] = frozenset({"timeout"})
    orgs: dict[str, int] = field(default_factory=dict)  # org -> installation id
    payloads: dict[str, list[dict[str, Any]]] = field(default_factory=dict)  # org -> opened

    def cell_orgs(self, cell: int | str) -> list[str]:
        return [org for org in self.orgs if org.startswith(f"{self.key}{cell}-")]


def _trace_env() -> dict[str, str]:
    """With BENCH_TRACE: `vaultmail serve` wrapped by bench.store_trace; with BENCH_SQL, its
    statements counted by bench.sql_count (both: bench/trace_site)."""
    env: dict[str, str] = {}
    if trace := os.environ.get("BENCH_TRACE"):
        Path(f"{trace}.vm.jsonl").unlink(missing_ok=True)
        Path(f"{trace}.cells.jsonl").unlink(missing_ok=True)
        env["VAULTMAIL_BENCH_TRACE"] = f"{trace}.vm.jsonl"
    if sql := os.environ.get("BENCH_SQL"):
        Path(f"{sql}.vm.json").unlink(missing_ok=True)
        env["VAULTMAIL_BENCH_SQL"] = f"{sql}.vm.json"
    if env:
        site = Path(__file__).parent / "trace_site"
        env["PYTHONPATH"] = os.pathsep.join([str(site), str(Path.cwd())])
    return env


async def _vaultmail(forge: LocalForge, data_dir: Path) -> App:
    pem, key_path = _key_file(data_dir, "vaultmail-key.pem")
    secret = secrets.token_hex(20)
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    app_id = forge.register_app(
        slug=APP_SLUG, name="vaultmail", public_key_pem=pem, webhook_url=f"{url}/webhook",
        webhook_secret=secret, events=APP_EVENTS, permissions=APP_PERMISSIONS)
    proc = await _start(
        [str(Path(sys.executable).parent / "vaultmail"), "serve"], Path.cwd(),
        {"GITHUB_API_URL": forge.url, "GITHUB_APP_ID": str(app_id),
         "GITHUB_PRIVATE_KEY_PATH": str(key_path), "GITHUB_WEBHOOK_SECRET": secret,
         "VAULTMAIL_DATA": str(data_dir / "vaultmail"), "HOST": "127.0.0.1",
         "PORT": str(port), **_trace_env()}, f"{url}/healthz", "vaultmail serve",
        data_dir / "vaultmail.log")
    session = aiohttp.ClientSession()

    async def idle() -> bool:
        await forge.webhooks_idle()
        async with session.get(f"{url}/healthz") as resp:
            health = await resp.json()
        if health.get("status") == "starting":  # answers before its start-up is done
            # (until its first try at the forge has an answer, the error says it is under way)
            if health.get("error") and not health["error"].endswith(FIRST_TRY):
                raise RuntimeError(f"vaultmail did not start: {health['error']}")
            return False
        return bool(health["queue_pending"] == 0 and forge.webhooks.queue.empty())

    app = App("vaultmail", "vm", app_id, secret, f"{url}/webhook", proc, idle, COUNT)
    app.session = session  # type: ignore[attr-defined]
    return app


async def _probot(forge: LocalForge, data_dir: Path, *, throttle: bool, count: int) -> App:
    node = shutil.which("node")
    if node is None:
        raise RuntimeError("node is not on PATH (the Probot app needs Node 20 or later)")
    if not (PROBOT_DIR / "node_modules" / "probot").is_dir():
        raise RuntimeError(f"run `npm ci` in {PROBOT_DIR} first (installs probot@14)")
    key = "pd" if throttle else "po"
    pem, key_path = _key_file(data_dir, f"probot-{key}.pem")
    secret = secrets.token_hex(20)
    port = _free_port()
    webhook = f"http://127.0.0.1:{port}/api/github/webhooks"
    app_id = forge.register_app(
        slug=f"probot-bench-{key}", name=f"probot-bench-{key}", public_key_pem=pem,
        webhook_url=webhook, webhook_secret=secret, events=["issues"],
        permissions={"issues": "write", "metadata": "read", "contents": "read"})
    env = {"APP_ID": str(app_id), "PRIVATE_KEY_PATH": str(key_path), "WEBHOOK_SECRET": secret,
           "PORT": str(port), "HOST": "127.0.0.1", "FORGE_URL": forge.url,
           "LOG_LEVEL": "info", "NODE_ENV": "production",  # both apps log as they ship
           "PROBOT_THROTTLE": "on" if throttle else "off"}
    proc = await _start([node, "index.js"], PROBOT_DIR, env, f"http://127.0.0.1:{port}/ping",
                        "the Probot app", data_dir / f"probot-{key}.log")

    async def idle() -> bool:  # Probot answers a webhook once its handler is done
        await forge.webhooks_idle()
        return True

    name = "Probot, default throttling" if throttle else "Probot, throttling off"
    return App(name, key, app_id, secret, webhook, proc, idle, count,
               unfinished=frozenset({"timeout", "202"}))


def _tag(cell: int, round_: int) -> str:
    """The organisations' prefix of a cell's round (its first round: the cell alone)."""
    return f"{cell}" if round_ == 0 else f"{cell}r{round_}"


def _install(forge: LocalForge, office: Office, app: App, cells: tuple[int, ...],
             rounds: int) -> None:
    """The app's organisations: a warm-up one and, per cell and round, as many as
    installations (fresh ones each time: no round spends another's minute of points)."""
    names = [f"{app.key}w-00"] + [f"{app.key}{_tag(cell, k)}-{i:02d}" for k in range(rounds)
                                  for cell in cells for i in range(cell)]
    for org in names:
        seed_office(forge, office.model_copy(update={"org": org}))
        app.orgs[org] = forge.install_app(app.app_id, org)


async def _open_issues(forge: LocalForge, token: str, app: App, cell: int | str,
                       count: int) -> None:
    """The issues of one cell of `app`, opened just before it runs (webhooks dropped, the
    forge's limits lifted meanwhile): their `issues.opened` payloads, as the forge rendered
    them, are what the cell posts, as fresh as the forge would have sent them. (Issues made
    at set-up were minutes old by a later round's cell: an opening that late is one
    redelivered, which an app may rightly read again before acting on.)"""
    orgs = app.cell_orgs(cell)
    limits = forge.limits.as_dict()
    forge.limits.update({"primary": 10**7, "secondary_per_minute": 0,
                         "secondary_per_hour": 0, "concurrent_requests": 0,
                         "endpoint_points_per_minute": 0})
    forge.faults.drop_webhooks(rate=1.0)
    try:
        await _make_issues(forge, token, [(org, -(-count // len(orgs))) for org in orgs])
        await forge.webhooks_idle()
    finally:
        forge.faults.drop_webhooks(rate=0.0)
        forge.limits.update(limits)
    _take_opened(forge, app)


async def _make_issues(forge: LocalForge, token: str, jobs: list[tuple[str, int]]) -> None:
    """Open `n` issues in each org's vault, 16 at a time."""
    todo = [(org, i) for org, n in jobs for i in range(n)]
    async with aiohttp.ClientSession(headers={"Authorization": f"token {token}"}) as session:
        async def maker() -> None:
            while todo:
                org, i = todo.pop()
                async with session.post(f"{forge.url}/repos/{org}/{VAULT}/issues", json={
                        "title": f"Bench mail {i}",
                        "body": f"Please look at item {i} of the quarterly numbers."}) as resp:
                    if resp.status != 201:
                        raise RuntimeError(f"creating an issue in {org}: {resp.status} "
                                           f"{await resp.text()}")

        await asyncio.gather(*(maker() for _ in range(16)))


def _take_opened(forge: LocalForge, app: App) -> None:
    """The (dropped) issues.opened deliveries to each of the app's installations: their
    payloads; and forget them, so no reconciliation asks for them again."""
    by_installation = {inst: org for org, inst in app.orgs.items()}
    found: dict[str, list[dict[str, Any]]] = {}
    for d in list(forge.state.deliveries.values()):
        if d.installation_id in by_installation and d.event == "issues":
            if d.action == "opened":
                found.setdefault(by_installation[d.installation_id], []).append(d.payload)
            del forge.state.deliveries[d.id]
    app.payloads.update({org: sorted(p, key=lambda x: x["issue"]["number"])
                         for org, p in found.items()})


async def _until_idle(app: App, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while not await app.idle():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{app.name} still busy")
        await asyncio.sleep(0.05)  # a bounded poll of the app's probe


# -- one cell ---------------------------------------------------------------------------------
IDLE_ASK = 0.25  # seconds between asks whether the app is idle, while a cell runs


def fastest_allowed(per_installation: list[int]) -> float:
    """Seconds from the first write to the last that the per-endpoint points allow: the k-th
    PATCH of an installation no sooner than a minute after its (k - 180)-th."""
    return max((math.floor((n - 1) / WRITES_PER_MINUTE) * 60.0 for n in per_installation
                if n > 0), default=0.0)


async def _measure(forge: LocalForge, app: App, cell: int | str, count: int) -> dict[str, Any]:
    await _until_idle(app)
    orgs = app.cell_orgs(cell)
    bodies: list[dict[str, Any]] = []
    for i in range(count):  # round-robin over the cell's installations
        org = orgs[i % len(orgs)]
        if not app.payloads[org]:
            raise RuntimeError(f"{org}: no prepared issue left")
        bodies.append(app.payloads[org].pop(0))
    key_of = [(b["repository"]["full_name"].lower(), int(b["issue"]["number"])) for b in bodies]
    index = {k: i for i, k in enumerate(key_of)}
    installations = {app.orgs[o] for o in orgs}
    since = len(forge.requests.records)
    refused_before = Counter(forge.rates.refused)
    tx0 = await _write_transactions(app)
    sql = os.environ.get("BENCH_SQL") if app.key == "vm" else None
    statements0 = sql_count.read(f"{sql}.vm.json") if sql else Counter()
    cpu0 = _cpu_seconds(app.proc.pid)
    threads0 = _thread_cpu(app.proc.pid)
    busy0 = _machine_busy()
    _reset_peak(app.proc.pid)
    written: dict[int, float] = {}  # body index -> wall time of its PATCH's 200
    refusals: Counter[int] = Counter()
    scanned = since

    def scan() -> None:
        nonlocal scanned
        records = forge.requests.records
        for rec in records[scanned:]:
            if rec.installation_id not in installations:
                continue
            if rec.status in (403, 429):
                refusals[rec.status] += 1
            elif rec.route == PATCH_ROUTE and rec.status == 200:
                m = ISSUE_NUMBER.search(rec.path.split("?")[0])
                if m:
                    i = index.get((f"{m.group(1)}/{m.group(2)}".lower(), int(m.group(3))))
                    if i is not None and i not in written:
                        written[i] = rec.at - forge.clock.offset
        scanned = len(records)

    profiler = None
    if (profile := os.environ.get("BENCH_PROFILE")) and app.key == "vm" and cell != "w":
        # py-spy's raw stacks of `vaultmail serve` (the GIL holder) during this cell
        profiler = await asyncio.create_subprocess_exec(
            str(Path(sys.executable).parent / "py-spy"), "record", "-r", "250", "-f", "raw",
            "--gil", "-o", f"{profile}.{cell}", "--pid", str(app.proc.pid),
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    client = asyncio.create_task(run_client("bench.probot_compare", {
        "url": app.url, "secret": app.secret, "event": "issues", "concurrency": IN_FLIGHT,
        "timeout": ACK_TIMEOUT, "bodies": [json.dumps(b, separators=(",", ":"))
                                           for b in bodies]}))
    ideal = fastest_allowed([sum(1 for i in range(count) if orgs[i % len(orgs)] == o)
                             for o in orgs])
    deadline = time.monotonic() + ideal * 1.5 + 180
    asked_idle = 0.0
    while True:
        scan()
        if len(written) == count:
            break
        # the app's probe asked at most 4 times a second: each answer is the app's work (and
        # this process's), taken from the cell it measures
        if client.done() and not (set(client.result()["status"]) & app.unfinished) \
                and time.monotonic() - asked_idle > IDLE_ASK:
            asked_idle = time.monotonic()
            if await app.idle():
                scan()
                break  # everything answered and the app has nothing left: what landed, landed
        if time.monotonic() > deadline:
            break
        await asyncio.sleep(0.01)
    busy = [a - b for a, b in zip(_machine_busy(), busy0, strict=True)]
    result = await client
    if profiler is not None:  # py-spy writes its stacks on SIGINT
        profiler.send_signal(signal.SIGINT)
        await profiler.wait()
    cpu = _cpu_seconds(app.proc.pid) - cpu0
    peak = _peak_mb(app.proc.pid)
    await _until_idle(app, timeout=ideal + 300)
    scan()
    tx = await _write_transactions(app) - tx0  # (after the cell, its last results included)
    if sql:  # (the count is rewritten ten times a second: after the idle probe, it is whole)
        await asyncio.sleep(0.3)
        ran = sql_count.read(f"{sql}.vm.json") - statements0
        common = ", ".join(f"{n / count:.2f} {s}" for s, n in ran.most_common(8))
        print(f"[sql] {app.name} cell {cell}: {ran.total() / count:.1f} statements / event;"
              f" commonest: {common}")
    sent: list[float] = result["sent"]
    first = min(sent)
    last = max(written.values(), default=first)
    handled = len(written)
    statuses = Counter(result["status"])
    if (trace := os.environ.get("BENCH_TRACE")) and app.key == "vm" and cell != "w":
        window = json.dumps({"cell": cell, "first": first, "last": last, "events": handled})
        with Path(f"{trace}.cells.jsonl").open("a") as f:  # noqa: ASYNC230 (the window
            f.write(window + "\n")  # bench.store_trace reads; a line, between cells)
    if os.environ.get("BENCH_DEBUG"):  # where the time goes, on the forge's side
        recs = [r for r in forge.requests.records[since:] if r.installation_id in installations]
        durations = [r.duration for r in recs if r.route == PATCH_ROUTE]
        threads = {k: round(v - threads0.get(k, 0.0), 2) for k, v in
                   _thread_cpu(app.proc.pid).items() if v - threads0.get(k, 0.0) > 0.01}
        print(f"[debug] {app.name} cell {cell}: threads' CPU {threads}; {len(recs)} requests "
              f"{dict(Counter(r.route for r in recs).most_common(6))}; PATCH duration "
              f"p50 {ms(percentile(durations, 50))} p99 {ms(percentile(durations, 99))} ms; "
              f"bench process CPU {time.process_time():.1f} s; machine busy {busy[0]:.2f} of "
              f"{busy[1]:.2f} core-seconds until the last write", file=sys.stderr)
        _print_timeline(app.name, cell, result, written, [
            r.at - forge.clock.offset for r in recs if r.route == GET_ISSUE_ROUTE])
    forge_refused = Counter(forge.rates.refused) - refused_before
    return {
        "cell": cell, "count": count, "handled": handled,
        "events_s": handled / (last - first) if last > first else 0.0,
        "window": last - first, "ideal": ideal,
        "ack": [lat for lat, s in zip(result["latency"], result["status"], strict=True)
                if s != "timeout"],
        "timeouts": statuses.get("timeout", 0),
        "bad": {s: n for s, n in statuses.items() if not s.startswith("2") and s != "timeout"},
        "write": [written[i] - sent[i] for i in written],
        "refusals": sum(refusals.values()), "forge_refused": dict(forge_refused),
        "cpu_per_1000": cpu / handled * 1000 if handled else math.inf, "cpu": cpu,
        "peak_mb": peak,
        "tx_per_event": tx / handled if handled and tx >= 0 else math.nan,
    }


def _print_timeline(name: str, cell: int | str, result: dict[str, Any],
                    written: dict[int, float], read: list[float]) -> None:
    """BENCH_DEBUG: per 50 ms from the first POST, the deliveries posted, answered, read (the
    forge's GETs of their issues) and written, until the last write: whether the app's work
    flows or comes in bursts with idle gaps between."""
    first = min(result["sent"])
    bins = 1 + int((max(written.values(), default=first) - first) * 20)

    def counts(times: list[float]) -> list[int]:
        out = [0] * bins
        for t in times:
            out[min(bins - 1, int((t - first) * 20))] += 1
        return out

    answered = [s + lat for s, lat in zip(result["sent"], result["latency"], strict=True)]
    for what, times in (("posted", result["sent"]), ("answered", answered), ("read", read),
                        ("written", list(written.values()))):
        print(f"[debug] {name} cell {cell} {what:>8} per 50 ms: {counts(times)}",
              file=sys.stderr)


async def _write_transactions(app: App) -> float:
    """The store's write transactions so far (vaultmail's /metrics; NaN for Probot)."""
    if app.key != "vm":
        return math.nan
    session: aiohttp.ClientSession = app.session  # type: ignore[attr-defined]
    async with session.get(f"{app.url.removesuffix('/webhook')}/metrics") as resp:
        for line in (await resp.text()).splitlines():
            if line.startswith("vaultmail_store_write_transactions_total "):
                return float(line.split()[1])
    return math.nan


# -- the run ----------------------------------------------------------------------------------
async def main(cells: tuple[int, ...], count: int, stock_count: int,
               only: set[str] | None = None, rounds: int = 1) -> None:
    t0 = time.perf_counter()
    data_dir = Path(tempfile.mkdtemp(prefix="vaultmail-probot-"))
    forge, office = LocalForge(), load_office(None)
    await forge.start()
    apps: list[App] = []
    rows: list[tuple[App, dict[str, Any]]] = []
    try:
        vm = await _vaultmail(forge, data_dir)
        apps.append(vm)
        vm.count = count
        if only is None or "po" in only:
            apps.append(await _probot(forge, data_dir, throttle=False, count=count))
        if only is None or "pd" in only:
            apps.append(await _probot(forge, data_dir, throttle=True, count=stock_count))
        # set-up without limits: seeding, installing, and the issues (webhooks dropped)
        forge.limits.update({"primary": 10**7, "secondary_per_minute": 0,
                             "secondary_per_hour": 0, "concurrent_requests": 0,
                             "endpoint_points_per_minute": 0})
        for app in apps:
            _install(forge, office, app, cells, rounds)
        for app in apps:
            await _until_idle(app)
        marco = forge.user_token("marco")
        for app in apps:
            await _open_issues(forge, marco, app, "w", WARMUP)
        forge.limits.update(Limits().as_dict())  # the run itself under GitHub's limits
        forge.rates.windows.clear()  # and with the set-up's spending forgotten
        setup = time.perf_counter() - t0
        for app in apps:  # warm-up: connections, code paths, JIT
            await _measure(forge, app, "w", min(WARMUP, app.count))
        began = -math.inf
        for k in range(rounds):  # each round in turn, the apps' order flipped every other
            # a minute apart at least: each new installation's token is a POST to one App
            # endpoint, of which GitHub allows 180 a minute (60 a round at 10,50, per app)
            await asyncio.sleep(max(0.0, began + ROUND_APART - time.monotonic()))
            began = time.monotonic()
            for cell in cells:
                for app in (apps if k % 2 == 0 else apps[::-1]):
                    await _until_idle(app)
                    await _open_issues(forge, marco, app, _tag(cell, k), app.count)
                    row = await _measure(forge, app, _tag(cell, k), app.count)
                    rows.append((app, {**row, "cell": cell, "round": k}))
    finally:
        for app in apps:
            await _stop(app.proc)
            session = getattr(app, "session", None)
            if session is not None:
                await session.close()
        await forge.stop()
        shutil.rmtree(data_dir, ignore_errors=True)
    _report(rows, cells, count, stock_count, setup, time.perf_counter() - t0, rounds)


def _report(rows: list[tuple[App, dict[str, Any]]], cells: tuple[int, ...], count: int,
            stock_count: int, setup: float, total: float, rounds: int = 1) -> None:
    args = "".join(f" {a}" for a in sys.argv[1:])
    print(f"command: .venv/bin/python -m bench.probot_compare{args}\n")
    head = ["installations", "app", "deliveries", "handled", "events/s", "ack p50 ms",
            "ack p99 ms", "acks > 10 s", "write p50 ms", "write p99 ms", "refusals",
            "CPU s / 1,000 events", "peak RSS MB", "write transactions / event",
            "vaultmail ÷ this"]
    print("| " + " | ".join(head) + " |")
    print("|" + "|".join("---" for _ in head) + "|")
    verdicts: list[str] = []
    notes: list[str] = []
    for cell, k in [(cell, k) for k in range(rounds) for cell in cells]:
        cell_rows = [(a, r) for a, r in rows if r["cell"] == cell and r["round"] == k]
        vm = next(r for a, r in cell_rows if a.key == "vm")
        if rounds > 1:
            cell_rows.sort(key=lambda ar: ar[0].key != "vm")
        shown = f"{cell}" if rounds == 1 else f"{cell} (round {k + 1})"
        for app, r in cell_rows:
            if r["bad"]:
                notes.append(f"{app.name}, {cell} installations: answers {r['bad']}")
            tx = "" if math.isnan(r["tx_per_event"]) else f"{r['tx_per_event']:.2f}"
            ratio = "" if app.key == "vm" else (
                f"**{vm['events_s'] / r['events_s']:.2f}**" if r["events_s"] else "∞")
            print(f"| {shown} | {app.name} | {r['count']} | {r['handled']} | "
                  f"{r['events_s']:.1f} | {ms(percentile(r['ack'], 50))} | "
                  f"{ms(percentile(r['ack'], 99))} | {r['timeouts']} | "
                  f"{ms(percentile(r['write'], 50))} | {ms(percentile(r['write'], 99))} | "
                  f"{r['refusals']} | {r['cpu_per_1000']:.1f} | {r['peak_mb']:.0f} | "
                  f"{tx} | {ratio} |")
            if app.key != "vm":
                clean = r["refusals"] == 0 and r["handled"] == r["count"]
                if clean:
                    ok = vm["events_s"] > r["events_s"]
                    verdicts.append(f"{shown} installations, {app.name} (no refusal): "
                                    f"vaultmail {vm['events_s'] / r['events_s']:.2f}x "
                                    f"{'ahead: met' if ok else 'behind: NOT met'}")
                else:
                    verdicts.append(f"{shown} installations, {app.name}: {r['refusals']} "
                                    f"refusals, {r['count'] - r['handled']} events lost "
                                    "(no comparison owed)")
        ok = vm["refusals"] == 0
        verdicts.append(f"{shown} installations, vaultmail: {vm['refusals']} refusals "
                        f"({'met' if ok else 'NOT met'})")
        if vm["ideal"] > 0:
            over = vm["window"] / vm["ideal"] - 1
            verdicts.append(
                f"{shown} installations: the limits cap it (at most {WRITES_PER_MINUTE} "
                f"PATCHes a minute per installation): fastest allowed {vm['ideal']:.0f} s, "
                f"vaultmail {vm['window']:.1f} s, {over * 100:+.1f} % "
                f"({'met' if over <= TARGET_CAP else 'NOT met'}, within 5 %)")
    if rounds > 1:
        _report_rounds(rows, cells, rounds)
    print(f"\n{count} deliveries per cell ({stock_count} for Probot with its default "
          f"throttling, a write a second), spread round-robin over the cell's installations, "
          f"{IN_FLIGHT} in flight, answers waited for {ACK_TIMEOUT:.0f} s; {WARMUP} warm-up "
          "deliveries per app not counted; the forge in this process under localforge.Limits()"
          " as shipped; vaultmail (`vaultmail serve`), each Probot app (probot 14.3.2 on Node "
          f"{_node_version()}) and the load client each in its own process; {os.cpu_count()} "
          f"cores; set-up {setup:.0f} s, whole run {total:.0f} s"
          + ("." if rounds == 1 else f"; {rounds} rounds, each cell's apps in turn, their "
             "order flipped every other round, each round on fresh organisations, a minute "
             "apart at least (each new installation's token is a POST to one App endpoint)."))
    for line in verdicts + notes:
        print(f"- {line}")


def _report_rounds(rows: list[tuple[App, dict[str, Any]]], cells: tuple[int, ...],
                   rounds: int) -> None:
    """Per cell and app against vaultmail: the ratio of each round (measured side by side,
    minutes apart at most), their median and the lowest; this machine's noise is in the
    spread, not hidden in one figure."""
    print("\n| installations | against | vaultmail ÷ this, each round | median | lowest |"
          " rounds ahead |")
    print("|---|---|---|---|---|---|")
    for cell in cells:
        by_round = {k: {a.key: (a, r) for a, r in rows if r["cell"] == cell and r["round"] == k}
                    for k in range(rounds)}
        for key in [a.key for a, r in rows if r["cell"] == cell and r["round"] == 0
                    and a.key != "vm"]:
            ratios = []
            for k in range(rounds):
                vm, other = by_round[k]["vm"][1], by_round[k][key][1]
                if other["events_s"] and other["refusals"] == 0:
                    ratios.append(vm["events_s"] / other["events_s"])
            if not ratios:
                continue
            name = by_round[0][key][0].name
            print(f"| {cell} | {name} | {', '.join(f'{x:.2f}' for x in ratios)} | "
                  f"**{statistics.median(ratios):.2f}** | {min(ratios):.2f} | "
                  f"{sum(x > 1 for x in ratios)} of {len(ratios)} |")


def _node_version() -> str:
    node = shutil.which("node")
    if node is None:
        return "?"
    return subprocess.run([node, "--version"], capture_output=True, text=True).stdout.strip()


def _arg(name: str, default: str) -> str:
    return sys.argv[sys.argv.index(name) + 1] if name in sys.argv else default


if __name__ == "__main__":
    if "--client" in sys.argv:
        client_main(_load)
    else:
        apps = _arg("--apps", "")  # e.g. "vm,po" while working on one; the report needs vm
        asyncio.run(main(tuple(int(c) for c in _arg("--cells", "1,10,50").split(",")),
                         int(_arg("--count", str(COUNT))),
                         int(_arg("--stock-count", str(STOCK_COUNT))),
                         set(apps.split(",")) if apps else None,
                         int(_arg("--rounds", "1"))))
