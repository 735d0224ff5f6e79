"""`vaultmail forge [--seed FILE] [--host] [--port] [--dialect github|gitea] [--data DIR]`.

The forge knows nothing of offices: `--seed` is handed to a `Seeder` the caller supplies
(vaultmail's command line passes one that reads an office config).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import signal
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # (loaded by the forge command alone: `vaultmail`'s others start without it)
    from .forge import LocalForge

# (forge, path of the seed file) -> {login: token} of the accounts it made
Seeder = Callable[["LocalForge", str], dict[str, str]]


def add_forge_parser(subparsers: Any) -> argparse.ArgumentParser:
    p: argparse.ArgumentParser = subparsers.add_parser(
        "forge", help="run the local forge alone (GitHub-compatible REST, App auth, webhooks)")
    configure_parser(p)
    p.set_defaults(func=run_forge)
    return p


def configure_parser(p: argparse.ArgumentParser) -> None:
    p.add_argument("--seed", metavar="FILE", help="office config (YAML) to seed the forge from")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8081)
    p.add_argument("--dialect", default="github", choices=["github", "gitea"])
    p.add_argument("--data", metavar="DIR", default=None, help="persist the forge state here")
    p.add_argument("--tokens", metavar="FILE", default=None,
                   help="write {login: token} of the seeded accounts here (JSON)")
    p.add_argument("--fault", metavar="ROUTE=STATUS[@RATE]", action="append", default=[],
                   help='inject errors, e.g. "POST /repos/{owner}/{repo}/issues=502@0.1" '
                        '(repeatable; also POST /_forge/faults at run time)')
    p.add_argument("--lose", metavar="ROUTE[@RATE]", action="append", default=[],
                   help='answer this fraction of writes to ROUTE, then lose them (GitHub '
                        'dialect), e.g. "PATCH /repos/{owner}/{repo}/issues/{issue_number}'
                        '@0.15" (repeatable)')
    p.add_argument("--drop-webhooks", metavar="RATE", type=float, default=0.0,
                   help="drop this fraction of webhook deliveries (recorded as failed)")
    p.add_argument("--duplicate-webhooks", metavar="RATE", type=float, default=0.0,
                   help="deliver this fraction of webhooks twice, with the same delivery id")


def parse_fault(spec: str) -> tuple[str, int, float]:
    """ "ROUTE=STATUS[@RATE]" -> (route, status, rate); raises ValueError saying what is wrong."""
    route, sep, rest = spec.rpartition("=")
    status_text, _, rate_text = rest.partition("@")
    try:
        status, rate = int(status_text), float(rate_text or 1.0)
    except ValueError:
        raise ValueError(f"--fault {spec!r}: expected ROUTE=STATUS[@RATE], "
                         'like "POST /repos/{owner}/{repo}/issues=502@0.1"') from None
    if not sep or not route or not 0.0 <= rate <= 1.0:
        raise ValueError(f"--fault {spec!r}: expected ROUTE=STATUS[@RATE] with RATE in 0..1")
    return route, status, rate


def parse_lose(spec: str) -> tuple[str, float]:
    """ "ROUTE[@RATE]" -> (route, rate); raises ValueError saying what is wrong."""
    route, sep, rate_text = spec.rpartition("@")
    if not sep:
        route, rate_text = spec, "1"
    try:
        rate = float(rate_text)
    except ValueError:
        rate = -1.0
    if not route.strip() or not 0.0 <= rate <= 1.0:
        raise ValueError(f"--lose {spec!r}: expected ROUTE[@RATE] with RATE in 0..1, like "
                         '"PATCH /repos/{owner}/{repo}/issues/{issue_number}@0.15"')
    return route, rate


def apply_fault_options(forge: LocalForge, args: argparse.Namespace) -> None:
    for spec in getattr(args, "fault", []):
        route, status, rate = parse_fault(spec)
        forge.faults.add(route=route, status=status, rate=rate)
    for spec in getattr(args, "lose", []):
        route, rate = parse_lose(spec)
        forge.faults.add(route=route, rate=rate, mode="lost")
    if getattr(args, "drop_webhooks", 0.0):
        forge.faults.drop_webhooks(rate=args.drop_webhooks)
    if getattr(args, "duplicate_webhooks", 0.0):
        forge.faults.duplicate_webhooks(rate=args.duplicate_webhooks)


async def run_forge(args: argparse.Namespace, stop: asyncio.Event | None = None,
                    seeder: Seeder | None = None) -> int:
    """Serve until SIGINT/SIGTERM (or `stop` is set); prints `forge ready <url>`."""
    if args.seed and seeder is None:
        print("forge: --seed needs a seeder (run it as `vaultmail forge --seed FILE`)",
              file=sys.stderr)
        return 2
    from .forge import LocalForge

    forge = LocalForge(dialect=args.dialect, data_dir=args.data)
    apply_fault_options(forge, args)
    await forge.start(host=args.host, port=args.port)
    try:
        if args.seed and seeder is not None:
            tokens = seeder(forge, args.seed)
            if args.tokens:
                Path(args.tokens).write_text(json.dumps(
                    {"forge_url": forge.url, "forge_tokens": tokens}, indent=2))
        print(f"forge ready {forge.url}", flush=True)
        stop = stop or asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            with contextlib.suppress(NotImplementedError, RuntimeError):
                loop.add_signal_handler(sig, stop.set)
        await stop.wait()
    finally:
        await forge.stop()
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m localforge")
    configure_parser(parser)
    return asyncio.run(run_forge(parser.parse_args(argv)))


if __name__ == "__main__":
    sys.exit(main())
