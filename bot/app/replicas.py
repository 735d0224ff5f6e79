"""More replicas of the app beside the embedded one (`vaultmail up --replicas N`): each is
`vaultmail serve` in a process of its own, configured as an operator would configure it, on the
same PostgreSQL database and the same signing keys (the data directory)."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import sys
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp

from bot.app.settings import Settings

# seconds a replica may take to answer /readyz with 200: a bound on a failure, not a wait (it
# returns as soon as the replica is ready); generous, as several replicas starting at once on
# a busy machine (their imports, the schema's migration) take a while
READY_WITHIN = 120.0


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def serve_env(settings: Settings, *, port: int, replica_id: str) -> dict[str, str]:
    """`vaultmail serve`'s environment for one more replica of the app `settings` describe."""
    url = f"http://{settings.host}:{port}"
    env = {"DATABASE_URL": settings.database_url, "VAULTMAIL_DATA": str(settings.data_dir),
           "HOST": settings.host, "PORT": str(port), "REPLICA_ID": replica_id,
           "VAULTMAIL_PUBLIC_URL": url, "LOG_LEVEL": settings.log_level,
           "VAULTMAIL_RECONCILE_SECONDS": str(settings.reconcile_interval),
           "VAULTMAIL_DOCTOR_SECONDS": str(settings.doctor_interval),
           "VAULTMAIL_WEBHOOK_GRACE_SECONDS": str(settings.webhook_grace_seconds)}
    if settings.dialect == "gitea":
        env |= {"GITEA_URL": settings.api_url, "GITEA_TOKEN": settings.token,
                "GITEA_WEBHOOK_SECRET": settings.webhook_secret}
    else:
        env |= {"GITHUB_API_URL": settings.api_url, "GITHUB_APP_ID": settings.app_id,
                "PRIVATE_KEY": settings.private_key_pem.replace("\n", "\\n"),
                "GITHUB_WEBHOOK_SECRET": settings.webhook_secret,
                "GITHUB_CLIENT_ID": settings.client_id,
                "GITHUB_CLIENT_SECRET": settings.client_secret}
    return env


@dataclass
class Replica:
    """One `vaultmail serve` process."""

    replica_id: str
    url: str
    env: dict[str, str]
    log_path: Path | None = None
    module: str = "bot.cli.main"  # run as `python -m MODULE serve` (a test's launcher)
    proc: asyncio.subprocess.Process | None = field(default=None, repr=False)

    async def start(self) -> None:
        out = self.log_path.open("ab") if self.log_path else asyncio.subprocess.DEVNULL
        try:
            self.proc = await asyncio.create_subprocess_exec(
                sys.executable, "-m", self.module, "serve", env={**os.environ, **self.env},
                stdout=out, stderr=out)
        finally:
            if not isinstance(out, int):
                out.close()
        await self.until_ready()

    async def until_ready(self) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + READY_WITHIN
        last = "no answer yet"  # what /readyz said last, for the failure
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as s:
            while loop.time() < deadline:
                if self.proc is not None and self.proc.returncode is not None:
                    last = f"the process exited {self.proc.returncode}"
                    break
                try:
                    async with s.get(self.url + "/readyz") as resp:
                        if resp.status == 200:
                            return
                        last = f"{resp.status} {(await resp.text())[:500]}"
                except (aiohttp.ClientError, TimeoutError) as exc:
                    last = f"{type(exc).__name__}: {exc}"
                await asyncio.sleep(0.05)  # (polling a process we do not own the loop of)
            else:
                last = f"after {READY_WITHIN:.0f} s: {last}"
        raise RuntimeError(f"replica {self.replica_id}: {self.url}/readyz never answered 200 "
                           f"({last})" + self._log_tail())

    def _log_tail(self, lines: int = 30) -> str:
        if self.log_path is None:
            return ""
        try:
            tail = self.log_path.read_text(errors="replace").splitlines()[-lines:]
        except OSError as exc:
            return f"; its log {self.log_path}: {exc}"
        return f"; the end of its log {self.log_path}:\n" + "\n".join(tail)

    async def kill(self) -> None:
        """SIGKILL: no drain, no goodbye; the others take over what it held."""
        if self.proc is not None and self.proc.returncode is None:
            self.proc.kill()
            await self.proc.wait()

    async def stop(self) -> None:
        """SIGTERM: the graceful stop an orchestrator asks for."""
        if self.proc is not None and self.proc.returncode is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                await asyncio.wait_for(self.proc.wait(), 15.0)
            except TimeoutError:
                await self.kill()


async def start_replicas(settings: Settings, count: int, *,
                         first: int = 2) -> list[Replica]:
    """`count` more replicas (ids replica-`first`, ...), each ready when this returns."""
    if not settings.database_url.startswith(("postgresql://", "postgres://")):
        raise ValueError("several replicas share one PostgreSQL database: give --database-url "
                         "postgresql://USER@HOST/DB (SQLite holds one process)")
    replicas = []
    for n in range(first, first + count):
        port = free_port(settings.host)
        replica_id = f"replica-{n}"
        replicas.append(Replica(replica_id, f"http://{settings.host}:{port}",
                                serve_env(settings, port=port, replica_id=replica_id),
                                settings.data_dir / f"{replica_id}.log"))
    await asyncio.gather(*(r.start() for r in replicas))
    return replicas
