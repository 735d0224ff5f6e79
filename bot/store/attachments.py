"""Email attachments in the index (issue 24): what each accepted message's attachments are
and where they lie in the vault. The bytes are on the forge (committed under
`attachments/<mail id>/` through the contents API, bot.email.attachments); a row is written
once the file is there, and says which mail, which message, its name, type, size, git blob sha
and link. The mail's signed body lists the same (bot.email.message: path, size, type, sha),
so `vaultmail reindex` rebuilds the rows from the forge (bot.email.attachments.rebuild).
"""

from __future__ import annotations

from dataclasses import dataclass

from bot.store.db import Store, register_schema

VERSION = 9

register_schema("""
CREATE TABLE IF NOT EXISTS mail_attachments (
    mail_id {text} NOT NULL,        -- the mail it came with (a reply's: the thread's mail)
    path {text} NOT NULL,           -- in the vault: attachments/<mail id>/<name>
    org {text} NOT NULL,
    vault {text} NOT NULL,
    message_id {text} NOT NULL,     -- the email's Message-ID
    name {text} NOT NULL,           -- the file's name as committed (made safe)
    content_type {text} NOT NULL,
    size {int} NOT NULL,        -- bytes, decoded
    sha {text} NOT NULL,            -- the git blob sha the forge holds it as
    url {text} NOT NULL,            -- the file on the forge (html_url)
    PRIMARY KEY (mail_id, path)
);
CREATE INDEX IF NOT EXISTS mail_attachments_message ON mail_attachments(org, message_id);
""", version=VERSION)


@dataclass(frozen=True)
class AttachmentRow:
    mail_id: str
    path: str
    org: str
    vault: str
    message_id: str
    name: str
    content_type: str
    size: int
    sha: str
    url: str


_COLUMNS = ("mail_id", "path", "org", "vault", "message_id", "name", "content_type", "size",
            "sha", "url")


async def put(store: Store, rows: list[AttachmentRow]) -> None:
    """Index `rows` (one transaction); a row already there stays as it is."""
    if not rows:
        return
    async with store.transaction() as db:
        for row in rows:
            await db.execute(
                f"INSERT INTO mail_attachments({', '.join(_COLUMNS)})"
                f" VALUES ({', '.join('?' for _ in _COLUMNS)})"
                " ON CONFLICT(mail_id, path) DO NOTHING",
                tuple(getattr(row, c) for c in _COLUMNS))


async def of_mail(store: Store, mail_id: str) -> list[AttachmentRow]:
    """A mail's attachments (a thread's replies' too), in path order."""
    rows = await store.fetchall(
        f"SELECT {', '.join(_COLUMNS)} FROM mail_attachments WHERE mail_id=? ORDER BY path",
        (mail_id,))
    return [AttachmentRow(**{c: r[c] for c in _COLUMNS}) for r in rows]


async def replace_all(store: Store, rows: list[AttachmentRow], vaults: list[str]) -> None:
    """Replace the rows of `vaults` (one office's, as its reindex found them) with `rows`."""
    async with store.transaction() as db:
        for vault in vaults:
            await db.execute("DELETE FROM mail_attachments WHERE lower(vault)=?",
                             (vault.lower(),))
        for row in rows:
            await db.execute(
                f"INSERT INTO mail_attachments({', '.join(_COLUMNS)})"
                f" VALUES ({', '.join('?' for _ in _COLUMNS)})"
                " ON CONFLICT(mail_id, path) DO NOTHING",
                tuple(getattr(row, c) for c in _COLUMNS))
