"""Rebuild the mail index from the forge alone: headers for the signed values, labels for state.

Listing uses the forge client's ETag cache, so a second reindex with nothing changed is answered
with 304s that cost no rate limit.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from tqdm import tqdm

from bot.header import verify_mail
from bot.office import Office
from bot.store import mails
from bot.store.mails import QUIET, MailRecord
from labels.states import state_from_labels

if TYPE_CHECKING:
    from bot.forge.base import Forge
    from bot.signing import Verifier
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
    if header is None or not verdict.signed:
        return None
    state = state_from_labels(label["name"] for label in issue.get("labels", []))
    return MailRecord(
        mail_id=header.mail_id, vault=vault.lower(), number=int(issue["number"]),
        subject=header.subject, body=verdict.body, from_principal=header.from_principal,
        to_principal=header.to_principal, sent=header.sent, hops=header.hops,
        in_reply_to=header.in_reply_to, thread_id=header.thread_id, key_id=header.key_id,
        body_sha256=header.body_sha256, state=state.value if state else QUIET,
        tampered=not verdict.valid)


async def scan(forge: Forge, office: Office, keys: Verifier, *,
               progress: bool = False) -> tuple[list[MailRecord], ReindexReport]:
    report = ReindexReport()
    found: list[MailRecord] = []
    bar = tqdm(total=None, unit="issue", desc="reindex", disable=not progress, leave=True)
    for vault in office.vaults():
        report.vaults += 1
        bar.set_postfix_str(vault)
        async for issue in forge.iter_issues(vault, state="all"):
            report.issues += 1
            bar.update(1)
            record = mail_from_issue(vault, issue, keys)
            if record is not None:
                found.append(record)
                if record.tampered:
                    report.tampered.append(record.ref)
    bar.close()
    report.mails = len(found)
    return found, report


async def reindex(store: Store, forge: Forge, office: Office, keys: Verifier, *,
                  progress: bool = False) -> ReindexReport:
    found, report = await scan(forge, office, keys, progress=progress)
    await mails.replace_all(store, found)
    return report
