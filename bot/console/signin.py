"""Signing in and out of the console.

With the forge account: GitHub's OAuth web flow (`bot.console.oauth`), the `state` kept in an
HTTP-only cookie until the forge sends the browser back. With an API token, on the embedded
default only (`Settings.token_sign_in`). Either way the person is found in the office config by
their forge login or token, and gets a session cookie (HTTP-only, SameSite=Lax; over https
Secure and `__Host-`: `visitor.set_cookie`). The sign-in form has its own CSRF token (cookie
and field must match), so no page elsewhere can sign a browser in as someone else.
"""

from __future__ import annotations

import hmac
import logging
import secrets
from urllib.parse import quote, unquote

from aiohttp import web

from bot.app.peers import PerAddress, client_key
from bot.app.services import SERVICES_KEY, Services
from bot.app.settings import Settings
from bot.console import oauth, sessions
from bot.console.frame import error_page, read_form
from bot.console.render import page
from bot.console.visitor import (
    CONSOLE,
    COOKIE,
    PRE_COOKIE,
    TOKEN_LOGIN,
    NotSignedIn,
    check_csrf,
    clear_cookie,
    get_cookie,
    local_next,
    not_for_a_part,
    person_of,
    pre_session_token,
    public_base,
    set_cookie,
    visitor,
)
from bot.errors import (
    Denied,
    ForgeUnavailable,
    TooManyRequests,
    Unauthenticated,
    VaultmailError,
    retry_headers,
)
from bot.names import RULE, is_name
from bot.store import api_tokens
from bot.tools.http import make_call, pinned, token_owner

log = logging.getLogger("vaultmail.console")
STATE_COOKIE = "vaultmail_oauth"
STATE_AGE = 600  # seconds to come back from the forge (its codes last 10 minutes too)
CALLBACK = f"{CONSOLE}/oauth/callback"
# the longest next= (URL-encoded) the state cookie carries: with the state, the verifier and
# an org (a forge name, at most 40 characters) well under the 4,096 bytes a browser keeps
MAX_NEXT = 2000
# forge sign-ins one address starts a minute, and codes it has the app trade at the forge (each
# a POST with the App's OAuth client credentials, which the forge counts against the App)
SIGN_INS_PER_MINUTE = 30
STARTS_KEY = web.AppKey("console_sign_in_starts", PerAddress)
TRADES_KEY = web.AppKey("console_code_trades", PerAddress)


def add_limits(app: web.Application) -> None:
    app[STARTS_KEY] = PerAddress(SIGN_INS_PER_MINUTE)
    app[TRADES_KEY] = PerAddress(SIGN_INS_PER_MINUTE)


def callback_url(request: web.Request) -> str:
    return public_base(request) + CALLBACK


def _forge_link(nxt: str, login: str | None = None, org: str | None = None) -> str:
    return (f"{CONSOLE}/sign-in/forge?next={quote(nxt, safe='')}"
            + (f"&login={quote(login, safe='')}" if login else "")
            + (f"&org={quote(org, safe='')}" if org else ""))


def _asked_login(request: web.Request) -> str:
    """The forge login a sign-in link suggests (`?login=`, as `vaultmail up` prints), or ""
    for anything that cannot be one: anyone's link may carry words, and none of them are
    shown on this site or sent on to the forge's sign-in page."""
    login = request.query.get("login", "")
    return login if is_name(login) else ""


def not_set_up(settings: Settings) -> str:
    """Why there is no sign-in with the forge, true of this forge: on GitHub the App's OAuth
    client is not set; on Gitea there is none to set (`oauth.enabled`), and people sign in
    with an API token instead."""
    if settings.dialect == "github":
        return ("Sign-in with the forge is not set up: the operator sets GITHUB_CLIENT_ID and "
                "GITHUB_CLIENT_SECRET (the App's OAuth client)")
    how = ("in the form below" if settings.token_sign_in else
           "sent as `Authorization: Bearer <token>` with each request (an admin makes one "
           "with `vaultmail token create PRINCIPAL --org ORG`)")
    return ("Sign-in with the forge is not set up on Gitea: it is GitHub's (an App's OAuth "
            f"client). Sign in with an API token {how}")


def _sign_in_page(request: web.Request, *, message: str | None = None, error: bool = False,
                  status: int = 200, offices: list[str] | None = None,
                  nxt: str | None = None, login: str | None = None,
                  retry_after: float | None = None) -> web.Response:
    services = request.app[SERVICES_KEY]
    token = pre_session_token(request)
    nxt = local_next(nxt if nxt is not None else request.query.get("next"))
    login = login if login is not None else _asked_login(request)
    response = page("sign_in.html", {
        "v": None, "current": "sign-in", "csrf": token, "next": nxt, "login": login,
        "forge": oauth.enabled(services.settings), "forge_link": _forge_link(nxt, login),
        "offices": [{"org": org, "link": _forge_link(nxt, login, org)}
                    for org in offices or []],
        "forge_web": services.settings.web_url, "tokens": services.settings.token_sign_in,
        "message": message, "error": error, "not_set_up": not_set_up(services.settings)},
        status=status)
    response.headers.update(retry_headers(status, retry_after))  # a 429 or 503: when again
    set_cookie(response, request, PRE_COOKIE, token, STATE_AGE)
    return response


def _over_limit(request: web.Request, key: web.AppKey[PerAddress]) -> web.Response | None:
    """The 429 page when the client's address is past its sign-ins for the minute."""
    limiter = request.app[key]
    if limiter.admit(client_key(request, request.app[SERVICES_KEY].settings.trusted_proxies)):
        return None
    return _sign_in_page(request, message=f"More than {SIGN_INS_PER_MINUTE} sign-ins with the "
                         "forge from your address within a minute: wait a minute, then sign "
                         "in again", error=True, status=429, retry_after=limiter.window)


async def sign_in_page(request: web.Request) -> web.StreamResponse:
    try:
        await visitor(request)
    except (NotSignedIn, VaultmailError):  # not signed in (or no longer): the page
        message = "You are signed out." if request.query.get("out") else None
        return _sign_in_page(request, message=message)
    raise web.HTTPSeeOther(local_next(request.query.get("next")))  # signed in already


async def _start_session(request: web.Request, services: Services, principal: str,
                         org: str, login: str, via: str, nxt: str) -> web.HTTPSeeOther:
    call = await make_call(services, principal, None, org)
    person_of(call)  # the console is for the office's people
    value, _ = await sessions.create(services.store, principal, org, login, via)
    response = web.HTTPSeeOther(local_next(nxt))
    set_cookie(response, request, COOKIE, value, int(sessions.LIFETIME))
    clear_cookie(response, request, PRE_COOKIE)
    clear_cookie(response, request, STATE_COOKIE)
    return response


async def token_sign_in(request: web.Request) -> web.StreamResponse:
    services = request.app[SERVICES_KEY]
    form = await read_form(request)
    if not services.settings.token_sign_in:
        return _sign_in_page(request, message="Sign-in with an API token is for the embedded "
                             "default only: sign in with your forge account", error=True,
                             status=403)
    expected = get_cookie(request, PRE_COOKIE) or ""
    if not expected or not hmac.compare_digest(form.get("csrf", "").encode(), expected.encode()):
        return _sign_in_page(request, message="This sign-in form is stale (its CSRF token does "
                             "not match): send it again", error=True, status=403)
    # an unknown token is counted against the client's address (and everyone's): past the
    # limit nothing is looked up (`bot.app.tries`); a success is not counted
    source = client_key(request, services.settings.trusted_proxies)
    token = form.get("token", "").strip()
    try:
        owner = await services.failed_tries.looked_up(source, "sign_in",
                                                      lambda: token_owner(services, token))
    except TooManyRequests as refused:
        return _sign_in_page(request, message=refused.message, error=True,
                             status=refused.status, retry_after=refused.retry_after)
    except Unauthenticated:
        return _sign_in_page(request, message="That API token is unknown or revoked: copy one "
                             "from tokens.json (api_tokens) or make one with `vaultmail token "
                             "create PRINCIPAL`", error=True, status=401)
    try:
        # a token from before offices is pinned here as at its first tool call: a session of
        # no office was looked up again at every page, and went to whichever office named the
        # principal then (another office's person of the same name), or to none
        org = await pinned(services, owner, token)
        # the session keeps the token's hash as its login: it ends when the token is revoked
        response = await _start_session(request, services, owner.principal, org,
                                        TOKEN_LOGIN + api_tokens.token_hash(token),
                                        "token", form.get("next", ""))
    except VaultmailError as exc:
        return _sign_in_page(request, message=exc.message, error=True, status=exc.status,
                             retry_after=exc.retry_after)
    raise response


@not_for_a_part  # (an image of it spent a sign-in, and wrote over the state cookie)
async def forge_start(request: web.Request) -> web.StreamResponse:
    """Off to the forge's authorize page, with a fresh `state` to check on the way back."""
    settings = request.app[SERVICES_KEY].settings
    if not oauth.enabled(settings):
        return _sign_in_page(request, message=not_set_up(settings), error=True, status=503)
    # what the state cookie carries back, bounded: a browser keeps no cookie past 4,096 bytes,
    # and without it the forge's return "did not start here" (the link's words never shown)
    nxt = local_next(request.query.get("next"))
    if len(carried := quote(nxt, safe="")) > MAX_NEXT:
        return _sign_in_page(request, message=f"This sign-in link's next= (the page to open "
                             f"once signed in) is {len(carried):,} characters, more than the "
                             f"{MAX_NEXT:,} a sign-in with the forge carries: sign in here "
                             "(you land on your inbox), then open that page again", error=True,
                             status=400, nxt="")
    # the office chosen (when a login is in several), kept with the state: only an office
    # that lists the login the forge signs in is ever used
    org = request.query.get("org") or ""
    if org and not is_name(org):
        return _sign_in_page(request, message=f"This sign-in link's org= is not an "
                             f"organisation's name on a forge ({RULE}): sign in here, and "
                             "choose your office then if you are in several", error=True,
                             status=400, nxt=nxt)
    if (refused := _over_limit(request, STARTS_KEY)) is not None:
        return refused
    state, verifier = secrets.token_urlsafe(24), secrets.token_urlsafe(48)
    login = _asked_login(request) or None
    response = web.HTTPSeeOther(oauth.authorize_url(settings, callback_url(request), state,
                                                    verifier, login))
    set_cookie(response, request, STATE_COOKIE, f"{state}:{verifier}:{org.lower()}:{carried}",
               STATE_AGE)
    raise response


async def offices_of_login(services: Services, login: str,
                           chosen: str | None = None) -> list[tuple[str, str]]:
    """(principal, org) of every installed office whose config lists the forge login (an
    office whose config cannot be read now is left out; the one `chosen`, when it is that
    office: ForgeUnavailable, try again)."""
    offices, unread = await services.read_offices()
    if chosen and chosen.lower() in unread:
        raise ForgeUnavailable(f"{chosen}'s office config cannot be read now: sign in again "
                               "in a minute")
    found = []
    for org, office in offices:
        if (who := office.by_login(login)) is not None:
            found.append((who.principal, org))
    return found


class ChooseOffice(Exception):
    """The login is a person of several offices and none was chosen: they choose."""

    def __init__(self, orgs: list[str]) -> None:
        self.orgs = orgs


async def _person_for_login(services: Services, login: str,
                            chosen: str | None) -> tuple[str, str]:
    """The office principal of a forge login, and its org: the office that lists it; when
    several do, the one chosen (never silently the first)."""
    found = await offices_of_login(services, login, chosen)
    if chosen:
        found = [(p, org) for p, org in found if org == chosen]
    if not found:
        where = f"the office of {chosen}'s people" if chosen else "the office's people"
        raise Denied(f"the forge account {login} is not one of {where}: an admin adds it to "
                     "humans in vaultmail.yml (with its login)", code="not_a_person")
    if len(found) > 1:
        raise ChooseOffice([org for _, org in found])
    return found[0]


OAUTH_ERRORS = frozenset({"invalid_request", "unauthorized_client", "access_denied",
                          "unsupported_response_type", "invalid_scope", "server_error",
                          "temporarily_unavailable"})


@not_for_a_part  # (the forge sends the browser here: a page)
async def forge_callback(request: web.Request) -> web.StreamResponse:
    services = request.app[SERVICES_KEY]
    q = request.query
    kept = get_cookie(request, STATE_COOKIE) or ""
    state, _, rest = kept.partition(":")
    verifier, _, rest = rest.partition(":")
    chosen, _, nxt = rest.partition(":")
    if not state or not hmac.compare_digest(q.get("state", "").encode(), state.encode()):
        return _sign_in_page(request, message="This sign-in did not start here, or took longer "
                             "than 10 minutes: sign in again", error=True, status=403)
    if q.get("error"):  # the person said no, or the forge refused
        # anyone can link here with an error: its description is never shown on this site, and
        # the code only when it is one of OAuth's own (RFC 6749 4.1.2.1)
        code = f" ({q['error']})" if q["error"] in OAUTH_ERRORS else ""
        return _sign_in_page(request, message=f"The forge did not sign you in{code}: sign in "
                             "again", error=True, status=401)
    code = q.get("code", "")
    if not code:
        return _sign_in_page(request, message="The forge sent no code back: sign in again",
                             error=True, status=400)
    # the state proves nothing of the visitor (anyone gets one, or writes the cookie): what
    # bounds the forge requests a stranger makes the app send is this limit
    if (refused := _over_limit(request, TRADES_KEY)) is not None:
        return refused
    try:
        login, user_id = await oauth.sign_in(services.settings, code, callback_url(request),
                                             verifier)
        principal, org = await _person_for_login(services, login, chosen or None)
        if not await services.same_account(org, principal, login, user_id):
            raise Denied(f"the forge account {login} is not the one {org}'s office knows by "
                         "that login (the login has changed hands since): an admin of "
                         f"{org} gives {principal} its new login in vaultmail.yml",
                         code="another_account")
        response = await _start_session(request, services, principal, org, login, "forge",
                                        unquote(nxt))
    except ChooseOffice as choice:
        return _sign_in_page(request, offices=choice.orgs, nxt=unquote(nxt), login=login,
                             message=f"{login} is in the offices of {', '.join(choice.orgs)}: "
                                     "choose one")
    except oauth.SignInFailed as exc:
        log.info("console sign-in failed", extra={"reason": str(exc)})
        return _sign_in_page(request, message=str(exc), error=True, status=401)
    except VaultmailError as exc:
        return _sign_in_page(request, message=exc.message, error=True, status=exc.status,
                             retry_after=exc.retry_after)
    raise response


async def sign_out(request: web.Request) -> web.StreamResponse:
    services = request.app[SERVICES_KEY]
    try:
        v = await visitor(request)
    except (NotSignedIn, VaultmailError):  # nobody signed in: nothing to end
        raise web.HTTPSeeOther(f"{CONSOLE}/sign-in?out=1") from None
    form = await read_form(request)
    try:
        check_csrf(request, v, form)
    except Denied as exc:
        return error_page(request, exc, v)
    if v.session is not None:
        await sessions.end(services.store, v.session)
    response = web.HTTPSeeOther(f"{CONSOLE}/sign-in?out=1")
    clear_cookie(response, request, COOKIE)
    raise response
