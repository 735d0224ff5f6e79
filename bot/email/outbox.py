"""Replies out by email: an agent's `mail_reply` (or its comment on the issue) on mail from
`email:<address>` goes to that address through the relay, DKIM-signed, threaded, once.

It follows the office's ledger (`mail.replied` entries, each naming its reply) from a durable
cursor (`bot.store.outbound`, the webhooks' cursors, under the name `vaultmail:email-outbox`),
on the leader only. Each reply is sent under `Store.once`, keyed by its Message-ID (the same
on every try): a reply the relay accepted is never sent again by the app; a 4xx, or a relay
that cannot be reached, leaves the cursor where it is and tries again with backoff (0.5 s
doubling up to 5 minutes); a 5xx marks the reply bounced and tells the agent by mail.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import time
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from bot.app.background import Background
from bot.email import keys, outgoing, relay
from bot.email.addresses import address_of, agent_address
from bot.email.intake import EmailIntake
from bot.email.message import EmailMeta, read_meta
from bot.mail.markdown import WORD_JOINER
from bot.office.config import Office
from bot.store import idempotency, ledger, mails
from bot.store import outbound as cursors
from bot.store.mails import MailRecord

if TYPE_CHECKING:
    from bot.app.services import Services
    from bot.forge.base import Forge

log = logging.getLogger("vaultmail.email")
CURSOR = "vaultmail:email-outbox"
POLL = 0.5
BATCH = 100
MAX_BACKOFF = 300.0


class Deferred(Exception):
    """The relay said later (4xx) or could not be reached."""


def reply_text(comment_body: str, key: str) -> str:
    """What the agent wrote, from its reply's comment: the byline and marker of a reply the
    app posted taken off, mentions as written."""
    text = comment_body.replace(f"<!-- vaultmail:reply {key} -->", "")
    text = re.sub(r"^\*\*[^*\n]{1,120}\*\* replied:\n\n", "", text.lstrip())
    return text.replace("@" + WORD_JOINER, "@").strip()


class Outbox(Background):
    task_name = "vaultmail-email-outbox"

    def __init__(self, services: Services, intake: EmailIntake, relay_url: str) -> None:
        self.services, self.intake = services, intake
        self.relay = relay.Relay.parse(relay_url) if relay_url else None
        super().__init__()
        self._wake = asyncio.Event()

    def wake(self) -> None:
        self._wake.set()

    async def _run(self) -> None:
        while True:
            try:
                if await self.services.store.is_leader():
                    for office in await self.intake.offices():
                        await self.drain(office)
            except Exception as exc:  # keep going whatever one round did
                log.warning("email outbox round failed: %r", exc)
            self._wake.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), POLL)

    async def drain(self, office: Office) -> int:
        """Send the office's replies not sent yet; returns how many went."""
        org, store = office.org.lower(), self.services.store
        async with store.named_lock(f"email-outbox:{org}"):
            row = await cursors.get_cursor(store, org, CURSOR)
            if row is not None and row["next_at"] > time.time():
                return 0
            cursor, sent = (int(row["seq"]) if row else 0), 0
            for entry in await ledger.entries(store, since=cursor, limit=BATCH, org=org,
                                              event="mail.replied"):
                try:
                    sent += await self._entry(office, entry)
                except Exception as exc:
                    failures = (int(row["failures"]) if row else 0) + 1
                    delay = min(MAX_BACKOFF, 0.5 * 2 ** failures)
                    await cursors.save_cursor(store, org, CURSOR, cursor, failures,
                                              time.time() + delay, repr(exc))
                    log.warning("email reply not sent; retry in %.1fs", delay,
                                extra={"seq": entry.seq, "error": repr(exc)})
                    return sent
                cursor = entry.seq
            if cursor != (int(row["seq"]) if row else -1):
                await cursors.save_cursor(store, org, CURSOR, cursor, 0, 0.0, None)
            return sent

    async def _entry(self, office: Office, entry: ledger.Entry) -> int:
        key = entry.data.get("reply")
        mail = await mails.get_mail(self.services.store, str(entry.data.get("mail", "")))
        if not isinstance(key, str) or mail is None or address_of(mail.from_principal) is None:
            return 0  # not a reply to mail by email
        assert office.email is not None
        message_id = outgoing.reply_message_id(mail.mail_id, key, office.email.domain)

        async def work() -> idempotency.Result:
            return await self._send(office, mail, key, message_id)

        result = await self.services.store.once(
            f"email-out:{office.org.lower()}", message_id, idempotency.fingerprint(message_id),
            work)
        return 1 if result.get("state") == "sent" else 0

    async def _send(self, office: Office, mail: MailRecord, key: str,
                    message_id: str) -> dict[str, Any]:
        if self.relay is None:
            raise Deferred("no relay: set SMTP_URL to send replies by email")
        assert office.email is not None
        forge = self.services.forge_for_org(office.org)
        text, latest = await self._reply_and_latest(forge, mail, key)
        agent = office.agent(mail.to_principal.removeprefix("agent:"))
        sender = agent_address(office, agent) if agent is not None else None
        if agent is None or sender is None or latest is None:
            return {"state": "skipped", "why": "no agent address or no message to answer"}
        domain = office.email.domain
        ours = {a for a in (*latest.to, *latest.cc) if a.rpartition("@")[2] == domain}
        to = (latest.sender,)
        cc = tuple(a for a in dict.fromkeys((*latest.to, *latest.cc))
                   if a not in ours and a != latest.sender)
        out = outgoing.Outgoing(
            sender=sender, sender_name=f"{agent.slug} ({office.org})",
            to=to, cc=cc, subject=outgoing.reply_subject(mail.subject),
            message_id=message_id, in_reply_to=latest.message_id,
            references=(*latest.references, latest.message_id), text=text,
            sent=datetime.now(UTC))
        data = outgoing.sign(outgoing.to_wire(outgoing.compose(out)), domain=domain,
                             private_pem=keys.office_key(self.services.settings.data_dir,
                                                         office.org))
        answer = await relay.send(self.relay, sender, out.recipients, data)
        if answer.state == "deferred":
            raise Deferred(answer.detail)
        if answer.state == "rejected":
            await self.intake.report_bounce(office, mail, message_id, ", ".join(out.recipients),
                                            f"the relay refused it: {answer.detail}")
            return {"state": "bounced", "detail": answer.detail}
        marker = f"<!-- vaultmail:email-sent {message_id.strip('<>')} -->"
        if await forge.find_comment(mail.vault, mail.number, marker) is None:
            await forge.create_comment(mail.vault, mail.number, (
                f"📤 Sent by email to {', '.join(f'`{r}`' for r in out.recipients)} as "
                f"`{message_id}`.\n\n{marker}"), marker=marker)
        log.info("email reply sent", extra={"mail": mail.ref, "message_id": message_id})
        return {"state": "sent", "message_id": message_id, "to": out.recipients}

    async def _reply_and_latest(self, forge: Forge, mail: MailRecord,
                                key: str) -> tuple[str, EmailMeta | None]:
        """The reply's text, and the latest message by email before it in the thread (what
        it answers): the mail's own, or a later one posted as a comment."""
        latest = read_meta(mail.body)
        comments = await forge.list_comments(mail.vault, mail.number)
        text: str | None = None
        wanted_id = key.removeprefix("comment:") if key.startswith("comment:") else None
        for comment in comments:
            body = str(comment.get("body") or "")
            if (wanted_id is not None and str(comment.get("id")) == wanted_id) or (
                    wanted_id is None and f"<!-- vaultmail:reply {key} -->" in body):
                text = reply_text(body, key)
                break
            if "<!-- vaultmail:email-in " in body:
                latest = read_meta(body) or latest
        if text is None and wanted_id is not None:
            text = reply_text(str((await forge.get_comment(mail.vault,
                                                           int(wanted_id))).get("body") or ""),
                              key)
        if text is None:
            raise Deferred(f"the reply {key} is not on {mail.ref} yet")
        return text, latest
