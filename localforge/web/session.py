"""Who is signed in to the forge's web pages: the one answer every web route asks for.

A browser signs in on `/login` and carries the `user_session` cookie (HttpOnly, SameSite=Lax,
Secure over https; two weeks on the forge clock, ended on the forge by signing out). A script
sends `Authorization: token <PAT>` (or `Bearer`, or a user access token) instead and is that
user for the one request. Forms carry an `authenticity_token` equal to the `_forge_csrf` cookie
(double submit); a request signed with a header has no ambient credential and needs none.
"""

from __future__ import annotations

import hmac
import secrets
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal
from urllib.parse import urlsplit

from aiohttp import web

from ..access import Principal
from ..state import WebSession
from .html import WebError

if TYPE_CHECKING:
    from ..forge import LocalForge

SESSION_COOKIE = "user_session"
CSRF_COOKIE = "_forge_csrf"
SESSION_TTL = 14 * 86400.0
WEB_FORGE_KEY: web.AppKey[LocalForge] = web.AppKey("web_forge")


@dataclass(frozen=True)
class Viewer:
    """The person a web request comes from (login None: nobody signed in)."""

    principal: Principal
    via: Literal["session", "header", "none"]

    @property
    def login(self) -> str | None:
        return self.principal.login if self.principal.kind == "user" else None


VIEWER_KEY: web.RequestKey[Viewer] = web.RequestKey("viewer", Viewer)
NEW_CSRF_KEY: web.RequestKey[str] = web.RequestKey("new_csrf", str)


def forge_of(request: web.Request) -> LocalForge:
    return request.app[WEB_FORGE_KEY]


def _from_header(forge: LocalForge, header: str) -> Principal:
    from ..github.auth import authenticate  # the forge's one reading of credentials
    from ..github.http import ApiError

    try:
        principal = authenticate(forge, header)
    except ApiError as exc:
        raise WebError(401, "Bad credentials", "The Authorization header names no valid "
                       "token of this forge: send `Authorization: token <personal access "
                       "token>`, or sign in.") from exc
    if principal.kind != "user":
        raise WebError(401, "Bad credentials", "Only a user's token signs in to the web "
                       "pages (not an App's JWT or an installation token).")
    return principal


def session_of(forge: LocalForge, request: web.Request) -> WebSession | None:
    sid = request.cookies.get(SESSION_COOKIE)
    if not sid:
        return None
    sessions = forge.state.web.sessions
    sess = sessions.get(sid)
    if sess is None:
        return None
    if forge.clock.now() >= sess.expires_at or forge.state.account(sess.login) is None:
        sessions.pop(sid, None)
        return None
    return sess


def viewer(request: web.Request, forge: LocalForge | None = None) -> Viewer:
    """Who is signed in: `Authorization` first (scripts), then the session cookie. A bad
    header is a 401, not a silent sign-out."""
    cached: Viewer | None = request.get(VIEWER_KEY)
    if cached is not None:
        return cached
    forge = forge or forge_of(request)
    header = request.headers.get("Authorization")
    if header:
        found = Viewer(_from_header(forge, header), "header")
    elif (sess := session_of(forge, request)) is not None:
        acct = forge.state.account(sess.login)
        assert acct is not None
        found = Viewer(Principal(kind="user", login=acct.login), "session")
    else:
        found = Viewer(Principal(kind="none"), "none")
    request[VIEWER_KEY] = found
    return found


def signed_in(forge: LocalForge, request: web.Request) -> str | None:
    """The login signed in to the forge's web pages (session cookie or `Authorization`), or
    None: for any web route of the forge, in whatever module it lives."""
    try:
        return viewer(request, forge).login
    except WebError:
        return None


# -- sessions --------------------------------------------------------------------------------
def start_session(forge: LocalForge, request: web.Request, resp: web.StreamResponse,
                  login: str) -> None:
    """Sign `login` in: a new session id (any older one of this browser is ended)."""
    end_session(forge, request, None)
    now = forge.clock.now()
    sid = secrets.token_urlsafe(32)
    forge.state.web.sessions[sid] = WebSession(id=sid, login=login, created_at=now,
                                               expires_at=now + SESSION_TTL)
    resp.set_cookie(SESSION_COOKIE, sid, max_age=int(SESSION_TTL), path="/", httponly=True,
                    samesite="Lax", secure=request.secure)
    forge.save()


def end_session(forge: LocalForge, request: web.Request,
                resp: web.StreamResponse | None) -> None:
    sid = request.cookies.get(SESSION_COOKIE)
    if sid:
        forge.state.web.sessions.pop(sid, None)
    if resp is not None:
        resp.del_cookie(SESSION_COOKIE, path="/")
    request.pop(VIEWER_KEY, None)


# -- forms -----------------------------------------------------------------------------------
def csrf_token(request: web.Request) -> str:
    """The token a form of this page carries (the cookie's value, made on first use)."""
    token = request.cookies.get(CSRF_COOKIE) or request.get(NEW_CSRF_KEY)
    if not token:
        token = secrets.token_urlsafe(24)
        request[NEW_CSRF_KEY] = token
    return token


def set_new_csrf(request: web.Request, resp: web.StreamResponse) -> None:
    token = request.get(NEW_CSRF_KEY)
    if token:
        resp.set_cookie(CSRF_COOKIE, token, path="/", httponly=True, samesite="Lax",
                        secure=request.secure)


def check_csrf(request: web.Request, form_value: object) -> None:
    if viewer(request).via == "header":
        return
    cookie = request.cookies.get(CSRF_COOKIE, "")
    sent = form_value if isinstance(form_value, str) else ""
    if not cookie or not sent or not hmac.compare_digest(cookie, sent):
        raise WebError(422, "Unprocessable Entity", "The form's authenticity token is missing "
                       "or wrong (was the page open in another browser, or its cookies "
                       "cleared?): reload the page and submit it again.")


def csrf_field(request: web.Request) -> str:
    from .html import h

    return f'<input type="hidden" name="authenticity_token" value="{h(csrf_token(request))}">'


def safe_return_to(value: object) -> str:
    """A place on this forge to go back to; anything else (another site) is `/`."""
    if not isinstance(value, str) or not value.startswith("/") or value.startswith("//"):
        return "/"
    if "\\" in value or any(ord(c) < 32 for c in value):
        return "/"
    parts = urlsplit(value)
    return value if not parts.scheme and not parts.netloc else "/"
