"""The console's forms: each one a tool call of the visitor (answer, defer, resolve, send, chat).

A form carries its CSRF token and, for what writes to the forge, a key made when the page was
drawn, passed as the tool's `idempotencyKey`: a double click sends one mail, one answer.
"""

from __future__ import annotations

from typing import Any

from aiohttp import web

from bot.app.bodies import json_response
from bot.console import sessions
from bot.console.frame import action, done, tool
from bot.console.visitor import CONSOLE, Visitor
from bot.errors import InvalidArguments, NotFoundError

INBOX = f"{CONSOLE}/inbox"


def _inbox(request: web.Request, form: dict[str, str]) -> str:
    return INBOX


def _required(form: dict[str, str], name: str) -> str:
    value = form.get(name, "").strip()
    if not value:
        raise InvalidArguments(f"{name}: empty; fill it in and send the form again")
    return value


def _key(form: dict[str, str]) -> str | None:
    return form.get("key") or None


@action(_inbox)
async def answer(request: web.Request, v: Visitor, form: dict[str, str]) -> web.StreamResponse:
    """A button (`option`), words (`body`), or both; `amend` changes an answer given."""
    thread = _required(form, "thread")
    args: dict[str, Any] = {"targetType": _required(form, "targetType"),
                            "target": _required(form, "target"), "parent": thread,
                            "body": form.get("body", "").strip()}
    if form.get("option"):
        args["option"] = form["option"]
    if form.get("amend") == "1":
        args["amend"] = True
    if _key(form):
        args["idempotencyKey"] = _key(form)
    result = await tool(v, "add_comment", **args)
    await sessions.undefer(v.services.store, v.principal, thread, org=v.call.office.org)
    chosen = result["comment"].get("option")
    what = f"“{chosen}”" if chosen else "your reply"
    verb = "changed to" if args.get("amend") else "sent:"
    return await done(v, INBOX, f"Answer {verb} {what} on {result['comment']['item']}")


@action(_inbox)
async def defer(request: web.Request, v: Visitor, form: dict[str, str]) -> web.StreamResponse:
    """Set a card aside: it goes to the end of the stack and comes back after the others.
    Only a card of the person's stack: any other text a form names would be a row of the
    index kept for nothing (as many, and as long, as requests carry)."""
    thread = _required(form, "thread")
    look = await tool(v, "list_inbox", markRead=False)
    if thread not in {c["thread"] for c in look["you"]["yourTurn"]}:
        raise NotFoundError(f"no card {thread[:80]!r} waits on you to set aside: reload the "
                            "Inbox")
    await sessions.defer(v.services.store, v.principal, thread, org=v.call.office.org)
    return await done(v, INBOX, "Deferred: it comes back at the end of your stack")


@action(_inbox)
async def resolve(request: web.Request, v: Visitor, form: dict[str, str]) -> web.StreamResponse:
    thread = _required(form, "thread")
    await tool(v, "resolve_comment", comment=thread)
    await sessions.undefer(v.services.store, v.principal, thread, org=v.call.office.org)
    return await done(v, INBOX, "Resolved: the thread is done")


def _mail(request: web.Request, form: dict[str, str]) -> str:
    return f"{CONSOLE}/mail"


@action(_mail)
async def send(request: web.Request, v: Visitor, form: dict[str, str]) -> web.StreamResponse:
    args: dict[str, Any] = {"to": _required(form, "to"), "subject": _required(form, "subject"),
                            "body": form.get("body", "")}
    if form.get("inReplyTo"):
        args["inReplyTo"] = form["inReplyTo"]
    if _key(form):
        args["idempotencyKey"] = _key(form)
    result = await tool(v, "mail_send", **args)
    mail = result["mail"]
    return await done(v, f"{CONSOLE}/mail?sent={mail['ref']}",
                      f"Sent to {mail['to_principal']}: {mail['ref']}")


def _desk(request: web.Request, form: dict[str, str]) -> str:
    return f"{CONSOLE}/agents/{request.match_info['slug']}"


@action(_desk)
async def chat(request: web.Request, v: Visitor, form: dict[str, str]) -> web.StreamResponse:
    """`agent_chat` without waiting: the answer comes to the page as it lands (live.py)."""
    slug = request.match_info["slug"]
    args: dict[str, Any] = {"agent": slug, "message": _required(form, "message")}
    if _key(form):
        args["idempotencyKey"] = _key(form)
    result = await tool(v, "agent_chat", **args)
    if request.headers.get("Accept") == "application/json":
        return json_response(result)
    return await done(v, f"{CONSOLE}/agents/{slug}#chat",
                      f"Asked {slug}; its answer appears here when it comes")
