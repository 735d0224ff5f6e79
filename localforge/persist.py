"""Persistence: one JSON snapshot of the whole state in a SQLite file, rewritten after each
mutating request, so a forge restarted on the same data_dir continues where it stopped."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from .state import State

FILENAME = "localforge.sqlite3"


class Snapshotter:
    def __init__(self, data_dir: str | Path) -> None:
        self.path = Path(data_dir) / FILENAME
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._db = sqlite3.connect(self.path, isolation_level=None)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute(
            "CREATE TABLE IF NOT EXISTS snapshot (id INTEGER PRIMARY KEY CHECK (id = 1),"
            " clock_offset REAL NOT NULL, state TEXT NOT NULL)"
        )

    def load(self) -> tuple[State, float] | None:
        row = self._db.execute("SELECT state, clock_offset FROM snapshot WHERE id = 1").fetchone()
        if row is None:
            return None
        return State.model_validate_json(row[0]), float(row[1])

    def save(self, state: State, clock_offset: float) -> None:
        self._db.execute(
            "INSERT INTO snapshot (id, clock_offset, state) VALUES (1, ?, ?)"
            " ON CONFLICT(id) DO UPDATE SET clock_offset = excluded.clock_offset,"
            " state = excluded.state",
            (clock_offset, state.model_dump_json()),
        )

    def close(self) -> None:
        self._db.close()
