"""What the tests need from the machine beyond the Python packages, set up by the tests
themselves so that the README's test command is all a fresh machine needs: the Octokit
packages (`npm ci`, once, whichever test worker gets there first), and, where a program is not
there (Node.js, Chromium, PostgreSQL's server), one line naming the Debian package to install.
(tests/pg.py starts its own PostgreSQL cluster, and says the same when `pg_ctl` is missing.)"""

from __future__ import annotations

import contextlib
import fcntl
import glob
import hashlib
import json
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

CHROMIUM = "/usr/bin/chromium"  # Debian's, which the console's browser tests drive


class Missing(Exception):
    """A program the tests need is not on this machine; the message says what to install."""


def _install(package: str, what: str) -> str:
    return (f"{what} is not installed: install Debian's `{package}` package (as root: apt-get "
            f"install -y {package}), as .ci/run does, then run the tests again")


def program(name: str, package: str, what: str, path: str | None = None) -> str:
    """The program's path on PATH (or `path`), else Missing naming the package."""
    found = shutil.which(name, path=path)
    if found is None:
        raise Missing(_install(package, what))
    return found


def chromium(executable: str = CHROMIUM) -> str:
    if not Path(executable).is_file():
        raise Missing(_install("chromium", f"Chromium ({executable}, for the console's browser "
                                           "tests)"))
    return executable


def postgresql(lib: str = "/usr/lib/postgresql", path: str | None = None) -> None:
    """PostgreSQL's server binaries (tests/pg.py starts a throwaway cluster with them), unless
    VAULTMAIL_TEST_PG names a server to use instead."""
    if os.environ.get("VAULTMAIL_TEST_PG"):
        return
    if glob.glob(f"{lib}/*/bin/pg_ctl") or shutil.which("pg_ctl", path=path):
        return
    raise Missing(_install("postgresql", "PostgreSQL's server (pg_ctl and initdb, for the "
                                         "index's second engine)")
                  + ", or set VAULTMAIL_TEST_PG=postgresql://USER@HOST:PORT/postgres")


@contextlib.contextmanager
def _only_one(folder: Path) -> Iterator[None]:
    """One process at a time sets up `folder` (test workers run side by side)."""
    key = hashlib.sha256(str(folder.resolve()).encode()).hexdigest()[:16]
    with open(Path(tempfile.gettempdir()) / f"vaultmail-setup-{key}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _installed(folder: Path) -> bool:
    """Every dependency of package.json is in node_modules, at the version it pins."""
    wanted = json.loads((folder / "package.json").read_text()).get("dependencies", {})
    for name, version in wanted.items():
        manifest = folder / "node_modules" / name / "package.json"
        if not manifest.is_file():
            return False
        if json.loads(manifest.read_text()).get("version") != version and \
                version[:1].isdigit():
            return False
    return True


def npm_modules(folder: Path, path: str | None = None) -> Path:
    """`npm ci` in `folder` unless its node_modules is installed from its lock file already;
    Missing if Node.js or npm is not there, one line with npm's own complaint if it fails."""
    program("node", "nodejs", "Node.js (for the Octokit conformance test)", path)
    npm = program("npm", "npm", "npm (for the Octokit conformance test's packages)", path)
    with _only_one(folder):
        if not _installed(folder):
            ran = subprocess.run([npm, "ci", "--no-audit", "--no-fund", "--loglevel=error"],
                                 cwd=folder, capture_output=True, text=True, check=False)
            if ran.returncode != 0:
                last = (ran.stderr.strip().splitlines() or ["no output"])[-1]
                raise Missing(f"`npm ci` in {folder} failed (exit {ran.returncode}): {last}")
    return folder / "node_modules"
