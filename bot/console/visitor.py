"""Who is looking at a console page: a signed-in session, or an API token (`Bearer`).

Each request becomes a tool `Call` of that principal (`bot.tools.http.make_call`), so every page
reads and writes through the tools and the shared visibility check, exactly as the tools do.
The console is for the office's people: an agent's token or account is turned away with why.
"""

from __future__ import annotations

import hmac
import secrets
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from urllib.parse import quote

from aiohttp import web

from bot.app import cookies
from bot.app.bodies import json_response
from bot.app.peers import client_key, reached_at
from bot.app.services import SERVICES_KEY, Services
from bot.console import sessions
from bot.errors import Denied, Unauthenticated
from bot.office.config import Human, Office
from bot.store import api_tokens
from bot.tools.http import authenticate, bearer_key, make_call
from bot.tools.registry import Call

COOKIE = "vaultmail_session"
PRE_COOKIE = "vaultmail_signin"  # before a session: the sign-in form's CSRF and OAuth state
TOKEN_LOGIN = "token-sha256:"  # a token session's login: the hash of the token it signed in with
CONSOLE = "/console"


class NotSignedIn(Exception):
    """No session and no token: the browser is sent to sign in."""


@dataclass
class Visitor:
    call: Call
    human: Human
    session: sessions.Session | None  # None: an API token in `Authorization: Bearer`
    login: str  # what they signed in with: a forge login, or TOKEN_LOGIN and a token's hash

    @property
    def principal(self) -> str:
        return self.call.principal

    @property
    def services(self) -> Services:
        return self.call.services

    @property
    def csrf(self) -> str:
        return self.session.csrf if self.session else ""


def person_of(call: Call) -> Human:
    """The office's person a call is made by; agents and others are turned away."""
    kind, _, ident = call.principal.partition(":")
    human = call.office.human(ident) if kind == "human" else None
    if human is None:
        raise Denied(f"the console is for the office's people, and {call.principal} is not one "
                     "of them; an agent uses the tools (MCP or /api/v1/tools)", code="not_a_person")
    return human


async def visitor(request: web.Request) -> Visitor:
    """The visitor of `request`, or NotSignedIn."""
    services = request.app[SERVICES_KEY]
    header = request.headers.get("Authorization")
    if header:
        owner = await authenticate(services, header,
                                   client_key(request, services.settings.trusted_proxies))
        call = await make_call(services, owner.principal, bearer_key(header), owner.org)
        return Visitor(call, person_of(call), None,
                       TOKEN_LOGIN + api_tokens.token_hash(bearer_key(header) or ""))
    value = get_cookie(request, COOKIE)
    session = await sessions.get(services.store, value) if value else None
    if session is None:
        raise NotSignedIn()
    if session.org is None:
        # signed in with a token of no office before sign-in pinned it: its office was looked
        # up again at each page (another office's person of the same name, or none); it ends,
        # and the person signs in again (which pins the token)
        await sessions.end(services.store, session)
        raise NotSignedIn()
    try:
        call = await make_call(services, session.principal, None, session.org)
    except Denied:  # taken out of the office since: the session ends with it
        await sessions.end(services.store, session)
        raise
    if not await _still_theirs(services, call, session):
        # the forge account that signed in is no longer this person's (the office gave the
        # person another login), or the API token it signed in with was revoked: the
        # session ends with it
        await sessions.end(services.store, session)
        raise NotSignedIn()
    return Visitor(call, person_of(call), session, session.login)


async def _still_theirs(services: Services, call: Call, session: sessions.Session) -> bool:
    """Whether what a session signed in with still stands for its principal."""
    if session.via == "forge":
        return await still_stands(services, call.office, call.principal, session.login)
    if session.via == "token":
        # (one from before its token was kept cannot tell whether that was revoked: it ends,
        # and the person signs in again)
        return session.login.startswith(TOKEN_LOGIN) and await still_stands(
            services, call.office, call.principal, session.login)
    return True


async def still_stands(services: Services, office: Office, principal: str,
                       login: str) -> bool:
    """Whether what someone signed in with (`login`: a forge login, or TOKEN_LOGIN and an API
    token's hash) still stands for `principal` of `office`: the forge login is still theirs in
    the office config (a login corrected or handed over: no longer), or the token is not
    revoked. A console session and an OAuth grant given from one both end with it."""
    if login.startswith(TOKEN_LOGIN):  # (no forge login has a colon)
        return await api_tokens.live_hash(services.store, login[len(TOKEN_LOGIN):])
    who = office.by_login(login)
    return who is not None and who.principal == principal


def check_csrf(request: web.Request, visitor: Visitor, form: dict[str, str]) -> None:
    """Every form a session posts carries its CSRF token (a field, or `X-CSRF-Token` from the
    page's script); an API token is not sent by the browser by itself, so it needs none."""
    if visitor.session is None:
        return
    given = form.get("csrf") or request.headers.get("X-CSRF-Token") or ""
    if not hmac.compare_digest(given.encode(), visitor.session.csrf.encode()):
        raise Denied("this form is stale or came from another site (its CSRF token does not "
                     "match your session): reload the page and send it again", code="csrf")


def looking_itself(request: web.Request, visitor: Visitor) -> bool:
    """Whether a GET is the person looking, so that it may mark what it shows read: a page of
    the console's own (`Sec-Fetch-Site: same-origin`) or an address they typed or bookmarked
    (`none`: no page sent them). SameSite=Lax sends the session cookie on a top-level
    navigation from any site, which marks nothing; neither does a browser that sends no
    Sec-Fetch-Site (it cannot tell the two apart), nor an image or a frame, same-origin or
    not: someone's words drawn on a console page may give one the console's own address. A
    browser never sends an API token by itself: that looks as the tools do."""
    if visitor.session is None:
        return True
    site, dest = request.headers.get("Sec-Fetch-Site"), request.headers.get("Sec-Fetch-Dest")
    if dest == "document":  # a page navigated to: from the console, or typed
        return site in ("same-origin", "none") and \
            request.headers.get("Sec-Fetch-Mode") == "navigate"
    # the page's own script (console.js) fetching a part; never an image or a frame whose
    # address someone's words gave on a console page (same-origin too)
    return dest == "empty" and site == "same-origin" and \
        request.headers.get("X-Requested-With") == "fetch"


# A GET that acts (opens a live stream, starts or ends a sign-in) is for a page navigated to
# (`Sec-Fetch-Dest: document`) or the console's own script (`empty`: its fetches and its
# EventSource, as Chromium sends them), or a client that sends no Sec-Fetch-Dest (a script, an
# old browser). Never for what a page fetches for its parts (an image, a frame, a style):
# `img-src 'self'` lets someone's words on a console page draw `![](/console/events)`, fetched
# with the reader's cookie, which held one of their live streams, or `![](/console/sign-in/
# forge)`, which spent a sign-in of their address and wrote over the OAuth state of theirs.
NAVIGATED_OR_FETCHED = frozenset({"document", "empty"})
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def not_for_a_part(handler: Handler) -> Handler:
    """`handler`, refused (403, nothing done) to a request a page makes for one of its parts."""
    async def checked(request: web.Request) -> web.StreamResponse:
        dest = request.headers.get("Sec-Fetch-Dest")
        if dest is None or dest in NAVIGATED_OR_FETCHED:
            return await handler(request)
        return web.Response(status=403, text=(
            f"{request.path} acts (a live stream, a sign-in), so it is for a page you open or "
            f"the console's own script, not for a page's {dest} (Sec-Fetch-Dest: {dest}); "
            f"someone's words on a page may name it. Nothing was done: open {CONSOLE}/inbox "
            "in your browser."), headers={"Cache-Control": "no-store",
                                          "X-Content-Type-Options": "nosniff"})
    return checked


def pre_session_token(request: web.Request) -> str:
    """The sign-in page's own token (a cookie and a field must match: no login CSRF)."""
    return get_cookie(request, PRE_COOKIE) or secrets.token_urlsafe(24)


def public_base(request: web.Request) -> str:
    """The app's URL: VAULTMAIL_PUBLIC_URL when set, else as the client reached it (through
    a trusted proxy: as that proxy says, `bot.app.peers.reached_at`)."""
    settings = request.app[SERVICES_KEY].settings
    if settings.public_url:
        return settings.public_url.rstrip("/")
    scheme, host = reached_at(request, settings.trusted_proxies)
    return f"{scheme}://{host}"


def secure(request: web.Request) -> bool:
    """Whether cookies go out `Secure`: the app is reached over https (VAULTMAIL_PUBLIC_URL, or
    as reached: a TLS request, or a trusted proxy's X-Forwarded-Proto behind one ending TLS)."""
    return public_base(request).startswith("https://") or request.secure


# Over https each of the console's cookies is `__Host-` (Secure, Path=/, no Domain), else the
# plain name on /console: `bot.app.cookies`, which the App set-up page's cookie shares.


def get_cookie(request: web.Request, name: str) -> str | None:
    """The cookie `name` as this app sets it: over https only its `__Host-` one."""
    return cookies.read(request, name, secure(request))


def set_cookie(response: web.StreamResponse, request: web.Request, name: str, value: str,
               max_age: int) -> None:
    cookies.put(response, name, value, tls=secure(request), path=CONSOLE, max_age=max_age)


def clear_cookie(response: web.StreamResponse, request: web.Request, name: str) -> None:
    """End the cookie `name` (with its own attributes: `cookies.drop`)."""
    cookies.drop(response, name, tls=secure(request), path=CONSOLE)


def sign_in_redirect(request: web.Request) -> web.HTTPSeeOther:
    return web.HTTPSeeOther(f"{CONSOLE}/sign-in?next={quote(request.path_qs, safe='')}")


def local_next(target: str | None) -> str:
    """Where to go after signing in: a console path only (never another site)."""
    if target and target.startswith(CONSOLE + "/") and not target.startswith("//") \
            and "\\" not in target and "\n" not in target and "\r" not in target:
        return target
    return f"{CONSOLE}/inbox"


def not_signed_in_json() -> web.Response:
    error = Unauthenticated("sign in at /console/sign-in, or send Authorization: Bearer <api "
                            "token>")
    return json_response(error.as_json(), status=error.status)
