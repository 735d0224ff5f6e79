"""The held queue (issue 24): outside mail held for the visitor's agents, each with who sent
it, why it is held and its SPF, DKIM and DMARC verdicts; Release gives it to the agent
(bot.email.held.release, which decides who may), Drop closes it (the `mail_close` tool)."""

from __future__ import annotations

from aiohttp import web

from bot.console.frame import action, done, frame, signed_in, tool
from bot.console.render import page
from bot.console.visitor import CONSOLE, Visitor
from bot.email import held
from bot.errors import InvalidArguments, NotFoundError
from bot.office.visibility import viewer_for
from bot.store import mails

HELD = f"{CONSOLE}/held"


@signed_in
async def held_page(request: web.Request, v: Visitor) -> web.StreamResponse:
    queue = await held.held_for(v.call.mailer, v.principal)
    viewer = viewer_for(v.call)
    return page("held.html", {**await frame(request, v, "held"),
                              "held": [h for h in queue if viewer.sees_mail(h.mail)]})


def _back(request: web.Request, form: dict[str, str]) -> str:
    return HELD


async def _mail(v: Visitor, form: dict[str, str], verb: str) -> mails.MailRecord:
    ref = form.get("mail", "").strip()
    if not ref:
        raise InvalidArguments(f"mail: empty; use the {verb} buttons of the held queue")
    mail = await mails.get_mail(v.services.store, ref)
    if mail is None or not viewer_for(v.call).sees_mail(mail):
        raise NotFoundError(f"no mail {ref[:80]!r} to {verb}: it is not held for you")
    return mail


@action(_back)
async def release(request: web.Request, v: Visitor, form: dict[str, str]) -> web.StreamResponse:
    mail = await held.release(v.call.mailer, v.principal, await _mail(v, form, "release"))
    return await done(v, HELD, f"Released to {mail.to_principal}: {mail.ref}")


@action(_back)
async def drop(request: web.Request, v: Visitor, form: dict[str, str]) -> web.StreamResponse:
    mail = await _mail(v, form, "drop")
    await tool(v, "mail_close", mail=mail.mail_id)
    return await done(v, HELD, f"Dropped: {mail.ref} is closed")
