"""Rebuild the mail index from the forge alone: headers for the signed values, labels for state.

Listing uses the forge client's ETag cache, so a second reindex with nothing changed is answered
with 304s that cost no rate limit.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from tqdm import tqdm

from bot.mail.header import Verdict, adopted_here, forge_id, verify_issue
from bot.office.config import Office
from bot.store import mails
from bot.store.mails import QUIET, MailRecord
from labels.states import state_from_labels

if TYPE_CHECKING:
    from bot.forge.base import Forge
    from bot.items.rebuild import WorkReport
    from bot.mail.signing import Verifier
    from bot.store import Store


@dataclass
class ReindexReport:
    vaults: int = 0
    issues: int = 0
    mails: int = 0
    tampered: list[str] = field(default_factory=list)
    copies: list[str] = field(default_factory=list)  # a genuine header on an issue not its own
    attachments: int = 0  # rows of the email attachments index (bot.email.attachments)
    work: WorkReport | None = None  # items, comments, questions (bot.items.rebuild)


def mail_from_issue(vault: str, issue: dict[str, Any], keys: Verifier, *,
                    app_login: str) -> MailRecord | None:
    """The index row an issue stands for, or None when it is not a signed mail (or holds a
    copy of one: signed for another vault, or bound to another issue)."""
    return _record(vault, issue, verify_issue(issue, vault, keys, app_login=app_login))


def _record(vault: str, issue: dict[str, Any], verdict: Verdict) -> MailRecord | None:
    header = verdict.header
    if header is None or not verdict.signed or verdict.copy:
        return None
    names = [str(label["name"]) for label in issue.get("labels", [])]
    state = state_from_labels(names)
    return MailRecord(
        mail_id=header.mail_id, vault=vault.lower(), number=int(issue["number"]),
        subject=header.subject, body=verdict.body, from_principal=header.from_principal,
        to_principal=header.to_principal, sent=header.sent, hops=header.hops,
        in_reply_to=header.in_reply_to, thread_id=header.thread_id, key_id=header.key_id,
        body_sha256=header.body_sha256, state=state.value if state else QUIET,
        tampered=not verdict.valid,
        other_labels=tuple(n for n in names if not n.lower().startswith("mail:")))


CLOCK_SKEW = 300  # seconds the forge's clock may be behind the app's when it opens an issue


def _opened(issue: dict[str, Any]) -> float | None:
    try:
        return datetime.fromisoformat(str(issue["created_at"]).replace("Z", "+00:00")).timestamp()
    except (KeyError, ValueError):
        return None


def closed_duplicate(issue: dict[str, Any]) -> bool:
    """Closed as not planned with no state label: how the app closes a late duplicate."""
    return issue.get("state") == "closed" and issue.get("state_reason") in (
        None, "not_planned") and not any(str(lb["name"]).startswith("mail:")
                                         for lb in issue.get("labels", []))


def _rank(record: MailRecord, issue: dict[str, Any], indexed: str | None) -> tuple[int, ...]:
    """Which of several issues carrying one genuine header is the mail (lowest first).

    An adopted mail's id names its issue; else one not closed as a duplicate (a stalled
    send's late copy, `Mailer.deliver`); else an untampered one; else the one the app opened
    when it signed the header (opened at or after `sent`: someone editing an older issue of
    the app's to carry a newer header made a copy), the earliest such: the original, with its
    replies, even where the index holds a later one (a send retried against an index restored
    from a backup opened that); last the issue the index held it at."""
    number = int(issue["number"])
    opened = _opened(issue)
    sent = datetime.strptime(record.sent, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC).timestamp()
    return (not adopted_here(record.mail_id, record.vault, number, forge_id(issue)),
            closed_duplicate(issue),
            record.tampered,
            opened is None or opened < sent - CLOCK_SKEW,
            int(opened or 0), number,
            indexed is not None and record.ref != indexed)


async def scan(forge: Forge, office: Office, keys: Verifier, *, app_login: str,
               indexed: dict[str, str] | None = None, progress: bool = False,
               listed: dict[str, list[dict[str, Any]]] | None = None,
               ) -> tuple[list[MailRecord], ReindexReport]:
    """Every mail in the office's vaults. Of two issues carrying one mail's header the
    original is kept (`_rank`); `indexed` (mail id -> ref, from the index being rebuilt)
    tells apart only what nothing else does. `listed` gets each vault's issues (the work
    graph's rebuild reads them again)."""
    report = ReindexReport()
    found: dict[str, tuple[tuple[int, ...], MailRecord]] = {}
    bar = tqdm(total=None, unit="issue", desc="reindex", disable=not progress, leave=True)
    for vault in office.vaults():
        report.vaults += 1
        bar.set_postfix_str(vault)
        seen = listed.setdefault(vault.lower(), []) if listed is not None else []
        # (what is read here becomes the office's index, tamper flags and all: on Gitea the
        # vault's login may be another account's now, unheard)
        await forge.owner_confirmed(vault)
        async for issue in forge.iter_issues(vault, state="all"):
            seen.append(issue)
            report.issues += 1
            bar.update(1)
            verdict = verify_issue(issue, vault, keys, app_login=app_login)
            record = _record(vault, issue, verdict)
            if record is None:
                if verdict.copy:
                    report.copies.append(f"{vault.lower()}#{issue['number']}")
                continue
            if record.tampered:
                report.tampered.append(record.ref)
            rank = _rank(record, issue, (indexed or {}).get(record.mail_id))
            kept = found.get(record.mail_id)
            if kept is None or rank < kept[0]:
                found[record.mail_id] = (rank, record)
            if kept is not None:  # one header on two issues: the one not kept is a copy
                report.copies.append(max((kept[0], kept[1].ref), (rank, record.ref))[1])
    bar.close()
    report.mails = len(found)
    return [record for _, record in found.values()], report


async def reindex(store: Store, forge: Forge, office: Office, keys: Verifier, *,
                  app_login: str, comment_key: bytes, progress: bool = False) -> ReindexReport:
    """Rebuild the mail index from the forge. `app_login` is the app's own forge account,
    which every mail the app opened was opened by (see `bot.mail.header.verify_issue`);
    `comment_key` seals its comments (`bot.email.keys.comment_key`), which the work graph's
    rebuild takes only as it wrote them."""
    indexed = {str(r["mail_id"]): f"{r['vault']}#{r['number']}"
               for r in await mails.indexed_places(store)}
    listed: dict[str, list[dict[str, Any]]] = {}
    found, report = await scan(forge, office, keys, app_login=app_login, indexed=indexed,
                               progress=progress, listed=listed)
    await mails.replace_all(store, found, office.vaults())
    if office.email is not None:  # email attachments: listed in the signed mail (issue 24)
        from bot.email.attachments import rebuild

        report.attachments = await rebuild(store, forge, office.vaults(), found,
                                           app_login=app_login)
    from bot.items.rebuild import rebuild as rebuild_work

    report.work = await rebuild_work(store, forge, office, app_login=app_login, key=comment_key,
                                     listed=listed)
    return report
