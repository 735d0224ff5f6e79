"""What every shell command shares: a problem said in one line with what to do, the exit
codes, the one `--json` shape, and the data directory check.

Exit status: 0 done; 1 refused (a tool refused, a mail is tampered or unsigned, a token was
not live); 2 a usage problem or the infrastructure (the app or the forge unreachable, a data
directory that is not one, something not found).

`--json` prints one object: `{"ok": true, "result": ...}` or `{"ok": false, "error": {"code",
"message"}}` (for an agent, its `inbox` beside `error`), and the problem's line goes to stderr
as well.
"""

from __future__ import annotations

import argparse
import os
import sqlite3
import sys
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from bot.cli.output import say, say_json
from bot.forge.errors import ForgeError
from bot.store.where import index_of, is_postgres

USAGE, REFUSED = 2, 1


class ShellFailure(Exception):
    """A command cannot do what it was asked: `message` says why and what to do."""

    def __init__(self, code: str, message: str, *, status: int = USAGE,
                 extra: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.code, self.message, self.status = code, message, status
        self.extra = extra or {}

    def as_json(self) -> dict[str, Any]:
        return {"ok": False, "error": {"code": self.code, "message": self.message},
                **self.extra}


def wants_json(args: argparse.Namespace) -> bool:
    return bool(getattr(args, "json", False))


def done(result: Any) -> None:
    """A --json result, in the one shape (commands print for people otherwise)."""
    say_json({"ok": True, "result": result})


def fail(args: argparse.Namespace, failure: ShellFailure) -> int:
    """Say it in one line (and as JSON with --json); the exit status."""
    if wants_json(args):
        say_json(failure.as_json())
    command = " ".join(c for c in (getattr(args, "command", None), _sub(args)) if c)
    say(f"vaultmail {command}: {failure.message}".replace("\n", " "), file=sys.stderr)
    return failure.status


def _sub(args: argparse.Namespace) -> str | None:
    for name in ("token_command", "keys_command"):
        value = getattr(args, name, None)
        if isinstance(value, str):
            return value
    return None


def _where(url: str) -> str:
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.netloc}" if parts.netloc else url


def forge_unreachable(url: str, why: object) -> ShellFailure:
    return ShellFailure("forge_unreachable", (
        f"cannot reach the forge at {_where(url)} ({why}): is it running? For an office of "
        "`vaultmail up`, start it again with the same --data DIR; for a real forge, check "
        "GITHUB_API_URL / GITEA_URL"))


def infrastructure(exc: BaseException) -> ShellFailure | None:
    """An infrastructure problem as one line with what to do, or None for anything else (a
    bug, which keeps its traceback)."""
    import aiohttp  # (here, not at the top: a command that makes no request loads no client)
    from gidgethub import HTTPException

    if isinstance(exc, ShellFailure):
        return exc
    if isinstance(exc, ForgeError):
        if exc.status is None:
            return forge_unreachable(exc.url, exc.message)
        return ShellFailure("forge_error", (
            f"the forge refused: {exc}; check that the App is installed and may do this"))
    if isinstance(exc, HTTPException):  # gidgethub, before the forge client exists
        return ShellFailure("forge_error", (
            f"the forge answered {exc.status_code}: {exc}; check the App's credentials "
            "(app.json of --data DIR, or GITHUB_APP_ID and its private key)"))
    if isinstance(exc, aiohttp.ClientConnectorError):
        return ShellFailure("unreachable", (
            f"cannot reach {exc.host}:{exc.port} ({exc.os_error.strerror or exc.os_error}): "
            "is it running? Check the URL given (--app, --keys-url) or --data DIR"))
    if isinstance(exc, aiohttp.ClientError | TimeoutError):
        return ShellFailure("unreachable", (
            f"a request failed ({type(exc).__name__}: {exc}): is the app or forge running? "
            "Check --app, --keys-url or --data DIR"))
    if isinstance(exc, sqlite3.Error):
        return ShellFailure("bad_data_dir", (
            f"the index cannot be used ({exc}): check --data DIR (or VAULTMAIL_DATA): it must "
            "be the data directory of `vaultmail up --data DIR` or of the app"))
    if isinstance(exc, OSError) and exc.filename:
        return ShellFailure("bad_data_dir", (
            f"{exc.filename}: {exc.strerror or exc}: check --data DIR (or VAULTMAIL_DATA): it "
            "must be the data directory of `vaultmail up --data DIR` or of the app"))
    return None


def data_path(data: str | None) -> Path:
    return Path(data or os.environ.get("VAULTMAIL_DATA") or "vaultmail-data")


def existing_data_dir(data: str | None, *, needs: str = "index.sqlite3") -> Path:
    """The data directory of an office (`--data`, VAULTMAIL_DATA, ./vaultmail-data) that
    holds `needs`: a mistyped path is refused, never made anew beside the real one."""
    path = data_path(data)
    how = ("pass --data DIR: the directory `vaultmail up --data DIR` (or the app's "
           "VAULTMAIL_DATA) keeps its state in")
    if not path.exists():
        raise ShellFailure("bad_data_dir", f"{path} does not exist: {how}")
    if not path.is_dir():
        raise ShellFailure("bad_data_dir", f"{path} is not a directory: {how}")
    elsewhere = needs == "index.sqlite3" and is_postgres(index_of(path))  # PostgreSQL
    if needs and not elsewhere and not (path / needs).exists():
        raise ShellFailure("bad_data_dir", f"{path} holds no vaultmail data (no {needs}): {how}")
    return path
