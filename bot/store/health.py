"""Probes of the index file for readiness (`bot.app.web`'s `/readyz`)."""

from __future__ import annotations

import sqlite3
from pathlib import Path


def take_write_lock(path: Path, wait: float) -> None:
    """Take the index's write lock on a connection of its own and let it go, changing
    nothing; raises (`database is locked`, `readonly database`, ...) when no write could be
    made. Not on the store's connection: there a held lock would keep every read of the app
    waiting for SQLite's busy timeout (5 s), liveness probes included."""
    conn = sqlite3.connect(f"{path.resolve().as_uri()}?mode=rw", uri=True, timeout=wait,
                           isolation_level=None)
    try:
        conn.execute("BEGIN IMMEDIATE")
        conn.execute("ROLLBACK")
    finally:
        conn.close()
