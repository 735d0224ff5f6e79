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
    """A fresh clone: package.json and its lock file, no node_modules."""
    for name in ("package.json", "package-lock.json"):
        shutil.copy(OCTOKIT / name, tmp_path / name)
    modules = needs.npm_modules(tmp_path)
    assert (modules / "@octokit" / "rest" / "package.json").is_file()
    (tmp_path / "package-lock.json").unlink()  # installed: not run again (npm ci would fail)
    assert needs.npm_modules(tmp_path) == modules


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
