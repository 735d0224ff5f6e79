"""The mail tools: mail_send, mail_open, mail_reply, mail_close, mail_list, mail_get."""

from __future__ import annotations

import re
from typing import Any, Literal

from pydantic import Field

from bot.errors import Denied, NotFoundError
from bot.store import mails
from bot.store.mails import QUIET, MailRecord
from bot.tools.registry import Args, Call, inbox_provider, tool

_REF = re.compile(r"^(?P<repo>[A-Za-z0-9_.-]+/[A-Za-z0-9_.-]+)#(?P<n>[1-9][0-9]*)$")


async def find_mail(call: Call, ref: str) -> MailRecord:
    """A mail by id or owner/repo#N, visible to the caller."""
    store = call.services.store
    m = _REF.match(ref.strip())
    mail = (await mails.mail_at(store, m["repo"], int(m["n"])) if m
            else await mails.get_mail(store, ref.strip()))
    if mail is None:
        raise NotFoundError(f"no mail {ref!r}: give a mail id or owner/repo#N from mail_list")
    if not _may_see(call, mail):
        raise Denied(f"{call.principal} is neither the sender nor the recipient of {mail.ref}")
    return mail


def _may_see(call: Call, mail: MailRecord) -> bool:
    return call.mailer.may_manage(call.principal, mail)


class SendArgs(Args):
    to: str = Field(min_length=1, description="agent slug (scout) or principal (agent:scout)")
    subject: str = Field(min_length=1, max_length=256)
    body: str = Field(max_length=60_000)
    inReplyTo: str | None = Field(default=None, description="mail id or owner/repo#N")
    idempotencyKey: str | None = Field(default=None, max_length=200, description=(
        "any string; a retried send with the same key returns the first mail, never a second"))


@tool("mail_send", SendArgs, "Send mail to an agent; it lands in the agent's vault as mail:new.")
async def mail_send(call: Call, args: SendArgs) -> dict[str, Any]:
    reply_to = await find_mail(call, args.inReplyTo) if args.inReplyTo else None
    await call.mailer.check_may_send(call.principal, call.mailer.recipient(args.to))
    record = await call.mailer.send(call.principal, args.to, args.subject, args.body,
                                    reply_to=reply_to, idempotency_key=args.idempotencyKey,
                                    check=False)
    return {"mail": record.as_json()}


class MailArg(Args):
    mail: str = Field(min_length=1, description="mail id or owner/repo#N")


@tool("mail_open", MailArg, "Open a mail addressed to you: marks it mail:working, returns it.")
async def mail_open(call: Call, args: MailArg) -> dict[str, Any]:
    mail = await find_mail(call, args.mail)
    return {"mail": (await call.mailer.open(mail, call.principal)).as_json()}


class ReplyArgs(Args):
    mail: str = Field(min_length=1, description="mail id or owner/repo#N")
    body: str = Field(min_length=1, max_length=60_000)
    idempotencyKey: str | None = Field(default=None, max_length=200, description=(
        "any string; a retried reply with the same key is posted and copied once"))


@tool("mail_reply", ReplyArgs, "Reply to a mail addressed to you (mail:replied); an agent "
      "sender also gets the reply in its own vault.")
async def mail_reply(call: Call, args: ReplyArgs) -> dict[str, Any]:
    mail = await find_mail(call, args.mail)
    updated = await call.mailer.reply(mail, call.principal, args.body, posted=False,
                                      key=args.idempotencyKey)
    return {"mail": updated.as_json()}


@tool("mail_close", MailArg, "Close a mail you handled (mail:closed, issue closed).")
async def mail_close(call: Call, args: MailArg) -> dict[str, Any]:
    mail = await find_mail(call, args.mail)
    return {"mail": (await call.mailer.close(mail, call.principal)).as_json()}


class ListArgs(Args):
    state: Literal["new", "working", "replied", "closed", "quiet"] | None = None
    vault: str | None = None
    thread: str | None = None


@tool("mail_list", ListArgs, "List mail you sent or received, filtered by state, vault, thread.")
async def mail_list(call: Call, args: ListArgs) -> dict[str, Any]:
    state = None if args.state is None else (QUIET if args.state == "quiet"
                                             else f"mail:{args.state}")
    rows = await mails.list_mails(call.services.store, state=state, vault=args.vault,
                                  thread=args.thread,
                                  involving=None if call.principal == "office" else call.principal)
    return {"mails": [m.as_json() for m in rows if _may_see(call, m)]}


@tool("mail_get", MailArg, "A mail with its thread: the comments on it and the linked mails "
      "in other vaults. The header is verified as it is read.")
async def mail_get(call: Call, args: MailArg) -> dict[str, Any]:
    mail = await find_mail(call, args.mail)
    issue = await call.forge.get_issue(mail.vault, mail.number)
    valid = await call.mailer.check_tamper(mail, issue, "office")
    comments = await call.forge.list_comments(mail.vault, mail.number)
    linked = await mails.list_mails(call.services.store, thread=mail.thread_id)
    return {
        "mail": (await mails.get_mail(call.services.store, mail.mail_id) or mail).as_json(),
        "verified": valid,
        "comments": [{"author": c["user"]["login"], "body": c["body"],
                      "created_at": c["created_at"]} for c in comments],
        "thread": [m.as_json() for m in linked if _may_see(call, m)],
    }


@inbox_provider
async def mail_waiting(call: Call) -> dict[str, Any]:
    """An agent's inbox lists its mail to handle: mail:new and quiet loop-guard deliveries."""
    store = call.services.store
    new = await mails.list_mails(store, to=call.principal, state="mail:new")
    quiet = await mails.list_mails(store, to=call.principal, state=QUIET)
    return {"mail": [{"mail": m.mail_id, "ref": m.ref, "from": m.from_principal,
                      "subject": m.subject, "state": m.state} for m in new + quiet]}


