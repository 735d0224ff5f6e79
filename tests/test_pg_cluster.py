"""The tests' PostgreSQL: fresh databases are empty, distinct, and gone once dropped."""

from __future__ import annotations

import asyncpg

from tests import pg


async def test_fresh_databases_are_distinct_and_dropped() -> None:
    a, b = await pg.fresh_database(), await pg.fresh_database()
    assert a != b
    try:
        conn = await asyncpg.connect(a)
        try:
            await conn.execute("CREATE TABLE t (x int)")
            await conn.execute("INSERT INTO t VALUES (1)")
            assert await conn.fetchval("SELECT x FROM t") == 1
        finally:
            await conn.close()
        other = await asyncpg.connect(b)
        try:
            assert await other.fetchval("SELECT to_regclass('t')") is None
        finally:
            await other.close()
    finally:
        await pg.drop_database(a)
        await pg.drop_database(b)
    admin = await asyncpg.connect(pg.cluster_url())
    try:
        name = a.rsplit("/", 1)[1]
        assert await admin.fetchval("SELECT 1 FROM pg_database WHERE datname=$1", name) is None
    finally:
        await admin.close()
