"""The store's connection interface (`Connection`, which each engine implements natively) and
its SQL, each statement as each engine takes it: sans-I/O, cached.

Most statements both engines take as written: those stay plain strings, and PostgreSQL's
engine only numbers their `?` placeholders (`$1`, `$2`, ...: binding, not translation). Where
the dialects differ (SQLite's INDEXED BY, scalar max(), INSERT OR IGNORE, case-blind LIKE and
json_extract; PostgreSQL's GREATEST, ON CONFLICT DO NOTHING, ILIKE and JSON operators) a
statement is a `Sql`, written out once for each. What one engine alone runs (SQLite's claim,
PostgreSQL's claim that skips locked rows) is that engine's plain string, run only there.
Tables are written once, with the type of each column named by a slot (`{text}`, `{int}`, ...)
that each engine fills with its own (`ddl`).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Literal, Protocol, TypeVar

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Sql:
    """A statement said once for each engine (where their dialects differ)."""

    sqlite: str
    postgres: str

    def __add__(self, other: Statement) -> Sql:
        if isinstance(other, Sql):
            return Sql(self.sqlite + other.sqlite, self.postgres + other.postgres)
        return Sql(self.sqlite + other, self.postgres + other)

    def __radd__(self, other: str) -> Sql:
        return Sql(other + self.sqlite, other + self.postgres)

    def __str__(self) -> str:
        raise TypeError("a Sql is said once per engine: join it with +, not in an f-string")

    def __format__(self, spec: str) -> str:
        raise TypeError("a Sql is said once per engine: join it with +, not in an f-string")


Statement = str | Sql
Engine = Literal["sqlite", "postgresql"]

Row = Any  # sqlite3.Row or asyncpg.Record: both index by name and by position
Params = Sequence[Any]


class Connection(Protocol):
    """A connection inside a transaction, as each engine provides it natively (SQLite's over
    aiosqlite, PostgreSQL's over asyncpg). A statement is a plain string both engines take, or
    a `Sql` said for each (bot.store.sql)."""

    # which engine it is, where the two must take a step in different statements: each of
    # PostgreSQL's costs a round trip (folded into one where its dialect can), SQLite's
    # `run_transaction` runs whole in one hop to its thread (each kept plain there)
    engine: Engine
    # whether the engine runs writers side by side, so that `hold` takes a lock
    keyed: bool
    # whether keys are also taken as a live replica of an older release takes them
    # (PostgreSQL, bot.store.postgres: OLDER_WAY)
    older_keys: bool
    # what the transaction has learnt that no other writer can change before it ends (the
    # keys it holds keep them out): the numbers it gave, the ledger chain's head it wrote
    memo: dict[Any, Any]

    async def execute(self, sql: Statement, params: Params = ()) -> int:
        """Run a statement; how many rows it changed."""

    async def fetchone(self, sql: Statement, params: Params = ()) -> Row | None: ...

    async def fetchall(self, sql: Statement, params: Params = ()) -> list[Row]: ...

    async def insert(self, sql: Statement, params: Params = ()) -> int:
        """Run an INSERT ... RETURNING <its id column>: the id it made (0 when it made none,
        e.g. a conflict it ignored)."""

    async def executemany(self, sql: Statement, rows: Iterable[Params]) -> None: ...

    async def hold(self, key: str) -> None:
        """Wait for, then hold to the transaction's end, `key` (see bot.store.db.hold).
        SQLite's one writer holds every key already: nothing to do."""


def for_sqlite(statement: Statement) -> str:
    return statement.sqlite if isinstance(statement, Sql) else statement


def for_postgres(statement: Statement) -> str:
    """The statement as PostgreSQL's engine sends it: its own text, placeholders numbered."""
    return numbered(statement.postgres if isinstance(statement, Sql) else statement)


@lru_cache(maxsize=4096)
def numbered(sql: str) -> str:
    """`?` -> `$1`, `$2`, ... outside quoted strings (asyncpg binds by number)."""
    if "?" not in sql:
        return sql
    out: list[str] = []
    n = 0
    quoted = False
    for ch in sql:
        if ch == "'":
            quoted = not quoted
        elif ch == "?" and not quoted:
            n += 1
            out.append(f"${n}")
            continue
        out.append(ch)
    return "".join(out)


# Column types, per engine. PostgreSQL's: 64-bit integers and floats as SQLite stores them,
# text compared byte by byte as SQLite compares it (listings sort the same on both engines),
# identity keys for SQLite's AUTOINCREMENT (never reused), and no WITHOUT ROWID.
TYPES: dict[Engine, dict[str, str]] = {
    "sqlite": {"id": "INTEGER PRIMARY KEY AUTOINCREMENT", "int": "INTEGER", "real": "REAL",
               "text": "TEXT", "blob": "BLOB", "without_rowid": " WITHOUT ROWID"},
    "postgresql": {"id": "BIGINT GENERATED BY DEFAULT AS IDENTITY PRIMARY KEY",
                   "int": "BIGINT", "real": "DOUBLE PRECISION", "text": 'TEXT COLLATE "C"',
                   "blob": "BYTEA", "without_rowid": ""},
}


def ddl(script: str, engine: Engine) -> str:
    """A table's (or column's, or index's) declaration with `engine`'s type names filled in
    (its `{slot}`s; nothing else in the text is touched)."""
    for slot, name in TYPES[engine].items():
        script = script.replace("{" + slot + "}", name)
    return script


def upsert(table: str, columns: list[str], key: list[str],
           computed: dict[str, str] | None = None) -> str:
    """INSERT, or UPDATE the row with the same `key`: one statement both engines take (where
    SQLite's INSERT OR REPLACE has no PostgreSQL twin). `computed`: columns set to an SQL
    expression (no parameter), on insert and update alike."""
    computed = computed or {}
    marks = ",".join(["?" for _ in columns] + list(computed.values()))
    sets = ", ".join([f"{c}=excluded.{c}" for c in columns if c not in key]
                     + [f"{c}={e}" for c, e in computed.items()])
    return (f"INSERT INTO {table}({', '.join([*columns, *computed])}) VALUES ({marks})"
            f" ON CONFLICT({', '.join(key)}) DO UPDATE SET {sets}")


def padded(values: Sequence[T]) -> list[T]:
    """`values`, the last repeated up to the next power of two: an `IN (...)` or `OR` list of
    any length 1-N is one of log2(N) statements, not N (each statement a connection prepares
    and keeps: two such lists in one statement were thousands of shapes, past what a
    connection keeps, STATEMENTS_KEPT)."""
    if not values:
        return []
    size = 1 << (len(values) - 1).bit_length()
    return [*values, *[values[-1]] * (size - len(values))]


def indexed_by(table: str, index: str) -> Sql:
    """`table` (with its alias, if any) read through `index`: SQLite is told which (its
    planner, lacking statistics, may choose another); PostgreSQL's planner chooses."""
    return Sql(f"{table} INDEXED BY {index}", table)


def greatest(a: str, b: str) -> Sql:
    """The larger of two values: SQLite's two-argument max(), PostgreSQL's GREATEST."""
    return Sql(f"max({a}, {b})", f"GREATEST({a}, {b})")


def json_at(column: str) -> Sql:
    """The value in `column`'s JSON at a path the next parameter gives (`$.a.b`, a path both
    engines read alike), as text: SQLite's json_extract, PostgreSQL's jsonpath."""
    return Sql(f"json_extract({column}, ?)",
               f"(jsonb_path_query_first({column}::jsonb, ?::jsonpath) #>> '{{}}')")
