"""The numbers of PostgreSQL's advisory locks the store takes by name (sans-I/O).

Lock names hold text that tenants choose: an idempotency key, an outbound URL, a repository's
name in an issue's key. PostgreSQL's own `hashtextextended` is Jenkins' lookup3, which can be
run backwards: an office could choose a name whose lock was any number it liked (another
office's ledger, or the lock every transaction holds shared), and hold it. So a lock's number
is 64 bits of the SHA-256 of its name, which no one can steer, as two 32-bit halves in the
two-key space (`lock_pair`):

* a transaction's key (`Store.transaction(key)`, `hold`): `lock_pair(name)`;
* a named lock (`Store.named_lock`, held across transactions): `named_lock_pair(name)`, and
  its second hold, on another session (`named_lock_second_pair(name)`: bot.store.postgres),
  each apart from every transaction key by its prefix.

The two-key space is the releases before this one's only for their named locks' class
(`OLD_NAMED_CLASS`), which no pair here takes; everything else they numbered went to the
one-key space (hashtextextended, and the fixed numbers below). So while an older replica lives
and its numbers are taken beside these (bot.store.postgres), none of them can ever be a lock
of this release, however it was chosen. `lock_pair_sql` computes `lock_pair` in SQL, for the
statements that lock the rows they read."""

from __future__ import annotations

import hashlib

OLD_NAMED_CLASS = 0x766D  # the two-key class of the named locks of releases before schema 16
RELEASE_1_WRITE_LOCK = 0x766D_0001  # every write of the first release (bot.store.postgres)
MIGRATE_LOCK = 0x766D_0002  # schema migrations at start-up: one replica applies them
# the fixed one-key numbers: never taken as an older release's number for a key (a key could
# have been chosen to be one: lookup3 runs backwards)
RESERVED = [RELEASE_1_WRITE_LOCK, MIGRATE_LOCK]


def lock_pair(name: str) -> tuple[int, int]:
    """The two-key advisory lock (two signed 32-bit numbers, as PostgreSQL reads `bit(32)` as
    an int) of the transaction key `name`: the first 8 bytes of its SHA-256, the first half
    never the old named locks' class."""
    digest = hashlib.sha256(name.encode()).digest()
    high = int.from_bytes(digest[:4], "big", signed=True)
    if high == OLD_NAMED_CLASS:  # (one name in four billion)
        high ^= 1
    return high, int.from_bytes(digest[4:8], "big", signed=True)


def named_lock_pair(name: str) -> tuple[int, int]:
    """The two-key advisory lock of the named lock `name`."""
    return lock_pair("named\n" + name)


def named_lock_second_pair(name: str) -> tuple[int, int]:
    """The two-key advisory lock a named lock `name` is held by a second time, on a session of
    its own (bot.store.postgres: one session cut, the other keeps it until the holder stops)."""
    return lock_pair("named-second\n" + name)


def lock_pair_sql(text_expr: str) -> str:
    """SQL for `lock_pair` of the text the expression `text_expr` gives: two arguments."""
    digest = f"sha256(convert_to({text_expr}, 'UTF8'))"
    high = f"('x' || encode(substr({digest}, 1, 4), 'hex'))::bit(32)::int"
    low = f"('x' || encode(substr({digest}, 5, 4), 'hex'))::bit(32)::int"
    return f"{high} # ({high} = {OLD_NAMED_CLASS})::int, {low}"


__all__ = ["MIGRATE_LOCK", "OLD_NAMED_CLASS", "RELEASE_1_WRITE_LOCK", "RESERVED", "lock_pair",
           "lock_pair_sql", "named_lock_pair", "named_lock_second_pair"]
