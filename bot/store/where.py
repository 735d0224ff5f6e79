"""Where the index is: `DATABASE_URL` names it (`sqlite:///PATH`, a plain path, or
`postgresql://...`). Nothing here opens it, so a command that only needs to know where (the
shell's tool commands) loads no database driver."""

from __future__ import annotations

import json
import os
from pathlib import Path


def is_postgres(target: str | Path) -> bool:
    return str(target).startswith(("postgresql://", "postgres://"))


def index_of(data_dir: Path) -> str:
    """The index a command run beside a data directory opens: DATABASE_URL when set (several
    replicas share it), else the database `vaultmail up --database-url` recorded there, else
    the SQLite file in the directory."""
    return os.environ.get("DATABASE_URL") or recorded_database(data_dir) or str(
        data_dir / "index.sqlite3")


def recorded_database(data_dir: Path) -> str:
    """The PostgreSQL URL an embedded office in `data_dir` keeps its index in, or ""."""
    try:
        identity = json.loads((data_dir / "app.json").read_text())
    except (OSError, ValueError):
        return ""
    url = identity.get("database_url") if isinstance(identity, dict) else None
    return url if isinstance(url, str) and is_postgres(url) else ""
