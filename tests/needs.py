"""What the tests need from the machine beyond the Python packages, set up by the tests
themselves so that the README's test command is all a fresh machine needs.

At the start of the run (tests/conftest.py, in the controlling process only: `set_up`) the
Debian packages of the programs that are not there (Chromium, Node.js and npm, PostgreSQL's
server) are installed with apt-get when the run is root's, once, with apt-get's own progress;
otherwise one line names each package to install. Then the Octokit packages (`npm ci`) where
they are missing. The tests that need a program say the same one line when it is still
missing, and the Octokit test runs `npm ci` itself when run alone (once, whichever test worker
gets there first). tests/pg.py starts its own PostgreSQL cluster."""

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
from collections.abc import Callable, Iterator
from pathlib import Path

CHROMIUM = "/usr/bin/chromium"  # Debian's, which the console's browser tests drive
POSTGRESQL = "/usr/lib/postgresql"  # Debian's server binaries: <version>/bin/pg_ctl
OCTOKIT = Path(__file__).parent / "conformance" / "octokit"  # package.json, package-lock.json


class Missing(Exception):
    """A program the tests need is not on this machine; the message says what to install."""


def _install(package: str, what: str) -> str:
    return (f"{what} is not installed: install Debian's `{package}` package (as root: apt-get "
            f"install -y {package}; the test run does it when run as root), then run the tests "
            "again")


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


def _pg_named() -> bool:
    """VAULTMAIL_TEST_PG names a server to use, or VAULTMAIL_PG_BIN a folder holding the
    server's binaries (tests/pg.py takes either before Debian's)."""
    folder = os.environ.get("VAULTMAIL_PG_BIN")
    return bool(os.environ.get("VAULTMAIL_TEST_PG")
                or (folder and Path(folder, "pg_ctl").is_file()))


def postgresql(lib: str = POSTGRESQL, path: str | None = None) -> None:
    """PostgreSQL's server binaries (tests/pg.py starts a throwaway cluster with them), unless
    VAULTMAIL_TEST_PG names a server to use instead; VAULTMAIL_PG_BIN may name their folder."""
    if _pg_named():
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


# what the tests need of the machine: the program, the Debian package that brings it, and what
# it is for (the one line said when it is missing)
WHAT = {
    "chromium": f"Chromium ({CHROMIUM}, for the console's browser tests)",
    "nodejs": "Node.js (for the Octokit conformance test)",
    "npm": "npm (for the Octokit conformance test's packages)",
    "postgresql": "PostgreSQL's server (pg_ctl and initdb, for the index's second engine)",
}


def missing_packages(path: str | None = None, chromium_at: str = CHROMIUM,
                     lib: str = POSTGRESQL) -> list[str]:
    """The Debian packages of the programs the tests need that are not on this machine (PATH,
    or `path`), in the order they are installed."""
    found = {
        "chromium": Path(chromium_at).is_file(),
        "nodejs": shutil.which("node", path=path) is not None,
        "npm": shutil.which("npm", path=path) is not None,
        "postgresql": bool(_pg_named() or glob.glob(f"{lib}/*/bin/pg_ctl")
                           or shutil.which("pg_ctl", path=path)),
    }
    return [package for package, there in found.items() if not there]


def set_up(*, root: bool, say: Callable[[str], None] = print, path: str | None = None,
           chromium_at: str = CHROMIUM, lib: str = POSTGRESQL,
           octokit: Path | None = OCTOKIT) -> list[str]:
    """What the README's test command does before any test: as root, apt-get installs the
    Debian packages of the missing programs (one `apt-get update`, one `apt-get install -y`,
    their output shown as it comes); otherwise, and for whatever is still missing, one line
    each naming the package. Then the Octokit packages (`npm ci`) when they are not installed.
    Nothing runs, and nothing is said, when everything is there. The packages still missing
    are returned (their tests fail with the same line)."""
    missing = missing_packages(path, chromium_at, lib)
    if missing and root:
        apt = shutil.which("apt-get", path=path)
        if apt is None:
            say(f"no apt-get on this machine to install {' '.join(missing)} with")
        else:
            say(f"installing what the tests need: apt-get install -y {' '.join(missing)}")
            env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
            for command in ([apt, "update"], [apt, "install", "-y", *missing]):
                ran = subprocess.run(command, env=env, check=False)
                if ran.returncode != 0:
                    say(f"`{' '.join(command[1:])}` failed (exit {ran.returncode})")
                    break
            missing = missing_packages(path, chromium_at, lib)
    for package in missing:
        say(_install(package, WHAT[package]))
    if octokit is not None and not {"nodejs", "npm"} & set(missing) and not _installed(octokit):
        say(f"installing the Octokit conformance test's packages: npm ci in {octokit}")
        try:
            npm_modules(octokit, path)
        except Missing as exc:
            say(str(exc))
    return missing
