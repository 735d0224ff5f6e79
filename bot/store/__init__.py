"""The app's only local state: the index, on SQLite (one process, the embedded default) or
PostgreSQL (several replicas), behind one interface (`bot.store.db.Store`).

Everything here can be rebuilt from the forge, except the work queue of deliveries not yet
handled. Handlers never speak SQL; they call these functions, and each engine runs its own
SQL: one text where both take it, one for each where they differ (`bot.store.sql`).
"""

# every module that registers tables, so that whatever opens the index first (the app, or a
# command such as `vaultmail token create` on a new data directory) makes all of them, each
# version whole: a later version's columns go on tables an earlier one made
from bot.store import (  # noqa: F401
    api_tokens,
    attachments,
    budget,
    chats,
    comments,
    deliveries,
    installations,
    ledger,
    mails,
    moves,
    oauth,
    offices,
    outbound,
    rates,
    replies,
    sessions,
    strangers,
    waiting,
)
from bot.store.db import Store
from bot.store.engines import index_of, is_postgres, open_store
from bot.store.queue import QueueItem

__all__ = ["QueueItem", "Store", "api_tokens", "index_of", "installations", "is_postgres",
           "ledger", "mails", "offices", "open_store"]
