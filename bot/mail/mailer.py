"""Mail (seed mail.md): send, adopt, open, reply, close, follow up, and the loop guard.

The thin I/O around the pure core (bot.mail.header, labels.states): every state change is one forge
write (PATCH with labels, and state when it opens or closes the issue), then one transaction
that updates the index and the ledger together. Tools and webhook handlers both call these.
"""

from __future__ import annotations

import re
import uuid
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from bot.app import runs
from bot.errors import Conflict, Denied, InvalidArguments, NotFoundError
from bot.mail.header import render_mail_body, sign_header, verify_mail
from bot.mail.markdown import defuse_mentions
from bot.office.config import Agent, Office
from bot.store import ledger, mails
from bot.store.mails import QUIET, MailRecord
from labels.states import IllegalTransition, MailEvent, MailState, labels_for, transition

if TYPE_CHECKING:
    from bot.app.services import Services
    from bot.forge.base import Forge

LOOP_GUARD_HOPS = 3  # a reply notification beyond this many hops starts no run
MAX_BODY = 60_000
_IDEMPOTENCY_NS = uuid.UUID("5b0c3c1e-8f7a-4d6e-9a51-0c1d2e3f4a5b")
_RE = re.compile(r"^(re:\s*)+", re.IGNORECASE)


def principal_of(office: Office, login: str) -> str | None:
    """The office principal a forge login acts as, or None for someone outside the office."""
    who = office.by_login(login)
    return who.principal if who is not None else None


def login_of(office: Office, principal: str) -> str | None:
    kind, _, ident = principal.partition(":")
    if kind == "human":
        human = office.human(ident)
        return human.login if human else None
    if kind == "agent":
        agent = office.agent(ident)
        return agent.login if agent else None
    return None


def _state(mail: MailRecord) -> MailState | None:
    return None if mail.state == QUIET else MailState(mail.state)


@dataclass
class Mailer:
    services: Services
    forge: Forge
    office: Office

    # -- who may do what -------------------------------------------------------------------
    def recipient(self, to: str) -> Agent:
        slug = to.removeprefix("agent:")
        agent = self.office.agent(slug)
        if agent is None:
            known = ", ".join(a.slug for a in self.office.agents) or "none"
            if to.startswith("human:"):
                raise InvalidArguments(
                    f"mail goes to agents, and {to} is a person; known agents: {known}. "
                    "Reach a person with a comment that addresses them.", code="unknown_recipient")
            raise NotFoundError(f"no agent {to!r} in this office; known agents: {known}",
                                code="unknown_recipient")
        return agent

    async def deny(self, actor: str, subject: str, reason: str) -> Denied:
        await ledger.record(self.services.store, "run.denied", actor, subject, {"reason": reason})
        return Denied(reason)

    async def check_may_send(self, actor: str, agent: Agent) -> None:
        kind, _, ident = actor.partition(":")
        subject = f"mail to {agent.principal}"
        if kind == "human":
            human = self.office.human(ident)
            if human is None or "mail.send" not in human.permissions:
                raise await self.deny(actor, subject, (
                    f"{actor} lacks the mail.send permission; an office admin can add it "
                    "under humans[].permissions in vaultmail.yml"))
        elif kind == "agent":
            sender = self.office.agent(ident)
            if sender is None or not sender.may_mail(agent.slug):
                allowed = sender.capabilities.get("mail.send", []) if sender else []
                raise await self.deny(actor, subject, (
                    f"{actor} may not mail {agent.principal}: its capabilities.mail.send "
                    f"allows {allowed or 'nobody'}"))
        elif actor != "office":
            raise await self.deny(actor, subject, f"{actor} is not a member of this office")

    def may_manage(self, actor: str, mail: MailRecord) -> bool:
        """Recipient, sender, the recipient agent's person, or an editor may open/close."""
        if actor in (mail.to_principal, mail.from_principal, "office"):
            return True
        return self.speaks_for_recipient(actor, mail)

    def speaks_for_recipient(self, actor: str, mail: MailRecord) -> bool:
        """The recipient agent's person, or an editor."""
        agent = self.office.agent(mail.to_principal.removeprefix("agent:"))
        if agent and agent.person and actor == f"human:{agent.person.lower()}":
            return True
        human = self.office.human(actor.removeprefix("human:")) if actor.startswith(
            "human:") else None
        return bool(human and "editor" in human.permissions)

    # -- sending ---------------------------------------------------------------------------
    async def send(self, actor: str, to: str, subject: str, body: str, *,
                   reply_to: MailRecord | None = None, idempotency_key: str | None = None,
                   check: bool = True) -> MailRecord:
        agent = self.recipient(to)
        # what the app posts never pings anyone by itself: mentions in it are defused
        subject, body = subject.strip(), defuse_mentions(body.replace("\r\n", "\n"))
        if not subject:
            raise InvalidArguments("subject is empty: give the mail a one-line subject")
        if len(body) > MAX_BODY:
            raise InvalidArguments(f"body is {len(body)} characters; at most {MAX_BODY}")
        if check:
            await self.check_may_send(actor, agent)
        mail_id = (str(uuid.uuid5(_IDEMPOTENCY_NS, f"{actor}\n{idempotency_key}"))
                   if idempotency_key else str(uuid.uuid4()))
        existing = await mails.get_mail(self.services.store, mail_id)
        if existing is not None:
            return existing
        vault = self.office.vault_of(agent).lower()
        hops = reply_to.hops + reply_to.agent_turns + 1 if reply_to else 0
        header = sign_header(
            keyring=self.services.keyring, from_principal=actor, to_principal=agent.principal,
            vault=vault, subject=subject, body=body, mail_id=mail_id, hops=hops,
            in_reply_to=reply_to.ref if reply_to else None,
            thread_id=reply_to.thread_id if reply_to else None)
        quiet = hops > LOOP_GUARD_HOPS
        issue = None
        if not await mails.intend_send(self.services.store, mail_id, vault):
            issue = await self.forge.find_issue(vault, mail_id)  # begun before: did it land?
        if issue is None:
            issue = await self.forge.create_issue(
                vault, header.subject, render_mail_body(header, body),
                labels=[] if quiet else [MailState.NEW.value], marker=mail_id)
        record = MailRecord(
            mail_id=mail_id, vault=vault, number=int(issue["number"]), subject=header.subject,
            body=body, from_principal=actor, to_principal=agent.principal, sent=header.sent,
            hops=hops, in_reply_to=header.in_reply_to, thread_id=header.thread_id,
            key_id=header.key_id, body_sha256=header.body_sha256,
            state=QUIET if quiet else MailState.NEW.value)
        await self._record_new(record, actor, agent)
        return record

    async def _record_new(self, record: MailRecord, actor: str, agent: Agent) -> None:
        """Index a mail now on the forge, ledger it and admit its run: once per mail id,
        whichever of the sender and the crash-recovery path (`record_found`) comes first."""
        admitted = False
        async with self.services.store.transaction() as db:
            async with db.execute("SELECT 1 FROM mails WHERE mail_id=?",
                                  (record.mail_id,)) as cur:
                if await cur.fetchone() is not None:
                    return
            await mails.put_mail(db, record)
            await mails.sent(db, record.mail_id)
            await ledger.append(db, "mail.sent", actor, record.ref, {
                "mail": record.mail_id, "to": record.to_principal, "subject": record.subject,
                "hops": record.hops, "thread": record.thread_id,
                "in_reply_to": record.in_reply_to})
            if record.state == QUIET:
                await ledger.append(db, "mail.loop_guard", "office", record.ref, {
                    "mail": record.mail_id, "hops": record.hops,
                    "reason": f"beyond {LOOP_GUARD_HOPS} hops: delivered without mail:new"})
            else:
                admitted = await runs.admit(db, agent, "mail", record.ref, actor)
        self.services.notifier.notify([record.to_principal])
        if admitted:
            self._dispatch(agent, record)

    async def record_found(self, repo: str, issue: dict[str, Any]) -> MailRecord | None:
        """Index a mail the app created but did not get to record (it crashed in between):
        the issue's own signed header says everything. None when it is not such a mail."""
        from bot.mail.reindex import mail_from_issue

        record = mail_from_issue(repo, issue, self.services.keyring)
        if record is None or record.tampered:
            return None
        agent = self.office.agent(record.to_principal.removeprefix("agent:"))
        if agent is None or await mails.get_mail(self.services.store, record.mail_id):
            return None
        await self._record_new(record, record.from_principal, agent)
        return record

    def _dispatch(self, agent: Agent, record: MailRecord) -> None:
        runs.dispatch(self.services, self.forge, agent, record.vault, {
            "kind": "mail", "agent": agent.slug, "mail": record.mail_id, "subject": record.ref,
            "title": record.subject})

    async def adopt(self, repo: str, issue: dict[str, Any], actor: str) -> MailRecord:
        """A person (or agent) opened an issue in a vault by hand: make it mail from them."""
        agent = self.office.agent_for_vault(repo)
        if agent is None:
            raise NotFoundError(f"{repo} is not a vault in this office")
        number = int(issue["number"])
        known = await mails.mail_at(self.services.store, repo, number)
        if known is not None:
            return known
        await self.check_may_send(actor, agent)
        body = (issue.get("body") or "").replace("\r\n", "\n")
        mail_id = str(uuid.uuid5(_IDEMPOTENCY_NS, f"adopt\n{repo.lower()}#{number}"))
        header = sign_header(
            keyring=self.services.keyring, from_principal=actor, to_principal=agent.principal,
            vault=repo.lower(), subject=issue["title"], body=body, mail_id=mail_id)
        current = [label["name"] for label in issue.get("labels", [])]
        await self.forge.update_issue(
            repo, number, body=render_mail_body(header, body),
            labels=labels_for(MailState.NEW, current).apply(current))
        record = MailRecord(
            mail_id=mail_id, vault=repo.lower(), number=number, subject=header.subject,
            body=body, from_principal=actor, to_principal=agent.principal, sent=header.sent,
            hops=0, in_reply_to=None, thread_id=header.thread_id, key_id=header.key_id,
            body_sha256=header.body_sha256, state=MailState.NEW.value,
            other_labels=tuple(n for n in current if not n.lower().startswith("mail:")))
        await self._record_new(record, actor, agent)
        return record

    # -- state changes ---------------------------------------------------------------------
    async def _move(self, mail: MailRecord, event: MailEvent, actor: str, ledger_event: str,
                    *, labels: list[str] | None = None, issue_state: str | None = None,
                    data: dict[str, Any] | None = None) -> MailRecord:
        """Apply `event` under the mail's lock, so a tool call and the worker never
        interleave on one mail: one forge write when anything changes, then index + ledger."""
        async with self.services.lock_for(mail.mail_id):
            latest = await mails.get_mail(self.services.store, mail.mail_id)
            if latest is not None and latest.state != mail.state:
                labels = None  # the caller's view is stale: go by the index
            return await self._move_locked(latest or mail, event, actor, ledger_event,
                                           labels=labels, issue_state=issue_state, data=data)

    async def _move_locked(self, mail: MailRecord, event: MailEvent, actor: str,
                           ledger_event: str, *, labels: list[str] | None,
                           issue_state: str | None,
                           data: dict[str, Any] | None) -> MailRecord:
        try:
            new = transition(_state(mail), event)
        except IllegalTransition as exc:
            raise Conflict(f"{mail.ref}: {exc}") from exc
        fields: dict[str, Any] = {}
        current = labels if labels is not None else mail.labels
        after = labels_for(new, current).apply(current)
        if new.value != mail.state:
            fields["labels"] = after
        if issue_state is not None:
            fields["state"] = issue_state
            if issue_state == "closed":
                fields["state_reason"] = "completed"
        if fields:
            issue = await self.forge.update_issue(mail.vault, mail.number, **fields)
            await self.check_tamper(mail, issue, "office")  # the answer carries it: no request
        wakes = new is MailState.NEW and mail.state != MailState.NEW.value
        agent = self.office.agent(mail.to_principal.removeprefix("agent:"))
        admitted = False
        async with self.services.store.transaction() as db:
            await mails.set_state(db, mail.mail_id, new.value, after)
            await ledger.append(db, ledger_event, actor, mail.ref,
                                {"mail": mail.mail_id, "from": mail.state, "to": new.value,
                                 **(data or {})})
            if wakes and agent is not None:
                admitted = await runs.admit(db, agent, "mail", mail.ref, actor)
        updated = mail.with_state(new.value)
        self.services.notifier.notify([mail.to_principal, mail.from_principal])
        if admitted and agent is not None:
            self._dispatch(agent, updated)
        return updated

    async def open(self, mail: MailRecord, actor: str, *,
                   labels: list[str] | None = None) -> MailRecord:
        if actor != mail.to_principal and not self.may_manage(actor, mail):
            raise await self.deny(actor, mail.ref, f"{actor} may not open {mail.ref}: "
                                  f"it is addressed to {mail.to_principal}")
        if mail.state == MailState.WORKING.value:
            return mail
        return await self._move(mail, MailEvent.OPEN, actor, "mail.opened", labels=labels)

    async def reply(self, mail: MailRecord, actor: str, text: str, *,
                    posted: bool, labels: list[str] | None = None,
                    key: str | None = None) -> MailRecord:
        """The recipient replied (`posted`: its comment is already on the forge). `key` names
        this reply (the forge comment id, or the caller's idempotency key), so a retry copies
        it to an agent sender once, while two replies with the same words are two copies."""
        if actor != mail.to_principal:
            raise await self.deny(actor, mail.ref, (
                f"{actor} cannot reply to {mail.ref} as its recipient ({mail.to_principal}); "
                "comment on the issue to add a message instead"))
        if not text.strip():
            raise InvalidArguments("body is empty: write the reply")
        key = key or str(uuid.uuid4())
        if not posted:
            marker = f"<!-- vaultmail:reply {key} -->"
            await self.forge.create_comment(mail.vault, mail.number,
                                            f"**{actor}** replied:\n\n"
                                            f"{defuse_mentions(text)}\n\n{marker}",
                                            marker=marker)
        reopen = "open" if mail.state == MailState.CLOSED.value else None
        updated = await self._move(mail, MailEvent.REPLY, actor, "mail.replied",
                                   labels=labels, issue_state=reopen)
        if mail.from_principal.startswith("agent:") and mail.from_principal != actor:
            await self.send(actor, mail.from_principal, "Re: " + _RE.sub("", mail.subject),
                            text, reply_to=mail, check=False,
                            idempotency_key=f"reply\n{mail.mail_id}\n{key}")
        return updated

    async def follow_up(self, mail: MailRecord, actor: str, *,
                        labels: list[str] | None = None) -> MailRecord:
        """Someone other than the recipient wrote: the mail is the recipient's turn again, if
        they may write to it (the sender, or anyone who may mail the recipient). An agent's
        follow-ups count toward the loop guard like reply hops do."""
        if actor not in (mail.from_principal, "office"):
            await self.check_may_send(actor, self.recipient(mail.to_principal))
        if mail.state == MailState.NEW.value:
            return mail
        if actor.startswith("agent:"):
            turns = mail.agent_turns + 1
            async with self.services.store.transaction() as db:
                await mails.add_agent_turn(db, mail.mail_id)
                if mail.hops + turns > LOOP_GUARD_HOPS:
                    await ledger.append(db, "mail.loop_guard", "office", mail.ref, {
                        "mail": mail.mail_id, "hops": mail.hops + turns, "follow_up": True,
                        "reason": f"beyond {LOOP_GUARD_HOPS} hops: the follow-up wakes no one"})
                    return replace(mail, agent_turns=turns)
            mail = replace(mail, agent_turns=turns)
        reopen = "open" if mail.state == MailState.CLOSED.value else None
        return await self._move(mail, MailEvent.FOLLOW_UP, actor, "mail.sent", labels=labels,
                                issue_state=reopen, data={"follow_up": True})

    async def close(self, mail: MailRecord, actor: str, *, issue_closed: bool = False,
                    labels: list[str] | None = None) -> MailRecord:
        if not self.may_manage(actor, mail):
            raise await self.deny(actor, mail.ref, (
                f"{actor} may not close {mail.ref}: only its recipient, its sender, the "
                "recipient's person or an editor can"))
        if mail.state == MailState.CLOSED.value and issue_closed:
            return mail
        return await self._move(mail, MailEvent.CLOSE, actor, "mail.closed", labels=labels,
                                issue_state=None if issue_closed else "closed")

    async def reopened(self, mail: MailRecord, actor: str,
                       labels: list[str] | None = None) -> MailRecord:
        if mail.state != MailState.CLOSED.value:
            return mail
        return await self._move(mail, MailEvent.REOPEN, actor, "mail.sent", labels=labels,
                                data={"reopened": True})

    # -- tamper checks ---------------------------------------------------------------------
    async def check_tamper(self, mail: MailRecord, issue: dict[str, Any], actor: str) -> bool:
        """Verify the issue as found; flag, ledger and comment once when it was changed."""
        verdict = verify_mail(issue.get("title") or "", issue.get("body"), mail.vault,
                              self.services.keyring, expected_mail_id=mail.mail_id)
        if verdict.valid:
            return True
        if not mail.tampered:
            async with self.services.store.transaction() as db:
                await mails.mark_tampered(db, mail.mail_id)
                await ledger.append(db, "mail.tampered", actor, mail.ref,
                                    {"mail": mail.mail_id, "reason": verdict.reason})
            await self.forge.create_comment(mail.vault, mail.number, (
                f"⚠️ This mail was changed after it was sent ({verdict.reason}). vaultmail "
                f"keeps the signed original: from {mail.from_principal} to "
                f"{mail.to_principal}, sent {mail.sent}, subject "
                f"“{defuse_mentions(mail.subject)}”."))
        return False

