"""The tools over HTTP: POST /api/v1/tools/<name>, JSON in and out, Bearer API tokens."""

from __future__ import annotations

import asyncio
import contextvars
import logging
from collections.abc import Awaitable
from dataclasses import replace
from typing import Any, TypeVar

from aiohttp import web

from bot.app.bodies import TOOL_BODY_LIMIT, json_response, loads_json, read_body
from bot.app.notify import AnswerCopy
from bot.app.peers import client_key
from bot.app.services import SERVICES_KEY, Services
from bot.errors import (
    Denied,
    ForgeUnavailable,
    Unauthenticated,
    VaultmailError,
    forge_refusal,
    refusal_headers,
    retry_headers,
)
from bot.forge.errors import ForgeError
from bot.office.config import Office
from bot.store import api_tokens, ledger, oauth
from bot.store.engines import index_unavailable, unavailable
from bot.tools import chat_tools as _chat_tools  # noqa: F401
from bot.tools import comment_tools as _comment_tools  # noqa: F401
from bot.tools import ledger_tools as _ledger_tools  # noqa: F401
from bot.tools import mail_tools as _mail_tools  # noqa: F401  (registers the tools)
from bot.tools.polls import token_key
from bot.tools.registry import TOOLS, Call, call_tool

log = logging.getLogger("vaultmail.tools")
T = TypeVar("T")


async def authenticate(services: Services, header: str | None,
                       source: str | None = None) -> api_tokens.Owner:
    """The owner of the request's API token. `source`: the client's address (`client_key`),
    whose unknown tokens are counted and, past the limit, refused unlooked-up
    (`bot.app.tries`); None for a token already taken once (a long poll's recheck)."""
    if not header or not header.startswith("Bearer "):
        raise Unauthenticated("send Authorization: Bearer <api token> "
                              "(`vaultmail token create PRINCIPAL` makes one)")
    token = header[7:].strip()
    owner = await services.failed_tries.looked_up(source, "bearer",
                                                  lambda: token_owner(services, token))
    return replace(owner, org=await pinned(services, owner, token))


async def token_owner(services: Services, token: str) -> api_tokens.Owner:
    """The owner of API token `token`; Unauthenticated when it is unknown or revoked."""
    owner = await api_tokens.owner_of(services.store, token)
    if owner is None:
        raise Unauthenticated("this API token is unknown or revoked")
    return owner


async def pinned(services: Services, owner: api_tokens.Owner, token: str) -> str:
    """The office of `owner`'s `token`: a token from before offices is pinned to the one
    office it is in at its first use, whatever the use (a tool call, a console sign-in), so
    that an office that later declares a principal of the same name can neither take what it
    opens over nor make it ambiguous. Where another first use pinned it meanwhile (having
    worked out another office: a config changed between them), the office it pinned."""
    if owner.org is not None:
        return owner.org
    return await api_tokens.pin_office(services.store, token,
                                       await office_org(services, owner.principal))


def bearer_key(header: str | None) -> str | None:
    """The `polls.token_key` of an `Authorization: Bearer` header (after `authenticate`)."""
    return token_key(header[7:].strip()) if header and header.startswith("Bearer ") else None


def members(office: Office) -> set[str]:
    return {"office"} | {h.principal for h in office.humans} | {
        a.principal for a in office.agents}


async def office_org(services: Services, principal: str) -> str:
    """The org of the one office that has `principal` (a token that names no org)."""
    await services.follow_index()  # (an org installed that another replica heard of)
    if (org := services.default_org) is not None:
        # the one office, where it has the principal: asked before the token is pinned, so a
        # refused use pins it nowhere (pinned, `make_call` refused it there and revoked it)
        office = await services.offices.get(services.forge_for_org(org), org)
        if office is None:
            raise VaultmailError(services.offices.why_none(org), code="no_office")
        if principal not in members(office):
            reason = (f"{principal} is not in the office config of {org}, the one office "
                      "here: an admin adds it to vaultmail.yml, or makes a token of someone "
                      "who is (`vaultmail token create PRINCIPAL`)")
            await ledger.record(services.store, "run.denied", principal, "tool call",
                                {"reason": reason}, org=org)
            raise Denied(reason, ledgered=True)
        return org
    if not services.installations:
        raise services.not_installed("the App is not installed on any organisation yet: "
                                     "install it, then call again")
    offices, unread = await services.read_offices()
    found = [org for org, office in offices if principal in members(office)]
    if unread:  # (one found among those read may not be the one: the token is pinned for good)
        raise ForgeUnavailable(f"the config of {', '.join(unread)} cannot be read now, so "
                               f"which office {principal} is in is not known: try again "
                               f"later, or make a token for one office with `vaultmail token "
                               f"create {principal} --org ORG`")
    if len(found) != 1:
        where = "no office" if not found else "the offices of " + ", ".join(found)
        raise Denied(
            f"{principal} is in {where} of the organisations the App is installed on; make a "
            f"token for one office with `vaultmail token create {principal} --org ORG`",
            code="no_office")
    return found[0]


async def make_call(services: Services, principal: str, token: str | None = None,
                    org: str | None = None, *, woken_by: str | None = None) -> Call:
    """The call's context: the caller's office (its token's org, else the one office that
    has it) and that org's installation (503 naming the org when the App is not there);
    `woken_by`: the mail whose run the token is for (`api_tokens.Owner`)."""
    org = org or await office_org(services, principal)
    await services.still_installed(org)
    forge = services.forge_for_org(org)
    office = await services.offices.get(forge, org)
    if office is None:
        raise VaultmailError(services.offices.why_none(org), code="no_office")
    if principal not in members(office):
        # every token of theirs in this office ends now, not only this one: adding them back
        # later must not bring any of them back to life
        await api_tokens.revoke_principal(services.store, principal, org)
        await oauth.revoke_principal(services.store, principal, org)  # and its MCP sign-ins
        reason = (f"{principal} is not in the office config any more; its tokens are revoked "
                  "(an admin who adds it back to vaultmail.yml makes it a new one)")
        await ledger.record(services.store, "run.denied", principal, "tool call",
                            {"reason": reason}, org=org)
        raise Denied(reason, ledgered=True)
    return Call(services, principal, office, forge, token_key=token, woken_by=woken_by)


async def bearer_call(services: Services, header: str | None, source: str | None) -> Call:
    """The call of the request's API token (`authenticate`, then `make_call`). A long poll of
    it asks again whether the token is live when it wakes (`Call.recheck`, `_still_live`)."""
    owner = await authenticate(services, header, source)
    call = await make_call(services, owner.principal, bearer_key(header), owner.org,
                           woken_by=owner.woken_by)
    hashed = api_tokens.token_hash(str(header)[7:].strip())
    call.recheck = lambda: _still_live(services, hashed)
    return call


# the rechecks asked in this turn of the loop, per app: one wake-up ends many polls, and they
# ask together (one read), and go on together, as they share one look at the inbox. Each poll
# waits on a future of its own, answered by the read: a poll that goes (its client gone)
# cancels only its own, and the read's answer resumes each poll itself (a shared future
# shielded for each poll took two turns of the loop a poll, through the shield)
_RECHECKS: dict[int, list[tuple[str, asyncio.Future[bool]]]] = {}


async def _still_live(services: Services, hashed: str) -> None:
    """A woken long poll's token is still live, else Unauthenticated. Live is all there is to
    ask again: a token revoked, expired, or of a principal the office config no longer names
    (whose tokens are revoked as the config is taken: `make_call`, `office_departed`) is not.
    The polls one wake-up ends ask in one read, and are answered in one turn: each asking on
    its own, they went on each at its own time and no longer shared their look at the inbox
    (1,000 polls woken together: the last answered 0.15-0.39 s after the wake-up, not
    0.08-0.12 s)."""
    loop = asyncio.get_running_loop()
    key = id(services)
    asked = _RECHECKS.get(key)
    if asked is None:
        asked = _RECHECKS[key] = []
        loop.call_soon(_ask_live, services, key)
    live: asyncio.Future[bool] = loop.create_future()
    asked.append((hashed, live))
    if not await live:
        raise Unauthenticated("this API token was revoked or has expired while the call "
                              "waited (or its principal left the office): nothing is shown")


def _ask_live(services: Services, key: int) -> None:
    """The read for the rechecks asked in the turn before (`_still_live`)."""
    asked = _RECHECKS.pop(key)

    async def ask() -> None:
        try:
            live = await api_tokens.live_hashes(services.store, {h for h, _ in asked})
        except Exception as exc:  # (the index away: each poll is told, as for any read)
            for _, answer in asked:
                if not answer.done():  # (done: cancelled, its poll gone)
                    answer.set_exception(exc)
                    answer.exception()  # (taken: its poll may go before it reads it)
            return
        for hashed, answer in asked:
            if not answer.done():
                answer.set_result(hashed in live)

    background = asyncio.ensure_future(ask())
    _ASKING.add(background)
    background.add_done_callback(_ASKING.discard)


_ASKING: set[asyncio.Future[None]] = set()  # (held: a task no one holds may be collected)


DISCONNECT_CHECK = 0.5  # seconds between checks that a long-polling client is still there


async def client_gone(request: web.Request) -> None:
    """Return once the client has closed its connection (aiohttp does not cancel handlers)."""
    while True:
        transport = request.transport
        if transport is None or transport.is_closing():
            return
        await asyncio.sleep(DISCONNECT_CHECK)


def long_poll(raw: object) -> bool:
    """A call with `wait` may sleep; only such calls are cancelled when the client leaves
    (the others run to the end, so a write is never cut in half)."""
    return isinstance(raw, dict) and bool(raw.get("wait"))


class _Held:
    """A long poll's work and its request, while `unless_gone` waits for it."""

    __slots__ = ("gone", "request", "work")

    def __init__(self, request: web.Request, work: asyncio.Future[Any]) -> None:
        self.request, self.work, self.gone = request, work, False


# The long polls held on each event loop, and the one task there that looks every
# DISCONNECT_CHECK whether their clients are still there (while any is held). One task for all,
# not one beside each poll: 1,000 polls woken together each cancelled its own watcher, one
# more turn of the loop a poll before it was answered, and 1,000 held made 2,000 wake-ups a
# second doing nothing (bench.polls_profile).
_HELD: dict[asyncio.AbstractEventLoop, set[_Held]] = {}


async def _watch_held(loop: asyncio.AbstractEventLoop, held: set[_Held]) -> None:
    try:
        while True:
            await asyncio.sleep(DISCONNECT_CHECK)
            if not held:
                return
            for one in list(held):
                transport = one.request.transport
                if transport is None or transport.is_closing():
                    one.gone = True
                    one.work.cancel()
    finally:
        if _HELD.get(loop) is held:
            del _HELD[loop]


async def unless_gone(request: web.Request, work: Awaitable[T]) -> T | None:
    """Run `work`; cancel it (and return None) if the client goes away first (seen within
    DISCONNECT_CHECK, as `client_gone` sees it)."""
    task = asyncio.ensure_future(work)
    loop = asyncio.get_running_loop()
    held = _HELD.get(loop)
    if held is None:
        held = _HELD[loop] = set()
        # (its own context: nothing of the first poll's is the watcher's)
        watcher = loop.create_task(_watch_held(loop, held), context=contextvars.Context())
        _WATCHING.add(watcher)
        watcher.add_done_callback(_WATCHING.discard)
    one = _Held(request, task)
    held.add(one)
    try:
        return await task  # (this handler cancelled: so is the work, and it waits for it)
    except asyncio.CancelledError:
        current = asyncio.current_task()
        if one.gone and (current is None or not current.cancelling()):
            return None  # the client went away (not this handler cancelled): nobody to answer
        raise
    finally:
        held.discard(one)


_WATCHING: set[asyncio.Task[None]] = set()  # (held: a task no one holds may be collected)


async def tool_endpoint(request: web.Request) -> web.Response:
    services = request.app[SERVICES_KEY]
    name = request.match_info["name"]
    try:
        header = request.headers.get("Authorization")
        call = await bearer_call(services, header,
                                 client_key(request, services.settings.trusted_proxies))
        try:
            data = await read_body(request, TOOL_BODY_LIMIT, "the request body")
            raw = loads_json(data) if data.strip() else {}  # nesting over 64: 400 bad_json
        except ValueError as exc:  # not JSON, not UTF-8, or a number of over 4300 digits
            raise VaultmailError(f"the body is not JSON: {exc}", code="bad_json") from exc
        work = call_tool(call, name, raw)
        if not long_poll(raw):
            result = await work
        elif (polled := await unless_gone(request, work)) is not None:
            result = polled
        else:  # the client gave up on its long poll and went away: nobody to answer
            return web.Response(status=499)
    except VaultmailError as exc:
        if exc.code != "too_many_failures":  # (logged once, at the limit: `bot.app.tries`)
            log.info("tool refused", extra={"tool": name, "code": exc.code,
                                            "reason": exc.message})
        return json_response(exc.as_json(), status=exc.status,
                             headers=refusal_headers(exc))
    except ForgeError as exc:  # the forge refused or failed: say so, never a stack trace
        log.warning("tool failed at the forge", extra={"tool": name, "error": str(exc)})
        failed = forge_refusal(exc, name, "nothing was recorded")
        return json_response(failed.as_json(), status=failed.status,
                             headers=refusal_headers(failed))
    except Exception as exc:
        if unavailable(exc):  # the index is away (a restart, a failover): try again shortly
            log.warning("tool refused: the index is unavailable",
                        extra={"tool": name, "error": repr(exc)})
            return json_response(index_unavailable(name).as_json(), status=503,
                                 headers=retry_headers(503))
        log.exception("tool crashed", extra={"tool": name})
        return json_response({"error": {"code": "internal", "message": (
            f"{name} failed inside vaultmail; the app's log has the details")}}, status=500)
    if isinstance(result, AnswerCopy):  # (an answer polls woken together share: its JSON
        # text is made once for all; the same bytes and headers as json_response's)
        return web.Response(body=result.json_bytes(), content_type="application/json",
                            charset="utf-8")
    return json_response(result)


async def list_tools(request: web.Request) -> web.Response:
    return json_response({"tools": [t.listing() for t in TOOLS.values()]})


def add_routes(app: web.Application) -> None:
    app.router.add_post("/api/v1/tools/{name}", tool_endpoint)
    app.router.add_get("/api/v1/tools", list_tools)
