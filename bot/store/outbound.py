"""The outbound webhook cursors (`bot.app.outbound`): per office and URL, the last ledger seq
it acknowledged and its backoff. Two offices naming one URL are two cursors, each over its own
office's entries; a cursor from before offices (`org` NULL, keyed by the URL alone) is where an
office's cursor for that URL starts."""

from __future__ import annotations

from bot.store.db import Connection, Row, Store, register_schema

register_schema("""
CREATE TABLE IF NOT EXISTS outbound_cursors (
    url {text} PRIMARY KEY,
    seq {int} NOT NULL DEFAULT 0,
    failures {int} NOT NULL DEFAULT 0,
    next_at {real} NOT NULL DEFAULT 0,
    last_error {text}
);
""")


def _key(org: str, url: str) -> str:
    return f"{org.lower()} {url}"  # a URL has no space: no office's key is another's


async def get_cursor(store: Store, org: str, url: str) -> Row | None:
    """The cursor row of `url` for `org`, or None before its first save."""
    return await store.fetchone("SELECT * FROM outbound_cursors WHERE url=?", (_key(org, url),))


async def legacy_seq(store: Store, url: str) -> int:
    """Where a URL's cursor stood before offices (0 when it had none): the ledger up to it was
    sent already."""
    row = await store.fetchone("SELECT seq FROM outbound_cursors WHERE url=? AND org IS NULL",
                               (url,))
    return int(row["seq"]) if row else 0


async def save_cursor(store: Store, org: str, url: str, seq: int, failures: int,
                      next_at: float, error: str | None) -> None:
    """Write the cursor of `url` for `org` (insert or update)."""
    async with store.transaction() as db:
        await db.execute(
            "INSERT INTO outbound_cursors(url, seq, failures, next_at, last_error, org)"
            " VALUES (?,?,?,?,?,?) ON CONFLICT(url) DO UPDATE SET seq=excluded.seq,"
            " failures=excluded.failures, next_at=excluded.next_at,"
            " last_error=excluded.last_error",
            (_key(org, url), seq, failures, next_at, error, org.lower()))


async def orgs_with(store: Store, url: str) -> list[str]:
    """The offices that have a cursor of `url` (lowercase)."""
    rows = await store.fetchall(
        "SELECT org FROM outbound_cursors WHERE org IS NOT NULL AND url=org || ' ' || ?",
        (url,))
    return [str(r["org"]) for r in rows]


async def cursors_under(store: Store, org: str, prefix: str) -> list[Row]:
    """`org`'s cursors whose URL begins with `prefix`, by seq (a range of the key, not LIKE:
    an org's name may hold LIKE's wildcards, and must never match another office's rows)."""
    low = _key(org, prefix)
    return await store.fetchall(
        "SELECT url, seq, failures, next_at FROM outbound_cursors WHERE url>=? AND url<?"
        " ORDER BY seq", (low, low + "\U0010ffff"))


async def move_cursors(db: Connection, org: str, to: str) -> None:
    """`org`'s cursors keyed under `to` (the office renamed, or moved aside: in the caller's
    transaction, `bot.store.offices`), where its forwarder reads them from then on: left
    under the old name, the office's webhooks were sent its whole ledger again, and whoever
    took the name after it found them. A row keyed under `to` already names no office of
    `to`'s (one moved before cursors moved with their office): it goes."""
    org, to = org.lower(), to.lower()
    await db.execute("DELETE FROM outbound_cursors WHERE substr(url, 1, ?)=?",
                     (len(to) + 1, _key(to, "")))
    await db.execute("UPDATE outbound_cursors SET url=? || substr(url, ?)"
                     " WHERE substr(url, 1, ?)=?",
                     (_key(to, ""), len(org) + 2, len(org) + 1, _key(org, "")))


async def drop_cursor(store: Store, org: str, url: str) -> None:
    """Forget `org`'s cursor of `url` (done with it)."""
    async with store.transaction() as db:
        await db.execute("DELETE FROM outbound_cursors WHERE url=?", (_key(org, url),))
