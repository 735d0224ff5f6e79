"""An accepted message's attachments in the agent's vault: each file committed through the
contents API at `attachments/<mail id>/<safe name>`, then listed in the mail's signed body
(bot.email.message.render_inbound) and indexed (bot.store.attachments).

- names are made safe (`safe_name`): the last component of what the sender wrote, without
  control, format or bidi characters, path separators, leading dots or characters a path or
  Markdown treats specially; clipped, the extension kept; `attachment` when nothing is left;
- a name is numbered (`report-2.pdf`) when another file of the message has it, or when the
  vault holds another file under it (a reply in the thread sent one by that name before);
  past two numbered names taken, it is named by its bytes (`report-<sha>.pdf`, `candidates`):
  a few reads a file, however many of that name the thread holds;
- exactly once: a file already at a path with the same bytes (its git blob sha) is the file,
  so a message sent again, or delivered again after a failure half-way, commits nothing twice;
- the sizes are checked at SMTP time (bot.email.server): here every part fits.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Sequence

from bot.email.message import META_PREFIX, Attached, EmailMeta, Part, read_meta
from bot.forge.base import Forge, blob_sha
from bot.store import attachments as index
from bot.store.db import Store
from bot.store.mails import MailRecord

MAX_ATTACHMENTS = 20  # files a message may carry (each is one write to the forge)
MAX_NAME = 100  # characters of a file name kept
_UNSAFE = re.compile(r"[^\w.\-+=,@ ]")
_ROOT = "attachments"


def safe_name(name: str) -> str:
    """`name` as a file name that is one path component and plain text (see the module)."""
    name = unicodedata.normalize("NFC", name)
    name = re.split(r"[/\\]", name)[-1]
    name = "".join(ch for ch in name if unicodedata.category(ch)[0] not in ("C", "Z")
                   or ch == " ")
    name = _UNSAFE.sub("_", name)
    name = re.sub(r"\s+", " ", name).strip(" .")
    name = re.sub(r"_{2,}", "_", name)
    if len(name) > MAX_NAME:
        stem, dot, ext = name.rpartition(".")
        if dot and 0 < len(ext) <= 10 and stem:
            name = stem[:MAX_NAME - len(ext) - 1].rstrip(" .") + "." + ext
        else:
            name = name[:MAX_NAME].rstrip(" .")
    return name or "attachment"


def numbered(name: str, n: int) -> str:
    """The `n`th name for `name` (1: itself): `report.pdf`, `report-2.pdf`, ..."""
    if n == 1:
        return name
    stem, dot, ext = name.rpartition(".")
    return f"{stem}-{n}.{ext}" if dot and stem else f"{name}-{n}"


def with_sha(name: str, sha: str) -> str:
    """`name` with `sha` (its bytes' blob sha, or its start) before its extension."""
    stem, dot, ext = name.rpartition(".")
    return f"{stem}-{sha}.{ext}" if dot and stem else f"{name}-{sha}"


def candidates(base: str, sha: str, used: set[str]) -> list[str]:
    """The names a part named `base` (made safe) with blob `sha` is looked for under, in
    order, the message's names already `used` (lower case) left out: two numbered names,
    then its bytes' (`report-<12 of its sha>.pdf`, then the whole sha). A fixed few, so a
    folder a thread's senders filled with one name costs each part at most four reads
    (numbered on until a free one, each part read the folder's every file of that name)."""
    numbers = (numbered(base, n) for n in range(1, MAX_ATTACHMENTS + 3))
    first = [name for name in numbers if name.lower() not in used][:2]
    return first + [name for name in (with_sha(base, sha[:12]), with_sha(base, sha))
                    if name.lower() not in used]


def _type(content_type: str) -> str:
    cleaned = re.sub(r"[^\w.+\-/]", "", content_type.lower())[:100]
    return cleaned if "/" in cleaned else "application/octet-stream"


def folder(mail_id: str) -> str:
    return f"{_ROOT}/{mail_id}"


async def commit(forge: Forge, vault: str, mail_id: str, parts: Sequence[Part], *,
                 message_id: str) -> tuple[Attached, ...]:
    """Commit each of `parts` to `vault` under `attachments/<mail_id>/` (once: see the
    module) and say where each lies."""
    used: set[str] = set()
    out: list[Attached] = []
    for part in parts:
        sha = blob_sha(part.data)
        for name in candidates(safe_name(part.filename), sha, used):
            path = f"{folder(mail_id)}/{name}"
            info = await forge.file_info(vault, path)
            if info is None:
                info = await forge.put_file(
                    vault, path, part.data,
                    f"Attachment {name} of mail {mail_id} (email {message_id[:200]})")
                break
            if info.get("sha") == sha:  # there already: this message's, sent before
                break
        else:  # (four names of other bytes, the last its whole sha: a SHA-1 collision)
            raise ValueError(f"no free name for {name} in {folder(mail_id)}")
        used.add(name.lower())
        out.append(Attached(name=name, path=path, size=len(part.data),
                            content_type=_type(part.content_type), sha=sha,
                            url=str(info.get("html_url") or "")))
    return tuple(out)


async def remember(store: Store, org: str, vault: str, mail_id: str, message_id: str,
                   attached: Sequence[Attached]) -> None:
    """Index the attachments of a message now in the vault (a row already there stays)."""
    await index.put(store, [
        index.AttachmentRow(mail_id=mail_id, path=a.path, org=org.lower(), vault=vault,
                            message_id=message_id, name=a.name, content_type=a.content_type,
                            size=a.size, sha=a.sha, url=a.url)
        for a in attached])


_TARGET = re.compile(r"[^)\s]*")


def link_of(name: str, text: str) -> str | None:
    r"""The target of the first link `[`name`](target)` in `text` (a target of neither spaces
    nor `)`), as `re.search(r"\[`" + re.escape(name) + r"`\]\(([^)\s]+)\)", text)`
    found it; without the regex, which read the rest of the text again from each
    `[`name`](` (50 KB of them, in a stranger's email, held `vaultmail reindex` 1.2 s a
    mail). Linear: a start whose target runs into a space or the end leaves that same end
    to every start whose target begins inside it, so the search goes on after those."""
    opening = f"[`{name}`]("
    pos = 0
    while (start := text.find(opening, pos)) >= 0:
        begin = start + len(opening)
        run = _TARGET.match(text, begin)
        end = run.end() if run is not None else begin
        if end > begin and text.startswith(")", end):
            return text[begin:end]
        pos = max(start + 1, end - len(opening) + 1)
    return None


def _rows(mail: MailRecord, meta: EmailMeta, text: str) -> list[index.AttachmentRow]:
    """The index rows of the attachments `meta` lists (its link read from the table in
    `text`, the body or comment that lists them)."""
    out = []
    for a in meta.attachments:
        link = link_of(a.name, text)
        url = link if link is not None and link != a.path else ""
        out.append(index.AttachmentRow(
            mail_id=mail.mail_id, path=a.path, org=mail.org, vault=mail.vault,
            message_id=meta.message_id, name=a.name, content_type=a.content_type, size=a.size,
            sha=a.sha, url=url))
    return out


async def rebuild(store: Store, forge: Forge, vaults: list[str], found: Sequence[MailRecord],
                  *, app_login: str) -> int:
    """The attachments index of `vaults` rebuilt from the forge (`vaultmail reindex`): the
    files each mail made of a message lists in its signed body, and those each message by
    email in its thread lists in the comment the app posted for it (an email mail's comments
    are read, one listing each). How many rows it holds now."""
    rows: list[index.AttachmentRow] = []
    for mail in found:
        if mail.tampered or not mail.from_principal.startswith("email:"):
            continue
        meta = read_meta(mail.body)
        if meta is not None:
            rows += _rows(mail, meta, mail.body)
        for comment in await forge.list_comments(mail.vault, mail.number):
            body = str(comment.get("body") or "")
            author = str((comment.get("user") or {}).get("login") or "")
            if author.lower() != app_login.lower() or META_PREFIX not in body:
                continue
            said = read_meta(body)
            if said is not None and said.attachments:
                rows += _rows(mail, said, body)
    await index.replace_all(store, rows, vaults)
    return len(rows)
