"""The app's only local state: the index, on SQLite (one process, the embedded default) or
PostgreSQL (several replicas), behind one interface (`bot.store.db.Store`).

Everything here can be rebuilt from the forge, except the work queue of deliveries not yet
handled. Handlers never speak SQL; they call these functions, and each engine runs its own
SQL: one text where both take it, one for each where they differ (`bot.store.sql`).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from bot.store.db import Store
    from bot.store.engines import open_store
    from bot.store.queue import QueueItem
    from bot.store.where import index_of, is_postgres

__all__ = ["QueueItem", "Store", "index_of", "is_postgres", "open_store"]

# (loaded when first named: a command that only reads where the index is loads no driver;
# opening the index makes every module's tables, bot.store.migrations.migrations)
_WHERE = {"Store": "bot.store.db", "open_store": "bot.store.engines",
          "QueueItem": "bot.store.queue", "index_of": "bot.store.where",
          "is_postgres": "bot.store.where"}


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module 'bot.store' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
