"""What every signed-in page shares: the visitor's tool calls, the sidebar and its badge, the
flash message of the last form, errors as pages, and the guard that sends a browser to sign in.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

from bot.app.bodies import replace_surrogates
from bot.app.services import SERVICES_KEY
from bot.console import sessions
from bot.console.render import page
from bot.console.visitor import (
    NotSignedIn,
    Visitor,
    check_csrf,
    not_signed_in_json,
    sign_in_redirect,
    visitor,
)
from bot.errors import VaultmailError, forge_refusal, refusal_headers
from bot.forge.errors import ForgeError
from bot.office.visibility import viewer_for
from bot.tools.registry import call_tool

log = logging.getLogger("vaultmail.console")
STREAM = "/console/events"  # answered 401, never sent to sign in (a script reads it)
PageFn = Callable[[web.Request, Visitor], Awaitable[web.StreamResponse]]
ActionFn = Callable[[web.Request, Visitor, dict[str, str]], Awaitable[web.StreamResponse]]


async def tool(v: Visitor, name: str, **args: Any) -> dict[str, Any]:
    """A tool call as the visitor: the same rules, checks and ledger as over HTTP or MCP."""
    return await call_tool(v.call, name, args)


def unread_beside(you: dict[str, Any]) -> list[dict[str, Any]]:
    """Unread comments that are not already a card of the stack (a question to the person is
    both: it shows once, as its card)."""
    cards = {t["thread"] for t in you["yourTurn"]}
    return [c for c in you["unread"] if c["thread"] not in cards]


def badge_of(look: dict[str, Any]) -> int:
    """What is for the person personally: their card stack and their other unread comments."""
    you = look["you"]
    return len(you["yourTurn"]) + len(unread_beside(you))


async def badge(v: Visitor) -> int:
    """A look that marks nothing read (only the Inbox page itself marks what it shows)."""
    return badge_of(await tool(v, "list_inbox", markRead=False))


async def frame(request: web.Request, v: Visitor, current: str, *,
                badge_count: int | None = None) -> dict[str, Any]:
    """The context every page template gets."""
    viewer = viewer_for(v.call)
    agents = [a for a in v.call.office.agents
              if await viewer.sees_repo(v.call.office.vault_of(a))]
    flash = None
    if v.session is not None and v.session.flash:
        flash = v.session.flash
        await sessions.set_flash(v.services.store, v.session, None)
    held = 0
    if v.call.office.email is not None and v.principal.startswith("human:"):
        from bot.email.held import count_for  # the held queue's count (issue 24)

        held = await count_for(v.call.mailer, v.principal)
    return {"v": v, "human": v.human, "office": v.call.office, "current": current,
            "held": held,
            "badge": await badge(v) if badge_count is None else badge_count,
            "agents_nav": agents, "csrf": v.csrf, "flash": flash,
            "forge_web": v.services.settings.web_url, "path": request.path_qs}


def error_page(request: web.Request, exc: VaultmailError, v: Visitor | None = None) -> web.Response:
    shown = page("error.html", {"v": v, "error": exc, "status": exc.status,
                                "path": request.path_qs, "current": None, "csrf": v.csrf if v
                                else "", "badge": None, "agents_nav": [], "human": v.human
                                if v else None}, status=exc.status)
    shown.headers.update(refusal_headers(exc))  # a 429 or 503 says when to come back
    return shown


def _forge_error(exc: ForgeError) -> VaultmailError:
    return forge_refusal(exc, done="nothing was recorded")


def signed_in(fn: PageFn) -> Callable[[web.Request], Awaitable[web.StreamResponse]]:
    """A page for the office's people: without a session or token, the browser is sent to sign
    in; a refusal is an error page with its status."""
    async def handle(request: web.Request) -> web.StreamResponse:
        try:
            v = await visitor(request)
        except NotSignedIn:
            stream = request.path == STREAM or "text/event-stream" in request.headers.get(
                "Accept", "")
            if request.method == "GET" and not stream:
                raise sign_in_redirect(request) from None
            return not_signed_in_json()
        except VaultmailError as exc:
            return error_page(request, exc)
        try:
            return await fn(request, v)
        except VaultmailError as exc:
            return error_page(request, exc, v)
        except ForgeError as exc:
            log.warning("console page failed at the forge", extra={"error": str(exc)})
            return error_page(request, _forge_error(exc), v)
    return handle


async def read_form(request: web.Request) -> dict[str, str]:
    """A form's text fields. A lone surrogate (a part may declare any charset) becomes
    U+FFFD: nothing downstream, the index included, could hold it."""
    return {k: replace_surrogates(str(val)) for k, val in (await request.post()).items()
            if isinstance(val, str)}


def action(back: Callable[[web.Request, dict[str, str]], str]) -> Callable[
        [ActionFn], Callable[[web.Request], Awaitable[web.StreamResponse]]]:
    """A form's POST: CSRF checked, then the action; its outcome is the flash message of the
    page it goes back to (`back`), or, for a token without a session, an error page."""
    def wrap(fn: ActionFn) -> Callable[[web.Request], Awaitable[web.StreamResponse]]:
        async def run(request: web.Request, v: Visitor) -> web.StreamResponse:
            form = await read_form(request)
            check_csrf(request, v, form)
            target = back(request, form)
            try:
                return await fn(request, v, form)
            except ForgeError as exc:
                failed: VaultmailError = _forge_error(exc)
            except VaultmailError as exc:
                failed = exc
            if v.session is None:
                return error_page(request, failed, v)
            await sessions.set_flash(request.app[SERVICES_KEY].store, v.session,
                                     {"kind": "error", "text": failed.message})
            raise web.HTTPSeeOther(target)
        return signed_in(run)
    return wrap


async def done(v: Visitor, target: str, text: str) -> web.StreamResponse:
    """After a form: back to `target`, saying what happened."""
    if v.session is not None:
        await sessions.set_flash(v.services.store, v.session, {"kind": "ok", "text": text})
    raise web.HTTPSeeOther(target)
