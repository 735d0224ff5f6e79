"""The tree stays as clean as its rules say: ruff's checks (pyproject's [tool.ruff]) pass on
every file, so a slip like an overlong line or a `print` in the CLI fails the suite, not a
later reader. (mypy strict is run by hand: a cold run takes minutes on 2 cores.)"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_ruff_finds_nothing() -> None:
    ruff = Path(sys.executable).parent / "ruff"
    done = subprocess.run([str(ruff), "check", "--no-cache", "."], cwd=ROOT,
                          capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
