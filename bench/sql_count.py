"""The SQL statements a vaultmail process runs on SQLite, counted from outside (no product
code changed): the companion to `write transactions / event` for bench.probot_compare, where
`vaultmail serve` is its own process.

With BENCH_SQL=/tmp/profiles/sql, bench.probot_compare starts `vaultmail serve` with
bench/trace_site on PYTHONPATH; its sitecustomize calls install(), which sets SQLite's trace
callback on the store's connection (every statement it steps, savepoints and those a trigger
runs included) and rewrites `BENCH_SQL.vm.json` ten times a second with the count so far, each
statement's text with its literals taken out, and how often. The bench reads it before and
after each cell and prints the statements per event and the commonest.
"""

from __future__ import annotations

import json
import re
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

_LITERALS = re.compile(r"'(?:[^']|'')*'|\b\d+(?:\.\d+)?\b")
counts: Counter[str] = Counter()


def _seen(statement: str) -> None:
    counts[_LITERALS.sub("?", " ".join(statement.split()))[:120]] += 1


def install(path: str) -> None:
    from bot.store.sqlite import SqliteStore

    opened = SqliteStore.open.__func__  # type: ignore[attr-defined]

    async def open_counting(cls: type[SqliteStore], *args: Any, **kwargs: Any) -> SqliteStore:
        store: SqliteStore = await opened(cls, *args, **kwargs)
        await store._db.set_trace_callback(_seen)  # noqa: SLF001
        return store

    SqliteStore.open = classmethod(open_counting)  # type: ignore[method-assign,assignment]

    def dump() -> None:
        while True:
            time.sleep(0.1)
            snapshot = dict(counts)
            text = json.dumps({"statements": sum(snapshot.values()), "by": snapshot})
            Path(path + ".tmp").write_text(text)
            Path(path + ".tmp").replace(path)

    threading.Thread(target=dump, name="bench-sql-count", daemon=True).start()


def read(path: str) -> Counter[str]:
    """The counts so far (empty before the first dump)."""
    try:
        return Counter(json.loads(Path(path).read_text())["by"])
    except FileNotFoundError:
        return Counter()
