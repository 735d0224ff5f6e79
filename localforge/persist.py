"""Persistence: one JSON snapshot of the whole state in a SQLite file, rewritten after each
mutating request, so a forge restarted on the same data_dir continues where it stopped.

The state holds every token, password and OAuth client secret: the directory is its owner's
alone (0700) and the file 0600, made so before SQLite writes a byte (its -wal and -shm take
the file's mode), whatever the umask."""

from __future__ import annotations

import contextlib
import os
import sqlite3
from pathlib import Path

from .state import State

FILENAME = "localforge.sqlite3"


def _private(path: Path) -> None:
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    os.chmod(path.parent, 0o700)  # the forge's own directory (DATA/forge under `vaultmail up`)
    os.close(os.open(path, os.O_RDWR | os.O_CREAT, 0o600))
    for name in (path.name, path.name + "-wal", path.name + "-shm"):  # an older release's too
        with contextlib.suppress(FileNotFoundError):
            os.chmod(path.with_name(name), 0o600)


class Snapshotter:
    def __init__(self, data_dir: str | Path) -> None:
        self.path = Path(data_dir) / FILENAME
        _private(self.path)
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
