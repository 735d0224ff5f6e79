"""The numbers of PostgreSQL's advisory locks the store takes by name (sans-I/O).

Lock names hold text that tenants choose: an idempotency key, an outbound URL, a repository's
name in an issue's key. PostgreSQL's own `hashtextextended` is Jenkins' lookup3, which can be
run backwards: an office could choose a name whose lock is any number it likes (another
office's ledger, or the lock every transaction holds shared), and hold it. So the numbers are
64 bits of the SHA-256 of the name, which no one can steer:

* a transaction's key (`Store.transaction(key)`, `hold`): `lock_id(name)` in the one-key space;
* a named lock (`Store.named_lock`, held across transactions): `named_lock_pair(name)` in the
  two-key space, apart from every transaction key (never a class of the release before's).

`lock_id_sql` computes `lock_id` in SQL, for the statements that lock the rows they read."""

from __future__ import annotations

import hashlib

OLD_NAMED_CLASS = 0x766D  # the two-key class of the named locks of releases before schema 16
RELEASE_1_WRITE_LOCK = 0x766D_0001  # every write of the first release (bot.store.postgres)
MIGRATE_LOCK = 0x766D_0002  # schema migrations at start-up: one replica applies them
# the fixed one-key numbers: never taken as an older release's number for a key (a key could
# have been chosen to be one: lookup3 runs backwards)
RESERVED = [RELEASE_1_WRITE_LOCK, MIGRATE_LOCK]


def lock_id(name: str) -> int:
    """The one-key advisory lock of the transaction key `name`: the first 8 bytes of its
    SHA-256, as a signed 64-bit number (as PostgreSQL reads `bit(64)` as a bigint)."""
    return int.from_bytes(hashlib.sha256(name.encode()).digest()[:8], "big", signed=True)


def named_lock_pair(name: str) -> tuple[int, int]:
    """The two-key advisory lock (two signed 32-bit numbers) of the named lock `name`."""
    digest = hashlib.sha256(b"named\n" + name.encode()).digest()
    high = int.from_bytes(digest[:4], "big", signed=True)
    if high == OLD_NAMED_CLASS:  # (one name in four billion: kept out of the old locks' class)
        high ^= 1
    return high, int.from_bytes(digest[4:8], "big", signed=True)


def lock_id_sql(text_expr: str) -> str:
    """SQL for `lock_id` of the text the expression `text_expr` gives."""
    return (f"('x' || left(encode(sha256(convert_to({text_expr}, 'UTF8')), 'hex'), 16))"
            "::bit(64)::bigint")


__all__ = ["MIGRATE_LOCK", "OLD_NAMED_CLASS", "RELEASE_1_WRITE_LOCK", "RESERVED", "lock_id",
           "lock_id_sql", "named_lock_pair"]
