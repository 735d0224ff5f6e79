"""The console's own reads of the index, for what no tool lists (their queries are in
`bot.store`, like every other). Every row found here is shown only after the shared visibility
check (`bot.office.visibility.Viewer`) says the person may see it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from bot.office.visibility import Viewer
from bot.store import Store, chats, ledger, mails
from bot.store import comments as db
from bot.store.mails import MailRecord

SCANNED = 400  # mails looked at for one Mail page (newest first)
THREADS = 30  # threads one Mail page shows


async def find_mails(store: Store, *, org: str, state: str | None, agent: str | None,
                     text: str | None, limit: int = SCANNED) -> list[MailRecord]:
    """`org`'s mails newest first: in `state`, to or from `agent` (a principal), with `text`
    in the subject or body."""
    return await mails.find_mails(store, org=org, state=state, agent=agent, text=text,
                                  limit=limit)


@dataclass(frozen=True)
class Thread:
    thread_id: str
    mails: list[MailRecord]  # in the order they were sent: a mail, then the replies to it

    @property
    def subject(self) -> str:
        return self.mails[0].subject

    @property
    def latest(self) -> str:
        return self.mails[-1].sent


async def threads(store: Store, viewer: Viewer, found: list[MailRecord],
                  limit: int = THREADS) -> list[Thread]:
    """The threads of `found` (newest activity first), each with every mail of it the viewer
    may see, in order."""
    order: list[str] = []
    for mail in found:
        if viewer.sees_mail(mail) and mail.thread_id not in order:
            order.append(mail.thread_id)
        if len(order) == limit:
            break
    out = []
    for thread_id in order:
        members = [m for m in await mails.list_mails(store, org=viewer.office.org,
                                                     thread=thread_id)
                   if viewer.sees_mail(m)]
        if members:
            out.append(Thread(thread_id, in_order(members)))
    return out


def in_order(thread: list[MailRecord]) -> list[MailRecord]:
    """A thread's mails as they were sent, a reply after the mail it answers (`sent` is to
    the second: a reply copy made at once has the same)."""
    by_ref = {m.ref: m for m in thread}

    def depth(mail: MailRecord) -> int:
        seen: set[str] = set()
        while mail.in_reply_to in by_ref and mail.ref not in seen:
            seen.add(mail.ref)
            mail = by_ref[mail.in_reply_to]
        return len(seen)

    return sorted(thread, key=lambda m: (m.sent, depth(m)))


async def agent_mails(store: Store, viewer: Viewer, agent: str) -> list[MailRecord]:
    return [m for m in await mails.latest_mails_of(store, agent, org=viewer.office.org)
            if viewer.sees_mail(m)]


async def ledger_page(store: Store, viewer: Viewer, *, event: str | None, actor: str | None,
                      since: float | None, until: float | None, about: str | None = None,
                      before: int | None = None, limit: int = 50,
                      scanned: int = 5000) -> tuple[list[ledger.Entry], int | None]:
    """Ledger entries newest first, filtered, that the viewer may see; and the seq to page on
    from (None: nothing older). `about` keeps those an agent acted in or is named in."""
    scan = await ledger.scan_newest(store, event=event, actor=actor, since=since, until=until,
                                    before=before, about=about, scanned=scanned,
                                    org=viewer.office.org)
    shown: list[ledger.Entry] = []
    last_seen: int | None = None
    async for entry, seen in viewer.entries_seen(scan, store):
        last_seen = entry.number
        if seen:
            shown.append(entry)
            if len(shown) == limit:
                break
    more = last_seen if (len(shown) == limit or len(scan) == scanned) else None
    return shown, more


async def ledger_kinds(store: Store) -> list[str]:
    return sorted(ledger.EVENTS)


async def chain_state(store: Store, org: str) -> dict[str, Any]:
    """`org`'s hash chain as `vaultmail ledger --org` checks it: intact or where it breaks,
    its head."""
    broken = await ledger.verify_chain(store, org)
    head = await ledger.head(store, org)
    return {"intact": broken is None, "broken_at": broken,
            # the chain's own length: the head's seq counts every office's entries
            "entries": await ledger.length(store, org),
            "head": str(head["hash"]) if head else ledger.GENESIS}


async def chats_with(store: Store, viewer: Viewer, sender: str, agent: str,
                     limit: int = 20) -> list[dict[str, Any]]:
    """The person's chats with an agent, oldest first, as far as the viewer may see them."""
    rows = await chats.chats_between(store, sender, agent, limit, org=viewer.office.org)
    return [dict(r) for r in reversed(rows)
            if viewer.sees_chat(str(r["sender"]), str(r["agent"]), r["org"])]


async def answered_by(store: Store, viewer: Viewer, principal: str,
                      limit: int = 10) -> list[db.ThreadRow]:
    """Open questions `principal` answered (or whose answer was theirs, relayed by their
    agent): where a person changes their answer (`amend`)."""
    ids = await db.questions_answered_by(store, principal, limit, org=viewer.office.org)
    found = [t for i in ids if (t := await db.get_thread(store, i)) is not None]
    shown = await viewer.visible({t.item for t in found})
    return [t for t in found if t.item in shown]
