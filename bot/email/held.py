"""Held mail (bot.email.policy): the queue a person sees of the outside mail held for their
agents, with each message's verdicts, and Release, the one way out other than Drop (closing
the mail, `mail_close`).

Whose it is: the held mail of the agents whose person the viewer is, and every agent's for an
editor (`Mailer.speaks_for_recipient`, what may move a mail on the recipient's side). Release
gives the mail to its agent as a follow-up from the person (`mail:new`, a run), ledgered
`email.released` once. Held mail carries the label `mail:held` (labels.states) until then.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from bot.email.message import read_meta
from bot.errors import Conflict
from bot.mail.mailer import Mailer
from bot.store import ledger, mails
from bot.store.mails import MailRecord
from labels.states import MailState

MAX_LISTED = 200


@dataclass(frozen=True)
class Held:
    mail: MailRecord
    reason: str
    sender: str
    verdicts: dict[str, Any]
    message_id: str


async def held_for(mailer: Mailer, viewer: str) -> list[Held]:
    """The mail held for `viewer` (see the module), newest first: held, and still so."""
    office, store = mailer.office, mailer.services.store
    out: list[Held] = []
    seen: set[str] = set()
    entries = await ledger.scan_newest(store, event="email.held", actor=None, since=None,
                                       until=None, before=None, about=None,
                                       scanned=MAX_LISTED, org=office.org)
    for entry in entries:
        mail_id = str(entry.data.get("mail", ""))
        if mail_id in seen:
            continue
        seen.add(mail_id)
        mail = await mails.get_mail(store, mail_id)
        if mail is None or mail.state != MailState.HELD.value \
                or not mailer.speaks_for_recipient(viewer, mail):
            continue
        meta = read_meta(mail.body)
        out.append(Held(mail=mail, reason=str(entry.data.get("reason") or "held"),
                        sender=mail.from_principal.removeprefix("email:"),
                        verdicts=meta.verdicts if meta is not None else {},
                        message_id=meta.message_id if meta is not None else ""))
    return out


async def count_for(mailer: Mailer, viewer: str) -> int:
    """How much mail is held for `viewer` (see the module): the count beside Held on every
    console page, one COUNT in the index for all the agents whose held mail is theirs."""
    office = mailer.office
    human = office.human(viewer.removeprefix("human:")) if viewer.startswith("human:") \
        else None
    editor = bool(human and "editor" in human.permissions)
    theirs = [a.principal for a in office.agents
              if editor or (a.person and viewer == f"human:{a.person.lower()}")]
    counts = await mails.count_to(mailer.services.store, org=office.org,
                                  state=MailState.HELD.value, recipients=theirs)
    return sum(counts.values())


async def release(mailer: Mailer, actor: str, mail: MailRecord) -> MailRecord:
    """Give held `mail` to its agent (a follow-up from `actor`: `mail:new`, a run), once."""
    mailer.own(mail)
    if not mailer.speaks_for_recipient(actor, mail):
        raise await mailer.deny(actor, mail.ref, (
            f"{actor} may not release {mail.ref}: only the person of "
            f"{mail.to_principal} or an editor can"))
    if not mail.from_principal.startswith("email:"):
        raise Conflict(f"{mail.ref} is no mail from outside: nothing to release")
    if mail.state == MailState.HELD.value:
        mail = await mailer.follow_up(mail, actor)
    await ledger.record_once(mailer.services.store, "email.released", actor, mail.ref,
                             {"mail": mail.mail_id, "to": mail.state}, org=mail.org,
                             by=("mail",), renamed=mailer.services.keyring.renamed(mail.org))
    return mail
