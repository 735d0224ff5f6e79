"""Rebuild the mail index from the forge alone: headers for the signed values, labels for state.

Listing uses the forge client's ETag cache, so a second reindex with nothing changed is answered
with 304s that cost no rate limit.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from tqdm import tqdm

from bot.mail.header import verify_mail
from bot.office.config import Office
from bot.store import mails
from bot.store.mails import QUIET, MailRecord
from labels.states import state_from_labels

if TYPE_CHECKING:
    from bot.forge.base import Forge
    from bot.mail.signing import Verifier
    from bot.store import Store


@dataclass
class ReindexReport:
    vaults: int = 0
    issues: int = 0
    mails: int = 0
    tampered: list[str] = field(default_factory=list)


def mail_from_issue(vault: str, issue: dict[str, Any], keys: Verifier) -> MailRecord | None:
    """The index row an issue stands for, or None when it is not a signed mail."""
    verdict = verify_mail(issue.get("title") or "", issue.get("body"), vault, keys)
    header = verdict.header
    if header is None or not verdict.signed or header.vault != vault.lower():
        return None  # not a mail, or a copy of one signed for another vault
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


async def scan(forge: Forge, office: Office, keys: Verifier, *,
               progress: bool = False) -> tuple[list[MailRecord], ReindexReport]:
    report = ReindexReport()
    found: dict[str, MailRecord] = {}
    bar = tqdm(total=None, unit="issue", desc="reindex", disable=not progress, leave=True)
    for vault in office.vaults():
        report.vaults += 1
        bar.set_postfix_str(vault)
        async for issue in forge.iter_issues(vault, state="all"):
            report.issues += 1
            bar.update(1)
            record = mail_from_issue(vault, issue, keys)
            if record is None:
                continue
            if record.tampered:
                report.tampered.append(record.ref)
            kept = found.get(record.mail_id)
            if kept is None or (kept.tampered and not record.tampered):
                found[record.mail_id] = record  # a pasted copy never displaces the original
    bar.close()
    report.mails = len(found)
    return list(found.values()), report


async def reindex(store: Store, forge: Forge, office: Office, keys: Verifier, *,
                  progress: bool = False) -> ReindexReport:
    found, report = await scan(forge, office, keys, progress=progress)
    await mails.replace_all(store, found)
    return report
