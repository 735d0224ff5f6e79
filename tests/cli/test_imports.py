"""Each command loads what it needs: every `vaultmail` process pays for its imports before it
does anything (agents run the shell's commands one after another, the tests hundreds), so a
command that makes no HTTP request loads no HTTP client, one that opens the index loads
neither the office config's models nor the signing keys' cryptography, and none but those that
run the app loads the app's services. Each command runs in a process of its own, as a user's."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path

from bot.app.embedded import Embedded
from bot.store import index_of, open_store
from tests.test_cli_tools import ROOT

# what a command that does not use them must not load (cumulative import times on a 2-core
# machine: aiohttp's client ~170 ms, the settings with pydantic_settings ~260 ms, the office
# config's models ~230 ms, the app's services ~400 ms more)
HTTP = ["aiohttp", "gidgethub"]
APP = ["bot.app.services", "bot.app.build", "bot.app.settings", "pydantic_settings"]
MAIL = ["bot.office.config", "bot.mail.signing", "bot.mail.header", "cryptography", "dkim",
        "dns", "pydantic"]

# the command as `python -m bot.cli.main` runs it, then the heavy modules it loaded
_PROBE = """
import json, sys
from bot.cli.main import main
try:
    main(sys.argv[1:])
except SystemExit:
    pass
sys.stdout.flush()
print(json.dumps(sorted(sys.modules)), file=sys.stderr)
"""


async def _loaded(*argv: str, env: dict[str, str] | None = None) -> set[str]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-c", _PROBE, *argv, cwd=str(ROOT), stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        env={**os.environ, **(env or {})})
    out, err = await proc.communicate()
    assert proc.returncode == 0, err.decode()
    modules: list[str] = json.loads(err.decode().splitlines()[-1])
    return set(modules)


def _heavy(loaded: set[str], names: list[str]) -> list[str]:
    return [name for name in names if name in loaded]  # (a package is there with any of its)


async def test_help_loads_no_http_client_no_settings_and_no_office_models() -> None:
    loaded = await _loaded("--help")
    assert "argparse" in loaded  # (the probe ran the command)
    assert _heavy(loaded, HTTP + APP + MAIL) == []


async def test_a_command_that_reads_the_index_loads_neither_the_office_models_nor_http(
        tmp_path: Path, database_url: str) -> None:
    if not database_url:  # (PostgreSQL's: at this release's schema, as the app leaves it)
        store = await open_store(index_of(tmp_path))
        await store.close()
    loaded = await _loaded("token", "list", "--data", str(tmp_path),
                           env={"DATABASE_URL": database_url} if database_url else None)
    assert "bot.store.api_tokens" in loaded
    assert _heavy(loaded, HTTP + APP + MAIL) == []


async def test_a_command_that_acts_for_the_app_loads_no_dkim_nor_dns_resolver(
        embedded: Embedded) -> None:
    """DKIM and dnspython are for the app's email (signing, checking, the listener): `doctor`,
    `verify` and `reindex` build the app's services without them."""
    loaded = await _loaded("doctor", "--dry-run", "--json", "--data", str(embedded.data_dir))
    assert "bot.app.services" in loaded  # (it acted for the app)
    assert _heavy(loaded, ["dkim", "dns", "aiosmtplib", "bot.email.outgoing"]) == []
