"""Each engine written for itself (issue 22): the store says its SQL for each engine where
they differ, and nothing translates SQLite's dialect into PostgreSQL's any more."""

from __future__ import annotations

import importlib
import inspect
import pkgutil
import re
import time
from pathlib import Path
from typing import Any

import pytest

import bot.store
from bot.store import open_store
from bot.store import sql as store_sql
from bot.store.deliveries import Failed, note_failed
from bot.store.mails import MailRecord, find_mails, intend_send, mark_shown, put_mail
from bot.store.sql import Sql, Statement, ddl, for_postgres, numbered

# SQLite's own words: none may reach PostgreSQL, and a statement both engines take as written
# (a plain string) holds none of them (LIKE too: SQLite's ignores case, PostgreSQL's does not)
SQLITE_ONLY = {
    "INDEXED BY": re.compile(r"\bINDEXED\s+BY\b", re.IGNORECASE),
    "INSERT OR": re.compile(r"\bINSERT\s+OR\s+(IGNORE|REPLACE)\b", re.IGNORECASE),
    "json_extract": re.compile(r"\bjson_extract\s*\(", re.IGNORECASE),
    "scalar max()": re.compile(r"\bmax\s*\([^()]*,", re.IGNORECASE),
    "a comment for PostgreSQL": re.compile(r"/\*"),
    "WITHOUT ROWID": re.compile(r"\bWITHOUT\s+ROWID\b", re.IGNORECASE),
    "the catalogue": re.compile(r"\bsqlite_master\b|\bpragma_table_info\b"),
    "instr()": re.compile(r"\binstr\s*\(", re.IGNORECASE),
    "AUTOINCREMENT": re.compile(r"\bAUTOINCREMENT\b", re.IGNORECASE),
}
CASE_BLIND = re.compile(r"(?<![IN])LIKE\b")  # ILIKE, NOT LIKE aside
POSTGRES_ONLY = re.compile(r"\bILIKE\b|\bGREATEST\(|::|SKIP LOCKED|#>>|jsonb")


def _sqlite_words(text: str) -> list[str]:
    return [name for name, pattern in SQLITE_ONLY.items() if pattern.search(text)]


def _store_modules() -> list[Any]:
    return [importlib.import_module(f"bot.store.{m.name}")
            for m in pkgutil.iter_modules(bot.store.__path__)]


def test_no_translator_is_left() -> None:
    """The regex rules that rewrote SQLite's statements for PostgreSQL are gone: what each
    engine runs is written in the store's modules, not derived at run time."""
    for gone in ("to_postgres", "ddl_to_postgres", "column_to_postgres",
                 "autoincrement_columns", "placeholders"):
        assert not hasattr(store_sql, gone), gone
    source = inspect.getsource(store_sql)
    assert "import re" not in source and "re.compile" not in source
    postgres = importlib.import_module("bot.store.postgres")
    for gone in ("Cursor", "_Executing", "_Statement"):
        assert not hasattr(postgres, gone), gone


def test_binding_numbers_placeholders_and_nothing_else() -> None:
    assert numbered("SELECT * FROM t WHERE a=? AND b='?' AND c IN (?,?)") == (
        "SELECT * FROM t WHERE a=$1 AND b='?' AND c IN ($2,$3)")
    assert numbered("SELECT 'it''s ?', ?") == "SELECT 'it''s ?', $1"
    text = "SELECT * FROM queue INDEXED BY queue_claim WHERE id=?"
    assert "INDEXED BY" in for_postgres(text), "a plain string is sent as written"


def test_a_sql_value_cannot_be_formatted_into_text() -> None:
    value = Sql("max(a, b)", "GREATEST(a, b)")
    with pytest.raises(TypeError):
        f"SELECT {value}"  # noqa: B018
    joined = "SELECT " + value + " FROM t"
    assert isinstance(joined, Sql) and joined.postgres == "SELECT GREATEST(a, b) FROM t"


def test_every_declared_statement_differs_per_engine_only_where_it_must() -> None:
    """Each module-level `Sql` of the store differs between its engines' texts, by an idiom
    of one of them; its PostgreSQL text holds none of SQLite's; and no plain statement of
    the store holds one either."""
    declared: dict[str, Sql] = {}
    plain: dict[str, str] = {}
    for module in _store_modules():
        for name, value in vars(module).items():
            where = f"{module.__name__}.{name}"
            if isinstance(value, Sql):
                declared[where] = value
            elif isinstance(value, str) and name.isupper() and re.match(
                    r"\s*(SELECT|INSERT|UPDATE|DELETE|WITH)\b", value):
                plain[where] = value
    assert len(declared) >= 6, sorted(declared)
    for where, value in declared.items():
        assert value.sqlite != value.postgres, where
        assert _sqlite_words(value.sqlite) or POSTGRES_ONLY.search(value.postgres), where
        assert _sqlite_words(value.postgres) == [], where
        assert not CASE_BLIND.search(value.postgres), where
    # SQLite's claim (queue.CLAIM) is never sent to PostgreSQL, whose claim is CANDIDATES
    sqlite_only = {"bot.store.queue.CLAIM"}
    for where, text in plain.items():
        if where not in sqlite_only:
            assert _sqlite_words(text) == [], where
            assert not CASE_BLIND.search(text), where


def test_tables_are_written_once_with_each_engines_types() -> None:
    """PostgreSQL's tables are those it always had (what its indexes and older databases
    were made from): 64-bit integers and floats, byte-ordered text, identity keys."""
    table = ("CREATE TABLE IF NOT EXISTS t (\n    id {id},\n    n {int} NOT NULL,\n"
             "    at {real},\n    name {text},\n    raw {blob}\n){without_rowid};")
    assert ddl(table, "postgresql") == (
        "CREATE TABLE IF NOT EXISTS t (\n    id BIGINT GENERATED BY DEFAULT AS IDENTITY PRIMARY"
        " KEY,\n    n BIGINT NOT NULL,\n    at DOUBLE PRECISION,\n    name TEXT COLLATE \"C\",\n"
        "    raw BYTEA\n);")
    assert ddl(table, "sqlite") == (
        "CREATE TABLE IF NOT EXISTS t (\n    id INTEGER PRIMARY KEY AUTOINCREMENT,\n"
        "    n INTEGER NOT NULL,\n    at REAL,\n    name TEXT,\n    raw BLOB\n) WITHOUT ROWID;")
    from bot.store.migrations import migrations
    for m in migrations():
        for script in m.postgres:
            assert _sqlite_words(script) == [], (m.version, script[:80])
            assert not re.search(r"\{(id|int|real|text|blob|without_rowid)\}", script)


async def _workload(store: Any) -> None:
    """The store's statements that are said per engine, run once each (empty tables will
    do: what matters is what is sent)."""
    from bot.store import comments, ledger, moves, replies

    org = "acme"
    assert await store.enqueue_delivery("g1", "issues", {"action": "opened"}, b"{}")
    claimed = await store.due_items(limit=8)
    await store.next_wakeup()
    await store.next_due()
    for item in claimed:
        await store.finish(item)
    mail = MailRecord("m1", "acme/scout-vault", 1, "Hello there", "body", "agent:a",
                      "agent:scout", "2026-01-01T00:00:00Z", 0, None, "m1", "k", "h", "mail:new")
    async with store.transaction() as db:
        await put_mail(db, mail)
        await moves.note(db, "m1", 10.0)
        await moves.note(db, "m1", 5.0)
        await ledger.append(db, "mail.sent", "agent:a", "acme/scout-vault#1",
                            {"mail_id": "m1", "agent": "agent:a"}, org=org)
    assert [m.mail_id for m in await find_mails(store, org=org, state=None, agent=None,
                                                text="HELLO", limit=5)] == ["m1"]
    assert await intend_send(store, "m1", "acme/scout-vault")
    assert not await intend_send(store, "m1", "acme/scout-vault")
    await mark_shown(store, "agent:scout", 5.0, org=org)
    await mark_shown(store, "agent:scout", 9.0, org=org)
    await replies.keep(store, "m1", "r1", "words")
    await replies.keep(store, "m1", "r1", "words again")
    assert await replies.kept(store, "m1", "r1") == "words"
    assert await ledger.recorded(store, "mail.sent", "acme/scout-vault#1", "mail_id", "m1",
                                 org=org)
    assert await ledger.first_recorded(store, "mail.sent", "acme/scout-vault#1", "mail_id",
                                       "m1", org=org) is not None
    assert await ledger.record_once(store, "mail.sent", "agent:a", "acme/scout-vault#1",
                                    {"mail_id": "m1"}, org=org, by=("mail_id",)) is None
    assert len(await ledger.scan_newest(store, event=None, actor=None, since=None,
                                        until=None, before=None, about="agent:a",
                                        scanned=10, org=org)) == 1
    await note_failed(store, [Failed("g9", 7, time.time()), Failed("g9", 9, time.time())])
    await comments.unread_in(store, "human:sara", ["you"], org=org)
    await comments.has_unread(store, "human:sara", org=org)
    await comments.unseen_by(store, "human:sara", "agent:a", org=org)
    await comments.mark_seen(store, "human:sara", "agent:a", [(1, "c1")], org=org)
    await comments.unread_boxes(store, "human:sara", you=True, agent=None, agents=["agent:a"],
                                org=org)
    await comments.unread_boxes(store, "human:sara", you=False, agent="agent:a", agents=[],
                                org=org)
    await comments.seen_page(store, "human:sara", "agent:a", None, 10, org=org)
    await comments.questions_answered_by(store, "agent:a", 10, org=org)
    await comments.questions_asked_on(store, ["agent:a"], org=org)
    await comments.relevant_items(store, ["agent:a"], ["sara"], org=org)
    await comments.updates_for(store, ["agent:a"], ["sara"], [], None, None, 10, org=org)


async def test_what_postgresql_is_sent_is_its_own_dialect(
        tmp_path: Path, database_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every statement the PostgreSQL engine sends in a run of the store's per-engine
    statements is PostgreSQL's text: no SQLite idiom, no `?`; each `Sql` it is handed
    differs per engine; and the same run gives the same answers on SQLite."""
    postgres = importlib.import_module("bot.store.postgres")
    handed: list[Statement] = []

    def recording(statement: Statement) -> str:
        handed.append(statement)
        return for_postgres(statement)

    monkeypatch.setattr(postgres, "for_postgres", recording)
    store = await open_store(database_url if database_url.startswith("postgres")
                             else tmp_path / "index.sqlite3")
    try:
        await store.join()
        await _workload(store)
    finally:
        await store.close()
    if store.engine != "postgresql":
        assert handed == []
        return
    per_engine = [s for s in handed if isinstance(s, Sql)]
    assert len({s.postgres for s in per_engine}) >= 10
    for statement in handed:
        sent = for_postgres(statement)
        assert _sqlite_words(sent) == [], sent
        assert "?" not in re.sub(r"'(?:[^']|'')*'", "", sent), sent
        if isinstance(statement, Sql):
            assert statement.sqlite != statement.postgres, repr(statement)
        else:
            assert not CASE_BLIND.search(statement), statement
