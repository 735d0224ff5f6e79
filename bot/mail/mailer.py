"""Mail (seed mail.md): send, adopt, open, reply, close, follow up, and the loop guard.

The thin I/O around the pure core (bot.mail.header, labels.states): every state change is one forge
write (PATCH with labels, and state when it opens or closes the issue), then one transaction
that updates the index and the ledger together. Tools and webhook handlers both call these.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import re
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any, Literal

import structlog
from pydantic import ValidationError

from bot.app import runs
from bot.errors import Conflict, Denied, InvalidArguments, NotFoundError
from bot.forge import markers
from bot.forge.errors import ForgeError, NotFound, PermissionDenied, PutOff
from bot.forge.once import comment_once
from bot.mail.header import (
    LOOP_GUARD_HOPS,
    MailHeader,
    adopted_here,
    adopted_mail_id,
    clean_subject,
    forge_id,
    headed_by,
    render_mail_body,
    sign_header,
    verify_issue,
    written_body,
)
from bot.mail.markdown import as_data, blockquote, defuse_mentions
from bot.mail.reindex import closed_duplicate
from bot.mail.signing import former_offices
from bot.office.config import Agent, Office
from bot.store import idempotency, installations, ledger, mails, moves, replies
from bot.store.mails import QUIET, MailRecord
from bot.store.sql import Connection
from labels.states import (
    IllegalTransition,
    LabelChanges,
    MailEvent,
    MailState,
    labels_for,
    transition,
)

if TYPE_CHECKING:
    from bot.app.services import Services
    from bot.forge.base import JSON, Forge
    from bot.mail.signing import Signer

# (LOOP_GUARD_HOPS: the header's, which carries the hops; comments on items share it)
MAX_BODY = 60_000
# events that set a state rather than add something: applied again in that state, a no-op
_SETS_STATE = frozenset({MailEvent.OPEN, MailEvent.CLOSE, MailEvent.REOPEN})
# what an agent does to a mail that hands it back to its recipient (mail:new, a run): each
# counts a hop on the mail (`agent_turns`), as the reply copy does on the thread
_AGENT_TURNS = frozenset({MailEvent.FOLLOW_UP, MailEvent.REOPEN})
_IDEMPOTENCY_NS = uuid.UUID("5b0c3c1e-8f7a-4d6e-9a51-0c1d2e3f4a5b")
_RE = re.compile(r"^(re:\s*)+", re.IGNORECASE)
# how far before a mail's signing time its issues are looked for (the forge's clock may lag)
DUPLICATE_SKEW = timedelta(minutes=10)
log = logging.getLogger("vaultmail.mail")


MAX_SUBJECT = 256  # GitHub's limit for an issue title


def same_mail(indexed: MailRecord, record: MailRecord, *, adopted: bool) -> MailRecord:
    """`indexed`, the row the index holds under `record`'s mail id, when it is the same mail:
    in its vault (an adopted mail's id names one issue: at its number too; a sent mail's
    late duplicate is another issue of it, `Mailer.deliver`). A row elsewhere is another
    mail under a repeated id: refused loudly, never taken for this one (which would index
    nothing: no inbox, no ledger, no run)."""
    if indexed.vault != record.vault or (adopted and indexed.number != record.number):
        raise Conflict(f"mail id {record.mail_id} of {record.ref} already names "
                       f"{indexed.ref}: nothing indexed", code="mail_id_taken")
    return indexed


def keyed_mail_id(office: str, actor: str, key: str,
                  namespace: uuid.UUID = _IDEMPOTENCY_NS) -> str:
    """The mail id `actor`'s idempotency `key` names, derived from `office` (one of
    `office_keys`)."""
    return str(uuid.uuid5(namespace, f"{office}\n{actor}\n{key}"))


async def office_keys(services: Services, org: str) -> list[str]:
    """What an office's key-derived mail ids are derived from: first its org's account id,
    which a rename keeps (a retry after its org renamed itself names the same mail), then
    the names the office has had (ids derived before the account id was: still found). An
    office whose account is not known yet derives from its name, as before."""
    account = await installations.account_of(services.store, org)
    names = [org.lower(), *former_offices(services.keyring.renamed(org))]
    return ([] if account is None else [f"account:{account}"]) + names


async def keyed_mail_ids(services: Services, org: str, actor: str, key: str,
                         namespace: uuid.UUID = _IDEMPOTENCY_NS) -> list[str]:
    """The mail ids `actor`'s idempotency `key` names in `org`'s office: the one a send
    takes now first, then those it took before (`office_keys`)."""
    return [keyed_mail_id(office, actor, key, namespace)
            for office in await office_keys(services, org)]


async def keyed_mail(services: Services, org: str, actor: str, key: str,
                     namespace: uuid.UUID = _IDEMPOTENCY_NS) -> tuple[str, MailRecord | None]:
    """The mail id `actor`'s idempotency `key` names in `org`'s office, and the mail it sent
    already, if any (under that id, or one the office derived before: `office_keys`). An id
    of the office's names another account may hold (the office that had the name, renamed
    or moved aside): that mail is not this office's, never shown here; under the id this
    key names now it is refused, as the key cannot name this office's mail."""
    ids = await keyed_mail_ids(services, org, actor, key, namespace)
    for mail_id in ids:
        existing = await mails.get_mail(services.store, mail_id)
        if existing is None or (existing.org != org.lower() and mail_id != ids[0]):
            continue
        if existing.org != org.lower():
            raise Conflict(f"the idempotency key {key!r} was used by the office that held "
                           f"the name {org} before: use another key",
                           code="idempotency_key_taken")
        return mail_id, existing
    return ids[0], None


def checked_subject(subject: str, *, clip: bool = False) -> str:
    """The subject as the app signs it and titles the issue (`clean_subject`: control
    characters become spaces, invisible and bidi-override ones go), or a refusal saying why.
    `clip` shortens an over-long one instead (the app's own "Re: ..." copies)."""
    cleaned = clean_subject(subject)
    if not cleaned:
        raise InvalidArguments(
            "subject is empty once control, invisible and bidi-override characters are taken "
            "out: give the mail a one-line subject", code="invalid_subject")
    if len(cleaned) > MAX_SUBJECT:
        if clip:
            return cleaned[:MAX_SUBJECT - 1].rstrip() + "…"
        raise InvalidArguments(f"subject is {len(cleaned)} characters; at most {MAX_SUBJECT} "
                               "(the forge's limit for an issue title): put the rest in the "
                               "body", code="invalid_subject")
    return cleaned


def _signed(**fields: Any) -> MailHeader:
    """`sign_header`, with a field the header cannot hold refused as bad input (never a 500)."""
    try:
        return sign_header(**fields)
    except ValidationError as exc:
        where = "; ".join(f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}"
                          for e in exc.errors())
        raise InvalidArguments(f"this mail cannot be signed: {where}",
                               code="invalid_mail") from exc


def signed_again(keyring: Signer, office: Office, mail: MailRecord) -> MailHeader:
    """`mail`'s header signed again from its record: the same values, the same mail id."""
    return _signed(
        keyring=keyring, from_principal=mail.from_principal, to_principal=mail.to_principal,
        vault=mail.vault, subject=mail.subject, body=mail.body, mail_id=mail.mail_id,
        sent=mail.sent, hops=mail.hops, in_reply_to=mail.in_reply_to, thread_id=mail.thread_id,
        from_name=shown_as(office, mail.from_principal),
        to_name=shown_as(office, mail.to_principal))


def shown_as(office: Office, principal: str) -> str | None:
    """How the header's table shows a principal: a person by forge login (`marco`: no @, so
    nobody is mentioned), not by email address; an agent or the office as itself."""
    if principal.startswith("human:"):
        human = office.human(principal.removeprefix("human:"))
        return f"login:{human.login}" if human is not None else None
    if principal.startswith("email:"):
        return None  # someone outside, by email: the table shows the principal
    return principal


def principal_of(office: Office, login: str) -> str | None:
    """The office principal a forge login acts as, or None for someone outside the office."""
    who = office.by_login(login)
    return who.principal if who is not None else None


def _state(mail: MailRecord) -> MailState | None:
    return None if mail.state == QUIET else MailState(mail.state)


# GitHub refuses an issue or comment body longer than this: what the app writes (the header
# table, the defused mentions, a reply's byline) is checked against it before the first write
FORGE_MAX_BODY = 65_536
# of an edit the adoption wrote over, quoted in a comment (`Mailer._written_over`): room left
# for the notice around it
QUOTED_MAX = FORGE_MAX_BODY - 4_000


def fits(text: str, what: str) -> str:
    """`text`, or a refusal when the forge would refuse it as too long."""
    if len(text) > FORGE_MAX_BODY:
        raise InvalidArguments(
            f"{what} is {len(text):,} characters, and the forge takes at most "
            f"{FORGE_MAX_BODY:,}: shorten the body (each @ before a name gains an invisible "
            "character, so it mentions nobody)", code="body_too_long")
    return text


class Undeliverable(Conflict):
    """Mail not delivered: its recipient has left the office, or its vault is gone or
    archived (the message names which; an agent sender has a bounce in its vault too)."""

    code = "undeliverable"


@dataclass(frozen=True)
class _Draft:
    """A mail checked and signed, not yet on the forge."""

    actor: str
    agent: Agent
    header: MailHeader
    body: str
    rendered: str
    sent_from: str | None = None  # the run it is sent from (`Mailer.sent_from`)


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
        # in a delivery's run, once per delivery: a run again after a crash (or after a
        # later write failed) refuses the same thing, and the ledger says it once
        delivery = structlog.contextvars.get_contextvars().get("delivery_id")
        if isinstance(delivery, str):
            await ledger.record_once(self.services.store, "run.denied", actor, subject,
                                     {"reason": reason, "delivery": delivery},
                                     org=self.office.org, by=("delivery", "reason"),
                                     renamed=self.services.keyring.renamed(self.office.org))
        else:
            await ledger.record(self.services.store, "run.denied", actor, subject,
                                {"reason": reason}, org=self.office.org)
        return Denied(reason, subject=subject, ledgered=True)

    def is_member(self, actor: str) -> bool:
        """Whether `actor` is the office, or one of its people or agents."""
        kind, _, ident = actor.partition(":")
        return actor == "office" or (kind == "human" and self.office.human(ident) is not None) \
            or (kind == "agent" and self.office.agent(ident) is not None)

    def send_refusal(self, actor: str, agent: Agent) -> str | None:
        """Why `actor` may not send to `agent`, or None when it may (nothing is ledgered:
        the console asks this to say why before anyone tries)."""
        kind, _, ident = actor.partition(":")
        if kind == "human":
            human = self.office.human(ident)
            if human is None or "mail.send" not in human.permissions:
                return (f"{actor} lacks the mail.send permission; an office admin can add it "
                        "under humans[].permissions in vaultmail.yml")
        elif kind == "agent":
            sender = self.office.agent(ident)
            if sender is None or not sender.may_mail(agent.slug):
                allowed = sender.capabilities.get("mail.send", []) if sender else []
                return (f"{actor} may not mail {agent.principal}: its capabilities.mail.send "
                        f"allows {allowed or 'nobody'}")
        elif actor != "office":
            return f"{actor} is not a member of this office"
        return None

    async def check_may_send(self, actor: str, agent: Agent) -> None:
        reason = self.send_refusal(actor, agent)
        if reason is not None:
            raise await self.deny(actor, f"mail to {agent.principal}", reason)

    def own(self, mail: MailRecord) -> MailRecord:
        """`mail`, if it is this office's: one bot account may reach several orgs (Gitea's
        token, a forge admin), so every write checks the mail is in the office's org and
        answers "not found" otherwise, as for a mail that does not exist."""
        if mail.org != self.office.org.lower():
            raise NotFoundError(f"no mail {mail.mail_id!r}: give a mail id or owner/repo#N "
                                "from mail_list")
        return mail

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
                   check: bool = True, automatic: bool = False,
                   woken_by: str | None = None,
                   written_at: float | None = None) -> MailRecord:
        """Send mail from `actor`. `reply_to` threads it; `automatic` marks the copy of a
        reply the app delivers to an agent sender; `woken_by`: the mail whose run sends it
        (`sent_hops`); `written_at`: when the forge says the write asking for it was made (a
        `/mail` comment's), else now (`sent_from`)."""
        draft = await self.draft(actor, to, subject, body, reply_to=reply_to,
                                 idempotency_key=idempotency_key, check=check,
                                 automatic=automatic, woken_by=woken_by, written_at=written_at)
        return await self.deliver_or_bounce(draft)

    async def draft(self, actor: str, to: str, subject: str, body: str, *,
                    reply_to: MailRecord | None = None, idempotency_key: str | None = None,
                    check: bool = True, automatic: bool = False,
                    app_rendered: bool = False, woken_by: str | None = None,
                    written_at: float | None = None) -> MailRecord | _Draft:
        """Everything `send` checks and signs, before any forge write: a refusal here leaves
        nothing behind. The mail itself when this key already sent it. `app_rendered`: the app
        wrote `body` (an email's, bot.email.message.render_inbound: its meta line the app's,
        the rest data already)."""
        if reply_to is not None:
            self.own(reply_to)
        if check and not self.is_member(actor):  # before the office's agents are named to it
            raise await self.deny(actor, f"mail to {to[:80]}",
                                  f"{actor} is not a member of this office")
        agent = self.recipient(to)
        subject = checked_subject(subject, clip=automatic)
        body = body.replace("\r\n", "\n")
        if len(body) > MAX_BODY:
            raise InvalidArguments(f"body is {len(body):,} characters; at most {MAX_BODY:,}: "
                                   "shorten it, or put the rest in a file and link it",
                                   code="body_too_long")
        # what the app posts never pings anyone by itself, nor carries a marker of the app's
        # that someone else wrote
        body = defuse_mentions(body) if app_rendered else as_data(body)
        if check:
            await self.check_may_send(actor, agent)
        # a key is the sender's in its office: another office's principal of the same name
        # using the same key names another mail
        mail_id = str(uuid.uuid4())
        if idempotency_key:
            mail_id, existing = await keyed_mail(self.services, self.office.org, actor,
                                                 idempotency_key)
            if existing is not None:
                return existing
        vault = self.office.vault_of(agent).lower()
        run = None if automatic else await self.sent_from(actor, woken_by, at=written_at)
        hops = await self.sent_hops(actor, agent.principal, reply_to, run=run,
                                    mail_id=mail_id, automatic=automatic)
        header = _signed(
            keyring=await self.services.keyring.ready_for(self.office.org), from_principal=actor,
            to_principal=agent.principal,
            vault=vault, subject=subject, body=body, mail_id=mail_id, hops=hops,
            in_reply_to=reply_to.ref if reply_to else None,
            thread_id=reply_to.thread_id if reply_to else None,
            from_name=shown_as(self.office, actor), to_name=shown_as(self.office, agent.principal))
        issue_body = render_mail_body(header, body, notify=self._sender_login(actor))
        fits(issue_body, "the mail, its header table added")
        return _Draft(actor, agent, header, body, issue_body, sent_from=run)

    async def deliver(self, draft: MailRecord | _Draft, *,
                      quiet: str | None = None) -> MailRecord:
        """Open the drafted mail's issue (once, whatever crashed before) and index it.
        `quiet`: why it is delivered without mail:new, waking no one (mail an automaton sent
        by email: bot.email), as the loop guard delivers a copy past its hops."""
        if isinstance(draft, MailRecord):
            return draft
        header, mail_id, vault = draft.header, draft.header.mail_id, draft.header.vault
        if quiet is None and header.hops > LOOP_GUARD_HOPS:
            quiet = f"beyond {LOOP_GUARD_HOPS} hops: delivered without mail:new"
        issue = None
        begun = not await mails.intend_send(self.services.store, mail_id, vault)
        if begun:
            # begun before: did it land? (its issue opens with its header)
            issue = await self.forge.find_issue(vault, mail_id, headed_by(mail_id))
        if issue is None:
            # the fence: a try whose key another replica took over (this one stalled past
            # DEAD_AFTER) opens nothing; the new owner sends the mail, once
            await idempotency.check_claim()
            issue = await self.forge.create_issue(
                vault, header.subject, draft.rendered,
                labels=[] if quiet else [MailState.NEW.value], marker=mail_id,
                accept=headed_by(mail_id))
        record = MailRecord(
            mail_id=mail_id, vault=vault, number=int(issue["number"]), subject=header.subject,
            body=draft.body, from_principal=draft.actor, to_principal=draft.agent.principal,
            sent=header.sent, hops=header.hops, in_reply_to=header.in_reply_to,
            thread_id=header.thread_id, key_id=header.key_id, body_sha256=header.body_sha256,
            state=QUIET if quiet else MailState.NEW.value)
        kept = await self._record_new(record, draft.actor, draft.agent, quiet=quiet,
                                      fenced=True, sent_from=draft.sent_from)
        if kept is None:
            # taken over meanwhile: this try indexes nothing; the new owner indexes one issue
            # and closes any other carrying the mail id (this one, should it be another)
            raise idempotency.ClaimLost(f"send of {mail_id}: its key was taken over")
        if kept.number != record.number:
            # the index holds another issue for this mail id (a retry elsewhere sent it while
            # this try's create was in flight): this one is a late duplicate
            await self._close_duplicate(vault, record.number, kept)
        elif begun:
            # an earlier try began this send: an issue it opened late (after this try looked)
            # carries the mail id too
            await self._close_duplicates_of(kept)
        return kept

    async def _close_duplicates_of(self, kept: MailRecord) -> None:
        """Close every other issue the app opened in `kept`'s vault carrying its mail id in a
        genuine signed header (a stalled try's late create), as duplicates of `kept`."""
        since = datetime.strptime(kept.sent, "%Y-%m-%dT%H:%M:%SZ").replace(
            tzinfo=UTC) - DUPLICATE_SKEW
        async for issue in self.forge.iter_issues(kept.vault, state="all", since=since):
            number = int(issue["number"])
            if number == kept.number or closed_duplicate(issue):
                continue
            verdict = verify_issue(issue, kept.vault, self.services.keyring,
                                   app_login=self.services.bot_login,
                                   expected_mail_id=kept.mail_id)
            if verdict.valid:
                await self._close_duplicate(kept.vault, number, kept)

    async def close_if_duplicate(self, vault: str, issue: dict[str, Any],
                                 original: MailRecord) -> None:
        """Close `issue` as a duplicate of `original` when it is another issue of that mail in
        its vault, opened by the app with a genuine signed header (a late create its try did
        not get to close: it stopped after the create, `deliver`)."""
        number = int(issue["number"])
        if vault.lower() != original.vault.lower() or number == original.number:
            return
        # the issue as the forge has it now, not as a delivery said (an org-signed one on
        # Gitea is its org's admins' words)
        fresh = await self.forge.get_issue(vault, number)
        verdict = verify_issue(fresh, vault, self.services.keyring,
                               app_login=self.services.bot_login,
                               expected_mail_id=original.mail_id)
        if not verdict.valid:
            return
        # a duplicate only beside the issue the index holds: when that one is gone, this is
        # the mail opened again in its place (the doctor's repair of a lost copy, which
        # indexes it after its create), not a second send
        try:
            await self.forge.get_issue(vault, original.number)
        except ForgeError as exc:
            if isinstance(exc, NotFound) or exc.status in (404, 410):
                return
            raise
        now = await mails.get_mail(self.services.store, original.mail_id)
        if now is not None and now.vault.lower() == vault.lower() and now.number == number:
            return  # indexed as this issue meanwhile
        await self._close_duplicate(vault, number, original, fresh)

    async def _close_duplicate(self, vault: str, number: int, original: MailRecord,
                               issue: JSON | None = None) -> None:
        """Close `vault`#`number`, a second issue of `original`'s mail, as a duplicate: not
        planned, its state labels taken off (in no inbox, never indexed), a comment naming the
        original. Each write is found again by a retry: nothing is said twice."""
        log.warning("a late duplicate of a mail closed", extra={
            "mail": original.ref, "duplicate": f"{vault}#{number}", "outcome": "duplicate"})
        if issue is None:  # (read already by a caller that checked it)
            issue = await self.forge.get_issue(vault, number)
        if not closed_duplicate(issue):
            other = [str(lb["name"]) for lb in issue.get("labels", [])
                     if not str(lb["name"]).startswith("mail:")]
            await self.forge.update_issue(vault, number, state="closed",
                                          state_reason="not_planned", labels=other)
        # said once, whoever else closes it at once (the late try itself and the worker
        # handling its issue's `opened`, on two replicas): each looks, writes, then keeps the
        # first comment carrying the marker and deletes the app's later ones; unfenced, as
        # the late try tidies its own create
        marker = markers.marker("duplicate", original.mail_id)
        await comment_once(self.forge, vault, number, (
            f"This issue is a duplicate of #{original.number}, the same mail (id "
            f"`{original.mail_id}`) opened twice: a send was retried while an earlier "
            "try of it was still in flight. The mail is "
            f"#{original.number}; this copy is closed and not in any inbox.\n\n{marker}"),
            marker, fenced=False)

    async def sent_from(self, actor: str, woken_by: str | None, *,
                        at: float | None = None) -> str | None:
        """The run mail `actor` sends now is sent from, by what woke it (a mail id, or a chat
        run's `chat:<n>`): `woken_by` (its run token's, or the run it names, `named_run`),
        else the agent's latest mail run open at `at` (`mails.wake_at`: a POST's or a
        repository_dispatch's runner holds only the agent's long-lived token; which token it
        holds is the agent's choice, whether a mail woke it is the app's). `at`: when the
        forge says the agent wrote what asks for the mail (an issue's or a `/mail` comment's
        `created_at`), so a write counts as its run's however late its delivery is handled,
        a command's run long over by then; None: now (a tool call, made while it runs). None
        for a person's mail, and an agent's from no mail run."""
        if not actor.startswith("agent:"):
            return None
        if woken_by is not None:
            return woken_by
        # (now is our clock's, as the runs' are: no skew to allow for)
        return await mails.wake_at(
            self.services.store, actor.removeprefix("agent:"), org=self.office.org,
            at=time.time() if at is None else at,
            skew=0.0 if at is None else runs.FORGE_CLOCK_SKEW,
            held_open=runs.RUN_HELD_OPEN, longest=runs.LONGEST_RUN)

    async def sent_hops(self, actor: str, to: str, reply_to: MailRecord | None, *,
                        run: str | None, mail_id: str, automatic: bool = False) -> int:
        """The hops of mail `actor` sends to `to`. An agent answering mail (`reply_to`) climbs
        like the reply copy (`automatic`, whoever replied): the seed's "two agents replying
        to each other could wake each other forever" holds for mail_send + inReplyTo too.
        Mail sent from a run (`run`, `sent_from`) spends that run as a budget: one hop past
        the mail that woke it (its hops and its agents' turns, as a follow-up counts them; a
        chat run from 0, as a person's mail), and one more for each mail the agent sent
        `to` from that run before. Else two agents answering each wake with fresh mail, or
        naming one early run for every send, woke each other forever; fan-out (one mail
        each to several agents) stays one hop past. That count is mail `mail_id`'s place in
        the run's budget, claimed as it is read (`mails.claim_send`): sends made at once each
        count the others, and a retry of the mail id keeps its place. A person's mail, and an
        agent's from no run answering nothing, start at 0."""
        if not (automatic or actor.startswith("agent:")):
            return 0
        hops = await self._copy_hops(reply_to) if reply_to is not None else 0
        if run is not None:
            store = self.services.store
            woke = await mails.get_mail(store, run)
            start = woke.hops + woke.agent_turns + 1 if woke is not None else 0
            place = await mails.claim_send(store, mail_id, run, actor, to, org=self.office.org)
            hops = max(hops, start + place)
        return hops

    async def named_run(self, actor: str, run: int) -> str:
        """What woke run `run`, which agent `actor` names as the run its mail is sent from
        (a POST's or a repository_dispatch's runner: its payload's `run`): what `sent_hops`
        climbs from instead of its latest open mail run, each send to one recipient one hop
        more than the last. Only one of the agent's own runs
        still open is taken: it chooses among the wakes that are its, never another's."""
        woke = await mails.run_wake(self.services.store, actor.removeprefix("agent:"), run,
                                    org=self.office.org, since=time.time() - runs.RUN_HELD_OPEN)
        if woke is None:
            raise InvalidArguments(
                f"run {run} is not one of {actor}'s open runs (one the app dispatched to it, "
                "not ended, started within the last hour): give the `run` of the payload "
                "that woke you, or leave it out (the mail then counts from your latest open "
                "mail run)", code="run_not_open")
        return woke

    async def _copy_hops(self, replied: MailRecord) -> int:
        """The hops of an automatic reply copy of `replied`, or of mail an agent sends in
        answer to it: one more than it, and than any earlier such answer to it (so agents
        trading comments, or answering one mail again and again, climb too)."""
        earlier = await mails.copy_hops(self.services.store, replied.thread_id, replied.ref)
        return max(replied.hops, earlier) + 1

    def _sender_login(self, actor: str) -> str | None:
        """The forge login to mention once in a mail the app writes for a person: the issue is
        the app's, so the forge would not tell them of replies otherwise."""
        if not actor.startswith("human:"):
            return None
        human = self.office.human(actor.removeprefix("human:"))
        return human.login if human else None

    async def _record_new(self, record: MailRecord, actor: str, agent: Agent | None, *,
                          quiet: str | None = None, fenced: bool = False,
                          adopted: bool = False, sent_from: str | None = None,
                          adopted_at: float | None = None) -> MailRecord | None:
        """Index a mail now on the forge, ledger it and admit its run: once per mail id,
        whichever of the sender and the crash-recovery path (`record_found`) comes first.
        `agent` None: mail to an address (bot.email.sending), in no one's inbox: its
        `mail.sent` is what the outbox sends it by; no run, no loop-guard entry.
        The mail as indexed (this record, or the one indexed before it under its id: refused
        when that one is elsewhere, `same_mail`; `adopted`: an id bound to its one issue);
        `fenced`: None, indexing nothing, when the running idempotency claim was taken over
        (checked under the claim's own key, which a takeover takes too). `sent_from`: the run
        it was sent from, kept with it (what a release before schema 29 counts: its place in
        the run's budget this release claimed already, `sent_hops`); `adopted_at`: the forge
        time of the adoption's write."""
        fence = idempotency.fence_key() if fenced else None

        async def index(db: Connection) -> tuple[MailRecord | None, bool, int | None]:
            """(the mail as indexed, whether this call indexed it, its run if admitted)"""
            # the row under its id, if one is there, whoever holds the claim now; else this
            # one, if this try's claim is still its own
            if fence and not await idempotency.claim_held_in(db):
                indexed = await mails.get_mail_in(db, record.mail_id)
                return (None if indexed is None
                        else same_mail(indexed, record, adopted=adopted)), False, None
            indexed = await _indexed_before(db, record, actor, adopted_at=adopted_at,
                                            sent_from=sent_from)
            if indexed is not None:
                return same_mail(indexed, record, adopted=adopted), False, None
            return record, True, await _woken(db, record, actor, agent, quiet)

        # the sender and the recovery path may record one mail id at once: one looks, then
        # the other (one trip to the store: it is on every mail's path)
        indexed, new, admitted = await self.services.store.run_transaction(
            index, f"mail:{record.mail_id}", mails.box_key(record.org, record.to_principal),
            ledger.key(record.org), *([fence] if fence else []))
        if not new:
            return indexed
        if record.state == MailState.NEW.value:  # (a copy past the loop guard wakes no one:
            # next run's; a mail caught up opened already was told of before)
            self.services.notifier.notify([record.to_principal], org=record.org)
        if agent is not None and admitted is not None:
            runs.dispatch_mail(self.services, self.forge, agent, record, admitted)
        return record

    async def record_unledgered(self, mail: MailRecord) -> bool:
        """Ledger a mail indexed as a row alone though this index began its send (a release
        before 44's catch-up: `mails.send_begun`), as its sender would have: `mail.sent`
        (mail to an address: what the outbox sends it by), pending cleared, and the wake it
        never had (its run, or its loop-guard entry; none once its recipient has opened it).
        False when that send was recorded meanwhile, or the recipient is gone."""
        agent = self.office.agent(mail.to_principal.removeprefix("agent:"))
        if agent is None and not mail.to_principal.startswith("email:"):
            return False

        async def ledger_it(db: Connection) -> tuple[bool, int | None]:
            if not await mails.sent(db, mail.mail_id):  # (recorded meanwhile: pending cleared)
                return False, None
            await _ledger_sent(db, mail, mail.from_principal)
            return True, await _woken(db, mail, mail.from_principal, agent, None)

        done, admitted = await self.services.store.run_transaction(
            ledger_it, f"mail:{mail.mail_id}", mails.box_key(mail.org, mail.to_principal),
            ledger.key(mail.org))
        if agent is not None and admitted is not None:
            runs.dispatch_mail(self.services, self.forge, agent, mail, admitted)
        return bool(done)

    async def record_found(self, repo: str, issue: dict[str, Any]) -> MailRecord | None:
        """Index a mail the app created but did not get to record (it crashed in between):
        the issue's own signed header says everything, and it is recorded as its sender
        records it (mail to an address too: its `mail.sent` queues it for the outbox). None
        when it is not such a mail."""
        from bot.mail.reindex import mail_from_issue

        record = mail_from_issue(repo, issue, self.services.keyring,
                                 app_login=self.services.bot_login)
        if record is None or record.tampered:
            return None
        emailed = record.to_principal.startswith("email:")  # (bot.email.sending's principal)
        agent = self.office.agent(record.to_principal.removeprefix("agent:"))
        if (agent is None and not emailed) or await mails.get_mail(self.services.store,
                                                                   record.mail_id):
            return None
        await self._record_new(record, record.from_principal, agent)
        return record

    async def adopt(self, repo: str, issue: dict[str, Any], actor: str, *,
                    as_delivered: bool = False) -> MailRecord:
        """A person (or agent) opened an issue in a vault by hand: make it mail from them.

        The issue is taken as the forge has it now, not as the `issues.opened` delivery
        described it (issue 28): that delivery may come late (dropped, then redelivered by the
        reconciler) after the issue was edited, relabelled or closed. `as_delivered`: the
        delivery is known to describe it as it is now (`handlers.mail.opened_just_now`), so it
        is not read again. A closed issue becomes a closed mail, ledgered sent and closed once
        each, if whoever closed it may close it (else it is new mail, and the close's own
        delivery refuses and reopens it). An agent's issue climbs as its `mail_send` would
        (`sent_hops`: from its mail run still open, and counted against that run), or an
        agent answering each wake with an issue by hand in another's vault would loop past
        the guard; past it, adopted quiet."""
        agent = self.office.agent_for_vault(repo)
        if agent is None:
            raise NotFoundError(f"{repo} is not a vault in this office")
        number = int(issue["number"])
        known = await mails.mail_at(self.services.store, repo, number)
        if known is not None:
            return known
        await self.check_may_send(actor, agent)
        if not as_delivered:
            issue = await self.forge.get_issue(repo, number)  # as it is now
        # the words they wrote, their own mentions as they wrote them; a pasted mail's header
        # and table taken off (see `written_body`)
        body = written_body(issue.get("body"))
        mail_id = adopted_mail_id(int(issue["id"]))  # binds the header to this issue
        title = str(issue.get("title") or "")
        run = await self.sent_from(actor, None, at=moves.forge_time(issue.get("created_at")))
        hops = await self.sent_hops(actor, agent.principal, None, run=run, mail_id=mail_id)
        header = _signed(
            keyring=await self.services.keyring.ready_for(self.office.org), from_principal=actor,
            to_principal=agent.principal, vault=repo.lower(), subject=checked_subject(title),
            body=body, mail_id=mail_id, hops=hops,
            from_name=shown_as(self.office, actor), to_name=shown_as(self.office, agent.principal))
        current = [label["name"] for label in issue.get("labels", [])]
        record = MailRecord(
            mail_id=mail_id, vault=repo.lower(), number=number, subject=header.subject,
            body=body, from_principal=actor, to_principal=agent.principal, sent=header.sent,
            hops=hops, in_reply_to=None, thread_id=header.thread_id, key_id=header.key_id,
            body_sha256=header.body_sha256, state=MailState.NEW.value,
            other_labels=tuple(n for n in current if not n.lower().startswith("mail:")))
        closer = self._closer(issue, actor, record)
        state: MailState | None = MailState.NEW if closer is None else MailState.CLOSED
        if closer is None and hops > LOOP_GUARD_HOPS:  # as `deliver` holds a sent one
            state, record = None, record.with_state(QUIET)
        # the title as signed (control and invisible characters out), in the same write
        retitle = {"title": header.subject} if header.subject != title.strip() else {}
        written = await self.forge.update_issue(
            repo, number, body=fits(render_mail_body(header, body), "the mail, its header added"),
            labels=labels_for(state, current).apply(current), **retitle)
        # when the forge took the write: an edit it dates no later was written over (`edited`)
        adopted_at = moves.forge_time(written.get("updated_at"))
        if closer is None:
            await self._record_new(record, actor, agent, adopted=True, sent_from=run,
                                   adopted_at=adopted_at)
            return record
        closed = record.with_state(MailState.CLOSED.value)
        await self._record_adopted_closed(closed, actor, closer,
                                          moves.forge_time(issue.get("closed_at")), adopted_at)
        return closed

    def _closer(self, issue: dict[str, Any], opener: str, record: MailRecord) -> str | None:
        """Who closed `issue` (found closed at adoption) as the office knows them, when they
        may close the mail; None when it is open, or they may not."""
        if issue.get("state") != "closed":
            return None
        by = issue.get("closed_by")
        login = by.get("login") if isinstance(by, dict) else None
        who = (principal_of(self.office, login) or f"forge:{login}") if isinstance(
            login, str) else opener  # a forge that does not say: the one who opened it
        return who if self.may_manage(who, record) else None

    async def _record_adopted_closed(self, record: MailRecord, actor: str, closer: str,
                                     at: float | None, adopted_at: float | None) -> None:
        """Index an adopted mail found closed: sent by `actor`, closed by `closer` at forge
        time `at`, each ledgered once; it wakes no one (nothing is left to do). `adopted_at`:
        the forge time of the adoption's write."""
        async with self.services.store.transaction(
                f"mail:{record.mail_id}", mails.box_key(record.org, record.to_principal),
                ledger.key(record.org)) as db:
            indexed = await _indexed_before(db, record, actor, adopted_at=adopted_at)
            if indexed is not None:
                same_mail(indexed, record, adopted=True)
                return
            await moves.note(db, record.mail_id, at)
            await ledger.append(db, "mail.closed", closer, record.ref, {
                "mail": record.mail_id, "from": MailState.NEW.value,
                "to": MailState.CLOSED.value, "adopted": True}, org=record.org)

    # -- a change made just before the adoption's write -----------------------------------
    # The adoption writes the issue (its body under the header, its title, its labels) as it
    # read it, or as its opening's delivery described it: a change the person (or their
    # script) made in the moment before that write is written over. That change's own
    # delivery comes after, showing the issue as the change left it, from before the write:
    # no header of the mail in its body, no mail:* label. A label change is made again
    # (`undone_by_adoption`: the forge's timeline says who changed the label last). An edit of
    # the title or body is never signed: nothing in its delivery proves it was the editor's
    # newest (deliveries come in any order), and a title-only edit shows a body someone else
    # may have written. Nor is it lost: when the forge dates it no later than the adoption's
    # write (`mails.adopted_at`; a sender who takes the header off later, that delivery lost,
    # then writes other words, is dated after it), what it changed is put back in view as the
    # editor's, unsigned, in a comment by the app, and the mail is flagged (`_written_over`).
    # Any other such edit is checked as tampering, as any edit is.

    @staticmethod
    def before_adoption(mail: MailRecord, issue: Mapping[str, Any],
                        before: Mapping[str, Any]) -> bool:
        """Whether `before` (the issue's body before a change, as its delivery shows it) is
        `mail`'s issue (`issue`, with the forge's id) from before the adoption's write: the
        mail was adopted, and the body opens with no header of it."""
        return (adopted_here(mail.mail_id, mail.vault, mail.number, forge_id(issue))
                and not headed_by(mail.mail_id)(before))

    async def edited(self, mail: MailRecord, issue: dict[str, Any], actor: str, *,
                     changes: Mapping[str, Any] | None) -> None:
        """An `issues.edited` delivery on `mail`'s issue, `issue` as the edit left it, by
        `actor`: checked as tampering, unless it is an edit from before the adoption's write
        (`changes.body.from`, or the body when only the title changed, shows no header of the
        mail) that the adoption read (it signed this very title and these words: nothing
        changed since) or wrote over (`_written_over`)."""
        body = (changes or {}).get("body")
        before = {"body": body.get("from")} if isinstance(body, Mapping) else issue
        if self.before_adoption(mail, issue, before):
            if (mail.subject, mail.body) == (clean_subject(str(issue.get("title") or "")),
                                             written_body(issue.get("body"))):
                return
            if await self._written_over(mail, issue, actor, changes):
                return
        await self.check_tamper(mail, issue, actor)

    async def _written_over(self, mail: MailRecord, issue: Mapping[str, Any], actor: str,
                            changes: Mapping[str, Any] | None) -> bool:
        """An edit from before the adoption's write that the write wrote over, when the forge
        dates it (`issue`'s `updated_at`, whole seconds) no later than that write: what it
        changed (its title, its body; both when the delivery does not say) is quoted as
        `actor`'s in a comment by the app, as data and not signed, saying to send it again to
        have it signed; the mail is flagged, ledgered once, and that comment is its warning.
        False, doing nothing, when the forge dates the edit after the write (or the adoption's
        time is not known): it is no edit the adoption wrote over."""
        edited = moves.forge_time(issue.get("updated_at"))
        adopted = await mails.adopted_at(self.services.store, mail.mail_id)
        if edited is None or adopted is None or edited > adopted:
            return False
        fields = [k for k in ("title", "body") if k in (changes or {})] or ["title", "body"]
        title = as_data(clean_subject(str(issue.get("title") or "")))
        words = blockquote(as_data(written_body(issue.get("body"))))
        said = "\n\n".join([*([f"Title: “{title}”"] if "title" in fields else []),
                             *([words] if "body" in fields else [])])
        if len(said) > QUOTED_MAX:  # the rest is in the forge's own edit history
            said = said[:QUOTED_MAX] + f"\n\n[… {len(said) - QUOTED_MAX:,} characters more]"
        digest = hashlib.sha256(f"{issue.get('updated_at')}\n{said}".encode()).hexdigest()[:16]
        marker = markers.marker("written-over", mail.mail_id, digest)
        await self.forge.owner_confirmed(mail.vault)  # (as check_tamper: flagged for good)
        async with self.services.lock_for(f"tamper:{mail.mail_id}"):
            fresh = await self._flag_tampered(
                mail, actor, "edited before it was signed: the signing wrote over the edit, "
                "kept in a comment, not signed")
            if await self.forge.find_comment(mail.vault, mail.number, marker) is None:
                await self.forge.create_comment(mail.vault, mail.number, (
                    f"⚠️ {actor} edited this issue ({' and '.join(fields)}) before vaultmail "
                    f"signed it as mail, and the signing wrote over the edit (the forge dates "
                    f"it {issue.get('updated_at')}, no later than the signing): the signed mail "
                    "holds the issue as it was opened. What the edit said is kept here as "
                    f"{actor} wrote it, not signed, and it is no part of the mail:\n\n{said}"
                    "\n\nTo have these words signed, send them again: a comment on this mail, "
                    f"or a new mail. vaultmail keeps the signed original: from "
                    f"{mail.from_principal} to {mail.to_principal}, sent {mail.sent}, subject "
                    f"“{as_data(mail.subject)}”.\n\n{marker}"), marker=marker)
            if fresh:  # this comment is its warning
                async with self.services.store.transaction() as db:
                    await mails.tamper_warned(db, mail.mail_id)
        return True

    async def undone_by_adoption(self, mail: MailRecord, issue: Mapping[str, Any],
                                 action: str, label: str) -> LabelChanges:
        """A hand-made `labeled`/`unlabeled` of `label` (`issue` as its delivery shows it)
        that the adoption's write undid, to be made again; else no change. It was made before
        that write (the issue shows neither its header nor a mail:* label) and the forge's
        timeline shows the app's write as the last change of that label: a later change by
        anyone (their own delivery to come) stands."""
        names = [str(lb.get("name", "")) for lb in issue.get("labels", [])]
        if (label.lower().startswith("mail:") or not self.before_adoption(mail, issue, issue)
                or any(n.lower().startswith("mail:") for n in names)):
            return LabelChanges()
        changes = await self.forge.label_changes(mail.vault, mail.number, label)
        last = changes[-1] if changes else None
        added = action == "labeled"
        if last != (self.services.bot_login.lower(), not added):
            return LabelChanges()
        return LabelChanges(add=(label,)) if added else LabelChanges(remove=(label,))

    # -- state changes ---------------------------------------------------------------------
    async def _move(self, mail: MailRecord, event: MailEvent, actor: str, ledger_event: str,
                    *, labels: list[str] | None = None, issue_state: str | None = None,
                    reopen_if_closed: bool = False, data: dict[str, Any] | None = None,
                    follow_up: tuple[str, str] | None = None,
                    at: float | None = None, forged: str | None = None) -> MailRecord:
        """Apply `event` under the mail's lock, so a tool call and the worker never
        interleave on one mail: one forge write when anything changes, then index + ledger.
        `reopen_if_closed`: the issue is reopened if the mail is closed *as found under the
        lock* (decided there, not by a caller whose view may have gone stale meanwhile).
        `at`: the forge time the change happened (a comment's or an event's timestamp; None
        for one made now, a tool call's): a change older than the mail's last applied move
        (a delivery handled late) moves nothing (`bot.store.moves`). `forged`: the issue state
        ("open", "closed") the change itself made on the forge (someone closed or reopened the
        issue): a stale one is undone there, since the later move stands. Under an idempotency
        claim (a keyed tool call, a delivery's change), indexed and ledgered only while the
        claim is still this try's (ClaimLost when it was taken over: `idempotency.fenced`)."""
        self.own(mail)
        owed: list[str] = []
        try:
            return await self._move_held(mail, event, actor, ledger_event, labels=labels,
                                         issue_state=issue_state,
                                         reopen_if_closed=reopen_if_closed, data=data,
                                         follow_up=follow_up, at=at, forged=forged, owed=owed)
        finally:
            # the mail's lock let go first: a tamper warning is a comment (a content
            # creation), which may wait for the hour's budget, and no pacing wait is made
            # under a lock
            for warning in owed:
                await self._warn_owed(mail, warning)

    async def _move_held(self, mail: MailRecord, event: MailEvent, actor: str,
                         ledger_event: str, *, labels: list[str] | None,
                         issue_state: str | None, reopen_if_closed: bool,
                         data: dict[str, Any] | None, follow_up: tuple[str, str] | None,
                         at: float | None, forged: str | None,
                         owed: list[str]) -> MailRecord:
        async with self.services.lock_for(mail.mail_id):
            last = await moves.last_move(self.services.store, mail.mail_id)
            if at is not None and last is not None and at < last:
                latest = await mails.get_mail(self.services.store, mail.mail_id)
                log.info("change older than the mail's last move: not applied", extra={
                    "mail": mail.ref, "event_name": event.value, "actor": actor,
                    "happened_at": at, "last_move_at": last,
                    "state": (latest or mail).state, "outcome": "stale"})
                if latest is not None and forged is not None:
                    await self._undo_stale(latest, forged)
                return latest or mail
            latest = await mails.get_mail(self.services.store, mail.mail_id)
            if latest is not None and latest.state != mail.state:
                labels = None  # the caller's view is stale: go by the index
            found = latest or mail
            if reopen_if_closed and found.state == MailState.CLOSED.value:
                issue_state = "open"
            return await self._move_locked(found, event, actor, ledger_event,
                                           labels=labels, issue_state=issue_state, data=data,
                                           follow_up=follow_up, at=at, owed=owed)

    async def _undo_stale(self, mail: MailRecord, forged: str) -> None:
        """A stale close or reopen made on the forge (the handler saw the issue still so) is
        undone there: the mail's later move decides whether its issue is open."""
        is_open = mail.state != MailState.CLOSED.value
        if (forged == "open") == is_open:
            return
        closing: dict[str, Any] = {} if is_open else {"state_reason": "completed"}
        await self.forge.update_issue(mail.vault, mail.number,
                                      state="open" if is_open else "closed", **closing)

    async def _move_locked(self, mail: MailRecord, event: MailEvent, actor: str,
                           ledger_event: str, *, labels: list[str] | None,
                           issue_state: str | None,
                           data: dict[str, Any] | None,
                           follow_up: tuple[str, str] | None = None,
                           at: float | None = None,
                           owed: list[str] | None = None) -> MailRecord:
        try:
            new = transition(_state(mail), event)
        except IllegalTransition as exc:
            raise Conflict(f"{mail.ref}: {exc}") from exc
        if new.value == mail.state and event in _SETS_STATE:
            return mail  # a retry that overlapped the first: it is done already
        wakes = new is MailState.NEW and mail.state != MailState.NEW.value
        # an agent's follow-up or reopen is counted where it applies (under the mail's lock,
        # from the count as the index has it, written with the move): a retried delivery, or
        # one that moves nothing, counts nothing
        counted = wakes and event in _AGENT_TURNS and actor.startswith("agent:")
        hops = mail.hops + mail.agent_turns + 1
        guarded = counted and hops > LOOP_GUARD_HOPS
        if guarded and event is MailEvent.FOLLOW_UP:
            async with idempotency.fenced(self.services.store, f"{ledger_event} of {mail.ref}",
                                          ledger.key(mail.org)) as db:
                await ledger.append(db, "mail.loop_guard", actor, mail.ref, {
                    "mail": mail.mail_id, "hops": hops,
                    "follow_up": True, "reason": f"beyond {LOOP_GUARD_HOPS} hops: an agent's "
                    "follow-up wakes no one; the recipient sees it on its next run"},
                    org=mail.org)
            return mail
        # an agent's reopen past the guard stands (the issue is open on the forge), but the
        # mail is back in the recipient's inbox quiet: no mail label, no run, no wake-up
        target: str = QUIET if guarded else new.value
        fields: dict[str, Any] = {}
        current = labels if labels is not None else mail.labels
        after = labels_for(None if guarded else new, current).apply(current)
        if target != mail.state:
            fields["labels"] = after
        if issue_state is not None:
            fields["state"] = issue_state
            if issue_state == "closed":
                fields["state_reason"] = "completed"
        if fields:
            issue = await self.forge.update_issue(mail.vault, mail.number, **fields)
            # the answer carries it: no request (a warning owed is posted once the lock is let
            # go: `owed`)
            await self.check_tamper(mail, issue, "office", owed=owed)
            if at is None:  # a change made now: it happened when the forge took the write
                at = moves.forge_time(issue.get("updated_at"))
        agent = self.office.agent(mail.to_principal.removeprefix("agent:"))
        admitted: int | None = None
        async with idempotency.fenced(self.services.store, f"{ledger_event} of {mail.ref}",
                                      mails.box_key(mail.org, mail.to_principal),
                                      ledger.key(mail.org)) as db:
            # from the state this writer saw only: of two replicas moving one mail at once,
            # the one whose view went stale ledgers (and admits) nothing
            if not await mails.set_state(db, mail.mail_id, target, after,
                                         expected=mail.state):
                latest = await mails.get_mail_in(db, mail.mail_id)
                return latest or mail
            await moves.note(db, mail.mail_id, at)
            if counted and not guarded:
                await mails.count_agent_turn(db, mail.mail_id)
            elif not counted and mail.agent_turns and event in _AGENT_TURNS and wakes:
                # a person wrote or reopened: the agents' turns count from 0 (the recipient's
                # reply does not: replying, then writing on the mail each sent the other, two
                # agents would wake each other at the first turn forever)
                await mails.count_agent_turn(db, mail.mail_id, reset=True)
            await ledger.append(db, ledger_event, actor, mail.ref,
                                {"mail": mail.mail_id, "from": mail.state, "to": target,
                                 **(data or {})}, org=mail.org)
            if guarded:
                await ledger.append(db, "mail.loop_guard", actor, mail.ref, {
                    "mail": mail.mail_id, "hops": hops, "reopened": True,
                    "reason": f"beyond {LOOP_GUARD_HOPS} hops: an agent's reopen wakes no one; "
                              "the mail is back quiet, the recipient sees it on its next run"},
                    org=mail.org)
            elif wakes and agent is not None:
                admitted = await runs.admit(db, agent, "mail", mail.ref, actor, org=mail.org,
                                            woken_by=mail.mail_id)
        updated = mail.with_state(target)
        # an agent that sent the mail learns of a reply by the copy in its vault (which wakes
        # it unless the loop guard made it quiet), not by this move: waking it here would let
        # two agents wake each other past the guard
        woken = [] if guarded else [mail.to_principal] + (
            [] if mail.from_principal.startswith("agent:") else [mail.from_principal])
        self.services.notifier.notify(woken, org=mail.org)
        if admitted is not None and agent is not None:
            runs.dispatch_mail(self.services, self.forge, agent, updated, admitted,
                               follow_up=follow_up)
        return updated

    async def open(self, mail: MailRecord, actor: str, *,
                   labels: list[str] | None = None, at: float | None = None) -> MailRecord:
        """The recipient agent opened the mail (seed: "mail:working (the agent opened it)").
        Nobody else may: not its sender, not the agent's person, not an editor."""
        if actor not in (mail.to_principal, "office"):
            raise await self.deny(actor, mail.ref, (
                f"{actor} may not open {mail.ref}: mail:working means its recipient "
                f"{mail.to_principal} opened it, so only {mail.to_principal} can; write to it "
                "(a comment, or mail_send with inReplyTo) or close it instead"))
        if mail.state == MailState.WORKING.value:
            return mail
        return await self._move(mail, MailEvent.OPEN, actor, "mail.opened", labels=labels,
                                at=at)

    async def reply(self, mail: MailRecord, actor: str, text: str, *,
                    posted: bool, labels: list[str] | None = None,
                    key: str | None = None, at: float | None = None) -> MailRecord:
        """The recipient replied (`posted`: its comment is already on the forge, made at
        forge time `at`). `key` names this reply (the forge comment id, or the caller's
        idempotency key), so a retry copies it to an agent sender once, while two replies
        with the same words are two copies. A reply older than the mail's last move (its
        delivery came late) moves nothing: a close made after it stands; its copy still goes."""
        self.own(mail)
        if actor != mail.to_principal:
            raise await self.deny(actor, mail.ref, (
                f"{actor} cannot reply to {mail.ref} as its recipient ({mail.to_principal}); "
                "comment on the issue to add a message instead"))
        if not text.strip():
            raise InvalidArguments("body is empty: write the reply")
        # a named reply may have other tries (a retry, or another replica's try of it, taken
        # over); a fresh key has none
        named, key = key is not None, key or str(uuid.uuid4())
        again = idempotency.resumed()  # an earlier try with this key may have written some
        # everything refusable is checked before the first write: the comment, and the copy
        # an agent sender gets of it, so a refusal never leaves half a reply on the forge
        copy: MailRecord | _Draft | None = None
        left = self.has_left(mail.from_principal)
        if mail.from_principal.startswith("agent:") and mail.from_principal != actor \
                and left is None:
            copy = await self.draft(actor, mail.from_principal,
                                    "Re: " + _RE.sub("", mail.subject), text, reply_to=mail,
                                    check=False, automatic=True,
                                    idempotency_key=f"reply\n{mail.mail_id}\n{key}")
        if not posted:
            marker = markers.reply(key)  # (the key is the caller's: its digest)
            comment = fits(f"**{actor}** replied:\n\n{as_data(text)}\n\n{marker}",
                           "the reply, its byline added")

            async def earlier() -> JSON | None:
                # an earlier try before an upgrade wrote the key itself (`legacy_reply`)
                for m in (marker, markers.legacy_reply(key)) if again else (marker,):
                    if (found := await self.forge.find_comment(mail.vault, mail.number,
                                                               m)) is not None:
                        return found
                return None
            # a named reply may have other tries (an unnamed one's key is fresh); kept a
            # while before its create: should the forge lose the comment, `vaultmail doctor`
            # posts it again (a reply to a person has no copy anywhere else)
            await comment_once(self.forge, mail.vault, mail.number, comment, marker,
                               look=named, find=earlier, before=lambda: replies.keep(
                                   self.services.store, mail.mail_id, key, comment))
            if named:
                await idempotency.check_claim()  # (a try taken over moves nothing either)
        elif mail.from_principal.startswith("email:"):
            # the words the agent wrote on the forge, kept as the delivery carried them: the
            # outbox emails these, whatever the comment is edited to since (`replies.keep`:
            # the first words stay, a delivery again changes nothing)
            await replies.keep(self.services.store, mail.mail_id, key, text)
        if again and await ledger.recorded(
                self.services.store, "mail.replied", mail.ref, "reply", key,
                org=self.office.org, renamed=self.services.keyring.renamed(self.office.org)):
            # the earlier try moved it: whatever happened since (its sender closed it) stands
            updated = await mails.get_mail(self.services.store, mail.mail_id) or mail
        else:
            updated = await self._move(mail, MailEvent.REPLY, actor, "mail.replied",
                                       labels=labels, reopen_if_closed=True,
                                       data={"reply": key}, at=at)
        if copy is not None:
            # the reply stands; a copy with nowhere to go is a bounce in the replier's vault
            with contextlib.suppress(Undeliverable):
                await self.deliver_or_bounce(copy)
        elif left is not None and mail.from_principal != actor:
            await self.bounce(actor, mail.from_principal, "Re: " + _RE.sub("", mail.subject),
                              left, key=f"reply\n{mail.mail_id}\n{key}", about=mail)
        return updated

    async def follow_up(self, mail: MailRecord, actor: str, *,
                        labels: list[str] | None = None, text: str | None = None,
                        at: float | None = None) -> MailRecord:
        """Someone other than the recipient wrote (`text`, carried by the run it starts): the
        mail is the recipient's turn again, if they may write to it (the sender, or anyone who
        may mail the recipient). An agent's follow-up is an automatic notification too: each
        counts a hop on the mail (`agent_turns`, shared with its reopens: `reopened`; only a
        person's follow-up or reopen starts the count again, not the recipient's reply), and
        past LOOP_GUARD_HOPS it is left on the issue without waking anyone
        (`mail.loop_guard`): two agents that each wrote on the mail they sent the other woke
        each other forever. A person's never counts."""
        if actor not in (mail.from_principal, "office"):
            await self.check_may_send(actor, self.recipient(mail.to_principal))
        if mail.state == MailState.NEW.value:
            return mail
        return await self._move(mail, MailEvent.FOLLOW_UP, actor, "mail.sent", labels=labels,
                                reopen_if_closed=True, data={"follow_up": True},
                                follow_up=(actor, text) if text is not None else None, at=at)

    # -- internal bounces ------------------------------------------------------------------
    def has_left(self, principal: str) -> str | None:
        """Why mail to agent `principal` cannot go: it has left the office (no longer in its
        config); None for an agent still here, or anyone else."""
        if not principal.startswith("agent:") or self.office.agent(
                principal.removeprefix("agent:")) is not None:
            return None
        return f"{principal} has left the office"

    async def left_agent(self, to: str) -> str | None:
        """The principal of the agent `to` names (a slug, or agent:slug) when it has left the
        office: no longer in its config, but known to its index (mail to or from it). None
        for an agent here, or a name the office never had (unknown, not gone)."""
        if ":" in to and not to.startswith("agent:"):
            return None
        slug = to.removeprefix("agent:").lower()
        if not slug or self.office.agent(slug) is not None:
            return None
        principal = f"agent:{slug}"
        known = await mails.knows_principal(self.services.store, principal, org=self.office.org)
        return principal if known else None

    async def bounce_if_left(self, actor: str, to: str, subject: str, *, key: str | None,
                             about: MailRecord | None = None) -> None:
        """Mail from `actor` to an agent that has left the office: the bounce (`bounce`:
        an agent sender's "Undelivered" mail, `mail.bounced`) raised as the refusal. Nothing
        when `to` is not such an agent. Who may not send mail at all is refused first.
        `about`: the mail it answers, which the bounce threads after."""
        principal = await self.left_agent(to)
        if principal is None:
            return
        # who may not mail it is told only that, in the words it gets for an agent still
        # here: the refusal says nothing of whether the agent has left
        refusal = self.send_refusal(actor, Agent(slug=principal.removeprefix("agent:"),
                                                 login=principal.removeprefix("agent:")))
        if refusal is not None:
            raise await self.deny(actor, f"mail to {principal}", refusal)
        # one bounce for a keyed send however often it is retried; a fresh one otherwise
        raise await self.bounce(actor, principal, checked_subject(subject, clip=True),
                                f"{principal} has left the office", about=about,
                                key=f"left\n{actor}\n{principal}\n{key or uuid.uuid4()}")

    @staticmethod
    def undeliverable(exc: Exception, vault: str) -> str | None:
        """Why mail to `vault` cannot be delivered, from the forge's answer `exc` to its write:
        the vault is gone (404, 410) or archived (403 saying so); None for any other failure
        (a retry may yet deliver it)."""
        if isinstance(exc, NotFound) or (isinstance(exc, ForgeError) and exc.status == 410):
            return Mailer.closed_why("gone", vault)
        if isinstance(exc, PermissionDenied) and "archived" in exc.message.lower():
            return Mailer.closed_why("archived", vault)
        return None

    @staticmethod
    def closed_why(state: Literal["gone", "archived"], vault: str) -> str:
        """Why mail to `vault` cannot be delivered, `state` as the forge says it."""
        return f"its vault {vault} is gone" if state == "gone" else \
            f"its vault {vault} is archived (read-only)"

    async def deliver_or_bounce(self, draft: MailRecord | _Draft) -> MailRecord:
        """`deliver`, and when the recipient's vault is gone or archived, a bounce
        (`bounce`) instead of a forge error: Undeliverable names why."""
        try:
            return await self.deliver(draft)
        except ForgeError as exc:
            why = None if isinstance(draft, MailRecord) else self.undeliverable(
                exc, draft.header.vault)
            if why is None or isinstance(draft, MailRecord):
                raise
            raise await self.bounce(draft.actor, draft.agent.principal, draft.header.subject,
                                    why, key=draft.header.mail_id) from exc

    async def bounce(self, actor: str, to: str, subject: str, why: str, *, key: str,
                     about: MailRecord | None = None) -> Undeliverable:
        """Tell `actor` its mail to `to` was not delivered (`why`): an agent by an
        "Undelivered" mail in its vault from the office (once per `key`), anyone else by the
        refusal this returns (also what an agent's call answers). Ledgered `mail.bounced`."""
        told: MailRecord | None = None
        sender = self.office.agent(actor.removeprefix("agent:")) \
            if actor.startswith("agent:") else None
        if sender is not None and actor != to:
            title = f"Undelivered: {subject}"
            if len(title) > MAX_SUBJECT:
                title = title[:MAX_SUBJECT - 1].rstrip() + "…"
            try:
                told = await self.send(
                    "office", actor, title,
                    f"Your mail to `{to}` (\"{subject}\") was not delivered: {why}.",
                    reply_to=about, check=False, idempotency_key=f"undelivered\n{key}")
            except PutOff:
                raise  # the notice waits for its budget: the delivery is put off, not told
            except (ForgeError, Undeliverable) as exc:  # its own vault is gone too
                log.warning("bounce not delivered", extra={"to": actor, "error": repr(exc)})
        await ledger.record_once(self.services.store, "mail.bounced", "office",
                                 f"mail to {to}", {"from": actor, "to": to, "why": why,
                                                   "key": key,
                                                   "told": told.ref if told else None},
                                 org=self.office.org, by=("key",))
        return Undeliverable(
            f"mail to {to} not delivered: {why}"
            + (f"; the bounce is {told.ref}" if told is not None else ""))

    async def hold(self, mail: MailRecord) -> MailRecord:
        """Mark quiet mail from outside held (`mail:held`, bot.email.policy): the agent's
        person's turn, to release (a follow-up: mail:new, a run) or drop (close). Once: mail
        already held, or moved on since it was delivered, is left as it is."""
        self.own(mail)
        async with self.services.lock_for(mail.mail_id):
            latest = await mails.get_mail(self.services.store, mail.mail_id) or mail
            if latest.state != QUIET or not latest.from_principal.startswith("email:"):
                return latest
            after = labels_for(MailState.HELD, latest.labels).apply(latest.labels)
            issue = await self.forge.update_issue(latest.vault, latest.number, labels=after)
            # ledgered by its caller (`email.held`, with the reason)
            async with self.services.store.transaction(
                    mails.box_key(latest.org, latest.to_principal)) as db:
                if not await mails.set_state(db, latest.mail_id, MailState.HELD.value, after,
                                             expected=QUIET):
                    return await mails.get_mail_in(db, latest.mail_id) or latest
                await moves.note(db, latest.mail_id, moves.forge_time(issue.get("updated_at")))
        # its person's turn, not the agent's: the agent is not woken
        agent = self.office.agent(latest.to_principal.removeprefix("agent:"))
        if agent is not None and agent.person:
            self.services.notifier.notify([f"human:{agent.person.lower()}"], org=latest.org)
        return latest.with_state(MailState.HELD.value)

    async def close(self, mail: MailRecord, actor: str, *, issue_closed: bool = False,
                    labels: list[str] | None = None, at: float | None = None) -> MailRecord:
        if not self.may_manage(actor, mail):
            raise await self.deny(actor, mail.ref, (
                f"{actor} may not close {mail.ref}: only its recipient, its sender, the "
                "recipient's person or an editor can"))
        if mail.state == MailState.CLOSED.value:
            return mail  # closed already: closing again writes nothing, ledgers nothing
        return await self._move(mail, MailEvent.CLOSE, actor, "mail.closed", labels=labels,
                                issue_state=None if issue_closed else "closed", at=at,
                                forged="closed" if issue_closed else None)

    async def reopened(self, mail: MailRecord, actor: str,
                       labels: list[str] | None = None, at: float | None = None) -> MailRecord:
        """The issue was reopened on the forge: the mail is its recipient's again (mail:new, a
        run). An agent's reopen counts a hop on the mail as its follow-up does
        (`follow_up`): past LOOP_GUARD_HOPS the mail is back quiet (no mail label, no run),
        and `mail.loop_guard` is ledgered. A person's reopen always wakes."""
        if mail.state != MailState.CLOSED.value:
            return mail
        return await self._move(mail, MailEvent.REOPEN, actor, "mail.sent", labels=labels,
                                data={"reopened": True}, at=at, forged="open")

    # -- tamper checks ---------------------------------------------------------------------
    async def check_tamper(self, mail: MailRecord, issue: dict[str, Any], actor: str, *,
                           owed: list[str] | None = None) -> bool:
        """Verify the issue as found; flag, ledger and comment once when it was changed.

        The flag and the ledger entry come first and note the warning as owed; the comment
        (with a marker) is part of what a retry does until it is on the forge. `owed`: the
        comment is left to the caller (which holds the mail's lock): its warning is added
        there, for `_warn_owed` once the lock is let go."""
        verdict = verify_issue(issue, mail.vault, self.services.keyring,
                               app_login=self.services.bot_login, expected_mail_id=mail.mail_id)
        if verdict.valid:
            return True
        # (the issue read may be another account's, under a login its org left unheard: a
        # flag and a ledger entry are for good, so its vault is confirmed the office's first)
        await self.forge.owner_confirmed(mail.vault)
        store = self.services.store
        async with self.services.lock_for(f"tamper:{mail.mail_id}"):
            flag = await mails.tamper_flag(store, mail.mail_id)
            fresh = False
            if flag == 0:
                fresh = await self._flag_tampered(mail, actor, verdict.reason)
                flag = mails.WARNING_OWED if fresh else await mails.tamper_flag(store,
                                                                                mail.mail_id)
            if flag == mails.WARNING_OWED:
                if owed is not None:
                    owed.append(verdict.warning)
                else:
                    await self._warn_tampered(mail, verdict.warning)
        return False

    async def _flag_tampered(self, mail: MailRecord, actor: str, reason: str) -> bool:
        """Flag the mail, its warning owed, and ledger `mail.tampered` (under the tamper
        lock); False when it was flagged already."""
        async with self.services.store.transaction(mails.box_key(mail.org, mail.to_principal),
                                                   ledger.key(mail.org)) as db:
            fresh = await mails.mark_tampered(db, mail.mail_id)
            if fresh:
                await ledger.append(db, "mail.tampered", actor, mail.ref,
                                    {"mail": mail.mail_id, "reason": reason}, org=mail.org)
        return fresh

    async def _warn_owed(self, mail: MailRecord, warning: str) -> None:
        """A tamper warning a move found owed, posted outside the mail's lock (once: under the
        tamper lock, while the flag still says it is owed)."""
        async with self.services.lock_for(f"tamper:{mail.mail_id}"):
            if await mails.tamper_flag(self.services.store, mail.mail_id) == mails.WARNING_OWED:
                await self._warn_tampered(mail, warning)

    async def _warn_tampered(self, mail: MailRecord, warning: str) -> None:
        """Post `warning` (`Verdict.warning`) on the mail's issue, with what was sent: looked
        for even when this try flagged it, since its create may land after another's that
        found it still owed (the tamper lock lost under this one: `comment_once`)."""
        marker = markers.marker("tampered", mail.mail_id)
        await comment_once(self.forge, mail.vault, mail.number, (
            f"⚠️ {warning}. vaultmail "
            f"keeps the signed original: from {mail.from_principal} to "
            f"{mail.to_principal}, sent {mail.sent}, subject "
            f"“{as_data(mail.subject)}”.\n\n{marker}"), marker)
        async with self.services.store.transaction() as db:
            await mails.tamper_warned(db, mail.mail_id)


async def _index_sent(db: Connection, record: MailRecord, actor: str, *,
                      adopted_at: float | None = None, sent_from: str | None = None) -> bool:
    """Inside the indexing transaction: the mail in the index, and `mail.sent` by `actor`;
    False, doing nothing, when a row is under its mail id already. `adopted_at`: a mail
    adopted by a write the forge dates then (an issue opened by hand: no send of the app's
    was pending); `sent_from`: the run it was sent from (`mails.add_mail`)."""
    if not await mails.add_mail(db, record, adopted_at=adopted_at, sent_from=sent_from):
        return False
    if adopted_at is None:
        await mails.sent(db, record.mail_id)
    await _ledger_sent(db, record, actor)
    return True


async def _indexed_before(db: Connection, record: MailRecord, actor: str, *,
                          adopted_at: float | None = None,
                          sent_from: str | None = None) -> MailRecord | None:
    """Inside the indexing transaction: the row indexed under the mail's id before, if one
    is (nothing written then); else None, `_index_sent` done. The row's write is the look,
    one statement that writes nothing where a row is, not a read and then a write."""
    while not await _index_sent(db, record, actor, adopted_at=adopted_at,
                                sent_from=sent_from):
        indexed = await mails.get_mail_in(db, record.mail_id)
        if indexed is not None:
            return indexed
        # (gone between the two: a reindex let it go; the write looks again)
    return None


async def _ledger_sent(db: Connection, record: MailRecord, actor: str) -> None:
    await ledger.append(db, "mail.sent", actor, record.ref, {
        "mail": record.mail_id, "to": record.to_principal, "subject": record.subject,
        "hops": record.hops, "thread": record.thread_id,
        "in_reply_to": record.in_reply_to}, org=record.org)


async def _woken(db: Connection, record: MailRecord, actor: str, agent: Agent | None,
                 quiet: str | None) -> int | None:
    """Inside the indexing transaction: the wake a mail just ledgered sent gives its recipient
    agent, its run admitted (its id), or past the loop guard its `mail.loop_guard` entry.
    None for mail to an address (`agent` None): in no one's inbox; and for mail its recipient
    opened already (a send caught up after its issue moved on, as a backup restored from
    while it was at work finds it: its recipient was woken for it then)."""
    if agent is None or record.state not in (MailState.NEW.value, QUIET):
        return None
    if record.state == QUIET:
        await ledger.append(db, "mail.loop_guard", "office", record.ref, {
            "mail": record.mail_id, "hops": record.hops,
            "reason": quiet or f"beyond {LOOP_GUARD_HOPS} hops: delivered without mail:new"},
            org=record.org)
        return None
    return await runs.admit(db, agent, "mail", record.ref, actor, org=record.org,
                            woken_by=record.mail_id)
