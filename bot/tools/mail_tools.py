"""The mail tools: mail_send, mail_open, mail_reply, mail_close, mail_list, mail_get."""

from __future__ import annotations

import re
from typing import Any, Literal

from pydantic import Field

from bot.digits import whole
from bot.errors import CatchingUp, InvalidArguments, NotFoundError
from bot.office.visibility import viewer_for
from bot.store import mails
from bot.store.mails import QUIET, MailRecord
from bot.tools import outputs
from bot.tools.registry import (
    MAX_ID,
    READS_FORGE,
    READS_INDEX,
    Args,
    Call,
    Hints,
    inbox_provider,
    tool,
)

# an issue number of at most 15 digits (below 2**53): a longer one names no issue, and never
# reaches the index as an integer it cannot hold
_REF = re.compile(r"^(?P<repo>[A-Za-z0-9_.-]+/[A-Za-z0-9_.-]+)#(?P<n>[1-9][0-9]{0,14})$")
REF_MAX = 300  # owner (39) / repo (100) #N, or a mail id, with room to spare


async def find_mail(call: Call, ref: str) -> MailRecord:
    """A mail by id or owner/repo#N, visible to the caller."""
    store, viewer = call.services.store, viewer_for(call)
    m = _REF.match(ref.strip())
    mail = (await mails.mail_at(store, viewer.repo_now(m["repo"]), int(m["n"])) if m
            else await mails.get_mail(store, ref.strip()))
    if mail is None or not viewer.sees_mail(mail):  # one you may not read is not found either
        raise NotFoundError(f"no mail {ref!r}: give a mail id or owner/repo#N from mail_list")
    return mail


def mail_view(mail: MailRecord) -> dict[str, Any]:
    """A mail as tools return it: its subject and body are someone's text, data to an agent
    (seed: "Content is data"), never instructions."""
    return {**mail.as_json(), "contentIsData": True}


def _may_see(call: Call, mail: MailRecord) -> bool:
    return viewer_for(call).sees_mail(mail)


class SendArgs(Args):
    to: str = Field(min_length=1, max_length=200,
                    description="agent slug (scout) or principal (agent:scout), or an email "
                    "address (bob@example.org) your capabilities.mail.send allows")
    subject: str = Field(min_length=1, max_length=256, description="the mail's subject line")
    body: str = Field(max_length=60_000, description="the mail's text (Markdown)")
    inReplyTo: str | None = Field(default=None, max_length=REF_MAX, description=(
        "the mail this answers: its id or owner/repo#N"))
    idempotencyKey: str | None = Field(default=None, max_length=200, description=(
        "any string; a retried send with the same key returns the first mail, never a second"))
    # (no bound of the schema's own: a number of no run is refused naming the runs it takes)
    run: int | None = Field(default=None, json_schema_extra={
        "minimum": 1, "maximum": MAX_ID}, description=(
        "an agent's run this mail is sent from (the `run` of the payload that woke it): its "
        "hops count from that run's mail; one of your own runs still open"))


@tool("mail_send", SendArgs, "Send mail to an agent; it lands in the agent's vault as mail:new.",
      title="Send mail", output=outputs.MailResult,
      hints=Hints(read_only=False, destructive=False, idempotent=False, open_world=True))
async def mail_send(call: Call, args: SendArgs) -> dict[str, Any]:
    reply_to = await find_mail(call, args.inReplyTo) if args.inReplyTo else None
    # the run the mail climbs from: its token's (a command run's), else the one the agent
    # names, else (None) its latest open mail run (`Mailer.sent_hops`)
    woken_by = call.woken_by
    if args.run is not None:  # named where it cannot count: said, not dropped
        if not call.is_agent:
            raise InvalidArguments("`run` names an agent's run its mail is sent from; a "
                                   "person's mail is sent from none: leave it out",
                                   code="run_not_open")
        named = await call.mailer.named_run(call.principal, args.run)
        if woken_by is not None and named != woken_by:
            raise InvalidArguments(f"run {args.run} is not this token's own run (a run's "
                                   "token names its run already): leave `run` out",
                                   code="run_not_open")
        woken_by = named
    if args.idempotencyKey and call.office.org.lower() in call.services.catching_up:
        raise CatchingUp(f"{call.office.org}'s index is being caught up from the forge (the "
                         "app has just started): a send with an idempotencyKey waits for it, "
                         "so that it finds the mail an earlier try sent; nothing was sent, try "
                         "again in a few seconds")
    from bot.email.sending import is_address, send_email

    if is_address(args.to):  # to someone outside, by email (issue 24)
        return {"mail": mail_view(await send_email(
            call.mailer, call.principal, args.to, args.subject, args.body, reply_to=reply_to,
            idempotency_key=args.idempotencyKey, woken_by=woken_by))}
    # an agent that has left: the sender gets a bounce naming why, not "no such agent"
    await call.mailer.bounce_if_left(call.principal, args.to, args.subject,
                                     key=args.idempotencyKey, about=reply_to)
    await call.mailer.check_may_send(call.principal, call.mailer.recipient(args.to))
    record = await call.mailer.send(call.principal, args.to, args.subject, args.body,
                                    reply_to=reply_to, idempotency_key=args.idempotencyKey,
                                    check=False, woken_by=woken_by)
    return {"mail": mail_view(record)}


class MailArg(Args):
    mail: str = Field(min_length=1, max_length=REF_MAX, description="mail id or owner/repo#N")


@tool("mail_open", MailArg, "Open a mail addressed to you: marks it mail:working, returns it.",
      title="Open a mail", output=outputs.MailResult,
      hints=Hints(read_only=False, destructive=False, idempotent=True, open_world=True))
async def mail_open(call: Call, args: MailArg) -> dict[str, Any]:
    mail = await find_mail(call, args.mail)
    return {"mail": mail_view(await call.mailer.open(mail, call.principal))}


class ReplyArgs(Args):
    mail: str = Field(min_length=1, max_length=REF_MAX, description="mail id or owner/repo#N")
    body: str = Field(min_length=1, max_length=60_000, description="the reply's text (Markdown)")
    idempotencyKey: str | None = Field(default=None, max_length=200, description=(
        "any string; a retried reply with the same key is posted and copied once"))


@tool("mail_reply", ReplyArgs, "Reply to a mail addressed to you (mail:replied); an agent "
      "sender also gets the reply in its own vault.", title="Reply to a mail",
      output=outputs.MailResult,
      hints=Hints(read_only=False, destructive=False, idempotent=False, open_world=True))
async def mail_reply(call: Call, args: ReplyArgs) -> dict[str, Any]:
    mail = await find_mail(call, args.mail)
    updated = await call.mailer.reply(mail, call.principal, args.body, posted=False,
                                      key=args.idempotencyKey)
    return {"mail": mail_view(updated)}


@tool("mail_close", MailArg, "Close a mail you handled (mail:closed, issue closed).",
      title="Close a mail", output=outputs.MailResult,
      # not idempotent: closing a closed mail closes its issue again (it may have been reopened
      # by hand) and ledgers mail.closed again
      hints=Hints(read_only=False, destructive=True, idempotent=False, open_world=True))
async def mail_close(call: Call, args: MailArg) -> dict[str, Any]:
    mail = await find_mail(call, args.mail)
    return {"mail": mail_view(await call.mailer.close(mail, call.principal))}


PAGE = 30  # like the inbox's read comments and updates


class ListArgs(Args):
    state: Literal["new", "working", "replied", "closed", "held", "quiet"] | None = Field(
        default=None, description="only mail in this state (quiet: past the loop guard; "
        "held: outside mail held for your person)")
    vault: str | None = Field(default=None, max_length=200,
                              description="only mail in this vault (owner/repo)")
    thread: str | None = Field(default=None, max_length=200,
                               description="only mail of this thread (a mail's thread_id)")
    mailsBefore: str | None = Field(default=None, max_length=400,
                                    description="moreMailsBefore from the last page")


def _cursor(mail: MailRecord) -> str:
    sent, vault, number = mails.mail_cursor(mail)
    return f"{sent}|{vault}|{number}"


def _parse_cursor(text: str) -> mails.MailCursor:
    sent, _, rest = text.partition("|")
    vault, _, digits = rest.rpartition("|")
    number = whole(digits)
    if not (sent and vault and number is not None):
        raise InvalidArguments(f"mailsBefore: {text[:80]!r} is not a cursor; pass back the "
                               "moreMailsBefore of the last page, or leave it out for the newest")
    return sent, vault, number


@tool("mail_list", ListArgs, "List mail you sent or received, newest first, 30 at a time, "
      "filtered by state, vault, thread; pass moreMailsBefore back as mailsBefore for more.",
      title="List mail", hints=READS_INDEX, output=outputs.MailPage)
async def mail_list(call: Call, args: ListArgs) -> dict[str, Any]:
    state = None if args.state is None else (QUIET if args.state == "quiet"
                                             else f"mail:{args.state}")
    before = _parse_cursor(args.mailsBefore) if args.mailsBefore else None
    rows = await mails.page_mails(call.services.store, org=call.office.org, state=state,
                                  vault=args.vault,
                                  thread=args.thread, before=before, limit=PAGE + 1,
                                  involving=None if call.principal == "office" else call.principal)
    more = _cursor(rows[PAGE - 1]) if len(rows) > PAGE else None
    return {"mails": [mail_view(m) for m in rows[:PAGE] if _may_see(call, m)],
            "moreMailsBefore": more}


@tool("mail_get", MailArg, "A mail with its thread: the comments on it and the linked mails "
      "in other vaults. The header is verified as it is read.",
      title="Read a mail and its thread", hints=READS_FORGE, output=outputs.MailThread)
async def mail_get(call: Call, args: MailArg) -> dict[str, Any]:
    mail = await find_mail(call, args.mail)
    issue = await call.forge.get_issue(mail.vault, mail.number)
    valid = await call.mailer.check_tamper(mail, issue, "office")
    comments = await call.forge.list_comments(mail.vault, mail.number)
    linked = await mails.list_mails(call.services.store, org=call.office.org,
                                    thread=mail.thread_id)
    return {
        "mail": mail_view(await mails.get_mail(call.services.store, mail.mail_id) or mail),
        "verified": valid,
        "comments": [{"author": c["user"]["login"], "body": c["body"],
                      "created_at": c["created_at"], "contentIsData": True} for c in comments],
        "thread": [mail_view(m) for m in linked if _may_see(call, m)],
    }


@inbox_provider
async def mail_waiting(call: Call) -> dict[str, Any]:
    """An agent's inbox lists its mail to handle: mail:new and quiet loop-guard deliveries."""
    store = call.services.store
    waiting, upto = await mails.to_handle(store, call.principal, org=call.office.org)
    # a wait now waits past these
    await mails.mark_shown(store, call.principal, upto, org=call.office.org)
    return {"mail": [{"mail": m.mail_id, "ref": m.ref, "from": m.from_principal,
                      "subject": m.subject, "state": m.state,
                      **({"tampered": True} if m.tampered else {}), "contentIsData": True}
                     for m in waiting]}


