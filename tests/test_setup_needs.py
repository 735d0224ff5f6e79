"""The README's test command does its own set-up (issue 23): the Octokit packages are
installed by the test run when they are missing, and a program that is not on the machine
(Node.js, npm, Chromium) is one line naming the Debian package to install."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tests import needs

OCTOKIT = Path(__file__).parent / "conformance" / "octokit"


def test_the_octokit_packages_are_installed_when_missing(tmp_path: Path) -> None:
    """A fresh clone: package.json and its lock file, no node_modules. The run's start installs
    them (saying so), and the test's own fixture then finds them there."""
    octokit = tmp_path / "octokit"
    octokit.mkdir()
    for name in ("package.json", "package-lock.json"):
        shutil.copy(OCTOKIT / name, octokit / name)
    calls, said, left = _start(tmp_path, root=True, there=EVERYTHING, octokit=octokit)
    assert (calls, left) == ([], [])
    assert said == [f"installing the Octokit conformance test's packages: npm ci in {octokit}"]
    modules = octokit / "node_modules"
    assert (modules / "@octokit" / "rest" / "package.json").is_file()
    (octokit / "package-lock.json").unlink()  # installed: not run again (npm ci would fail)
    assert needs.npm_modules(octokit) == modules


@pytest.mark.parametrize(("name", "package"), [("node", "nodejs"), ("npm", "npm")])
def test_node_or_npm_missing_names_the_package(tmp_path: Path, name: str,
                                               package: str) -> None:
    if name == "npm":  # node there, npm not
        (tmp_path / "node").symlink_to(needs.program("node", "nodejs", "Node.js"))
    with pytest.raises(needs.Missing) as caught:
        needs.npm_modules(OCTOKIT, path=str(tmp_path))
    message = str(caught.value)
    assert f"install Debian's `{package}` package" in message and "\n" not in message


def test_chromium_missing_names_the_package(tmp_path: Path) -> None:
    with pytest.raises(needs.Missing) as caught:
        needs.chromium(str(tmp_path / "chromium"))
    assert "install Debian's `chromium` package" in str(caught.value)
    assert needs.chromium() == "/usr/bin/chromium"


def test_postgresql_missing_names_the_package(tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("VAULTMAIL_TEST_PG", raising=False)
    with pytest.raises(needs.Missing) as caught:
        needs.postgresql(lib=str(tmp_path / "lib"), path=str(tmp_path))
    assert "install Debian's `postgresql` package" in str(caught.value)
    assert "VAULTMAIL_TEST_PG" in str(caught.value)
    needs.postgresql()  # this machine has it


def test_a_server_vaultmail_pg_bin_names_is_not_missing(tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """No Debian server and no pg_ctl on PATH, but VAULTMAIL_PG_BIN names a folder holding one
    (tests/pg.py starts its cluster from it: bench/device/run.sh): nothing to install."""
    monkeypatch.delenv("VAULTMAIL_TEST_PG", raising=False)
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "pg_ctl").write_text("")
    monkeypatch.setenv("VAULTMAIL_PG_BIN", str(tmp_path / "bin"))
    needs.postgresql(lib=str(tmp_path / "lib"), path=str(tmp_path))
    assert "postgresql" not in needs.missing_packages(str(tmp_path), lib=str(tmp_path / "lib"))


# The start of the run (tests/conftest.py: needs.set_up in the controlling process), driven in
# a real subprocess whose PATH is one folder of this test's: a fake apt-get there records what
# it was asked and "installs" the programs of the packages it was given (or fails), so which
# packages the run would install, as root or not, is seen without running apt.
FAKE_APT = """#!{python}
import json, os, stat, sys
from pathlib import Path
with open(os.environ["APT_LOG"], "a") as log:
    log.write(json.dumps(sys.argv[1:]) + "\\n")
if os.environ.get("APT_FAILS"):
    sys.exit(100)
bin_dir = Path(os.environ["PATH"])
made = {{"nodejs": bin_dir / "node", "npm": bin_dir / "npm",
        "chromium": Path(os.environ["CHROMIUM_AT"]),
        "postgresql": Path(os.environ["PG_LIB"]) / "17" / "bin" / "pg_ctl"}}
for package in sys.argv[3:] if sys.argv[1:2] == ["install"] else []:
    made[package].parent.mkdir(parents=True, exist_ok=True)
    made[package].write_text("#!/bin/sh\\n")
    made[package].chmod(0o755)
"""

START = """import json, os, sys
from pathlib import Path
from tests import needs
missing = needs.set_up(root=sys.argv[1] == "root", chromium_at=os.environ["CHROMIUM_AT"],
                       lib=os.environ["PG_LIB"],
                       octokit=Path(sys.argv[2]) if len(sys.argv) > 2 else None)
print(json.dumps(missing))
"""

EVERYTHING = ("chromium", "node", "npm", "pg_ctl")


def _start(tmp_path: Path, *, root: bool, there: tuple[str, ...], apt: str = "works",
           octokit: Path | None = None) -> tuple[list[list[str]], list[str], list[str]]:
    """The run's start on a machine with only `there` of the programs: apt-get's calls, the
    lines said, the packages left missing."""
    import json
    import os
    import subprocess
    import sys

    bin_dir, lib, chromium = tmp_path / "bin", tmp_path / "postgresql", tmp_path / "chromium"
    bin_dir.mkdir()
    for name in ("node", "npm"):
        if name in there:  # the real ones: npm ci may run
            (bin_dir / name).symlink_to(needs.program(name, name, name))
    if "chromium" in there:
        chromium.write_text("")
    if "pg_ctl" in there:
        (lib / "15" / "bin").mkdir(parents=True)
        (lib / "15" / "bin" / "pg_ctl").write_text("")
    if apt != "absent":
        (bin_dir / "apt-get").write_text(FAKE_APT.format(python=sys.executable))
        (bin_dir / "apt-get").chmod(0o755)
    log = tmp_path / "apt.log"
    env = {k: v for k, v in os.environ.items() if k != "VAULTMAIL_TEST_PG"}
    env.update(PATH=str(bin_dir), APT_LOG=str(log), CHROMIUM_AT=str(chromium), PG_LIB=str(lib))
    if apt == "fails":
        env["APT_FAILS"] = "1"
    ran = subprocess.run([sys.executable, "-c", START, "root" if root else "user",
                          *([str(octokit)] if octokit else [])],
                         cwd=Path(__file__).parent.parent, env=env, capture_output=True,
                         text=True, timeout=60, check=True)
    *said, left = ran.stdout.splitlines()
    calls = [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []
    return calls, said, json.loads(left)


@pytest.mark.parametrize(("there", "packages"), [
    (("node", "npm"), ["chromium", "postgresql"]),
    (("chromium", "pg_ctl"), ["nodejs", "npm"]),
    (("chromium", "node", "pg_ctl"), ["npm"]),
    ((), ["chromium", "nodejs", "npm", "postgresql"]),
])
def test_as_root_the_missing_programs_packages_are_installed_once(
        tmp_path: Path, there: tuple[str, ...], packages: list[str]) -> None:
    calls, said, left = _start(tmp_path, root=True, there=there)
    assert calls == [["update"], ["install", "-y", *packages]]
    assert said == [f"installing what the tests need: apt-get install -y {' '.join(packages)}"]
    assert left == []


def test_not_root_each_missing_package_is_one_line_and_nothing_is_installed(
        tmp_path: Path) -> None:
    calls, said, left = _start(tmp_path, root=False, there=("node",))
    assert calls == []
    assert left == ["chromium", "npm", "postgresql"]
    assert len(said) == 3
    for line, package in zip(said, left, strict=True):
        assert f"install Debian's `{package}` package" in line


@pytest.mark.parametrize("apt", ["fails", "absent"])
def test_as_root_what_apt_could_not_install_is_named(tmp_path: Path, apt: str) -> None:
    calls, said, left = _start(tmp_path, root=True, there=("chromium", "node", "npm"), apt=apt)
    assert left == ["postgresql"]
    if apt == "fails":
        assert calls == [["update"]]
        assert said[1] == "`update` failed (exit 100)"
    else:
        assert said[0] == "no apt-get on this machine to install postgresql with"
    assert "install Debian's `postgresql` package" in said[-1]


def test_everything_there_nothing_runs_and_nothing_is_said(tmp_path: Path) -> None:
    """This machine's case, and CI's after the first run: no apt-get, no npm ci, no line."""
    calls, said, left = _start(tmp_path, root=True, there=EVERYTHING, octokit=OCTOKIT)
    assert (calls, said, left) == ([], [], [])
