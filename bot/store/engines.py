"""Which engine holds the index: `DATABASE_URL` names it (`sqlite:///PATH`, a plain path, or
`postgresql://...`)."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import asyncpg

from bot.errors import IndexUnavailable
from bot.store.db import Store
from bot.store.postgres import PostgresStore
from bot.store.sqlite import SqliteStore
from bot.store.where import index_of, is_postgres, recorded_database

__all__ = ["index_of", "index_unavailable", "is_postgres", "open_store", "recorded_database",
           "unavailable"]

# What a database that is away (restarting, failing over, out of connections, a full disk)
# raises: the request can be tried again shortly, so it is a 503 with Retry-After, not a 500.
_AWAY = (OSError, TimeoutError, asyncpg.PostgresConnectionError, asyncpg.InterfaceError,
         asyncpg.CannotConnectNowError, asyncpg.TooManyConnectionsError,
         asyncpg.AdminShutdownError, asyncpg.CrashShutdownError)
_SQLITE_AWAY = ("database is locked", "disk i/o error", "database or disk is full",
                "unable to open database")


def unavailable(exc: BaseException) -> bool:
    """Whether `exc` says the index is away for now (as opposed to a defect)."""
    if isinstance(exc, _AWAY):
        return True
    if isinstance(exc, asyncpg.InternalClientError):  # a session cut under a statement
        return True
    if isinstance(exc, asyncpg.ObjectNotInPrerequisiteStateError):  # ALLOW_CONNECTIONS false
        return "accepting connections" in str(exc)
    return isinstance(exc, sqlite3.OperationalError) and any(
        words in str(exc).lower() for words in _SQLITE_AWAY)


def index_unavailable(what: str) -> IndexUnavailable:
    return IndexUnavailable(f"{what}: the app's database is unavailable for the moment; "
                            "nothing was recorded, try again shortly")


async def open_store(target: str | Path, *, synchronous: str = "normal") -> Store:
    """The store at `target`, its schema brought up to date. The app then `join`s it as a
    replica; a command that only reads or writes a row does not. `synchronous`: SQLite's
    (normal or full; PostgreSQL's durability is the server's own)."""
    text = str(target)
    if is_postgres(text):
        return await PostgresStore.open(text)
    if text.startswith("sqlite://"):
        text = text.removeprefix("sqlite://")
    return await SqliteStore.open(text, synchronous=synchronous)
