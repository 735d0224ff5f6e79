"""The app's only local state: one SQLite file (WAL) behind this package.

Everything here can be rebuilt from the forge, except the work queue of deliveries not yet
handled. Handlers never speak SQL; they call these functions, so another backend could replace
SQLite without touching them.
"""

from bot.store import api_tokens, ledger, mails
from bot.store.db import Store
from bot.store.queue import QueueItem

__all__ = ["QueueItem", "Store", "api_tokens", "ledger", "mails"]
