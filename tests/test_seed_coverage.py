"""docs/seed-coverage.md stays true: every test its rows name exists, in the file named, and
every code path they name is a file of the tree (a test renamed or moved breaks it here, not
silently in the table)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).parent.parent
TABLE = ROOT / "docs" / "seed-coverage.md"
TEST = re.compile(r"`(tests/[\w/]+\.py)::(\w+)")
CODE = re.compile(r"`((?:bot|handlers|labels|localforge)/[\w/]+\.py)")


def test_every_test_the_table_names_exists() -> None:
    named = TEST.findall(TABLE.read_text())
    assert len(named) > 100, "the table names its tests as `tests/<file>.py::<test>`"
    missing = []
    for path, name in sorted(set(named)):
        source = ROOT / path
        if not source.is_file() or not re.search(
                rf"^(?:async )?def {name}\(", source.read_text(), re.M):
            missing.append(f"{path}::{name}")
    assert missing == [], f"named in docs/seed-coverage.md, not found: {missing}"


def test_every_code_path_the_table_names_exists() -> None:
    missing = sorted({p for p in CODE.findall(TABLE.read_text()) if not (ROOT / p).is_file()})
    assert missing == [], f"named in docs/seed-coverage.md, not found: {missing}"
