"""Remote MCP clients sign in with OAuth 2.1: vaultmail is the authorisation server of its own
MCP endpoint.

* `/.well-known/oauth-authorization-server` (RFC 8414) says where everything is; the
  protected-resource metadata of /mcp (RFC 9728) names this server in `authorization_servers`.
* `POST /oauth/register` (RFC 7591): a client registers itself. Every client is public
  (`token_endpoint_auth_method` "none": PKCE is its proof); its redirect URIs are https, or
  http on a loopback address (RFC 8252), and are matched exactly, but for the port of a
  loopback address (127.0.0.1, [::1]), which may be any (RFC 8252 §7.3). An address registers
  at most REGISTRATIONS_PER_HOUR clients an hour; clients never allowed are pruned after a day
  (`bot.store.prune`).
* `GET /oauth/authorize`: the client, its redirect URI, PKCE (S256 only; `plain` and none are
  refused) and the resource (RFC 8707: this app's /mcp, nothing else) are checked, the request
  is kept, and the browser goes on to the console's consent page, `/console/authorize`. Any
  of those wrong is a page here, never a redirect: anyone may register a client, so a redirect
  to a registered URI with an error would be an open redirect (RFC 9700 §4.11.2). There
  the person signs in exactly as to the console (the forge's OAuth web flow, or an API token on
  the embedded default) unless they already are, sees which client asks to act as them in
  which office, and allows or denies. Allowing sends the browser back to the client with a
  code (good once, for a minute) and `iss` (RFC 9207).
* `POST /oauth/token`: `authorization_code` (with the PKCE `code_verifier`, the same
  `redirect_uri`, client and resource) and `refresh_token` (issued and taken only for a client
  whose registered `grant_types` name it; rotated: each refresh token is good once; used
  twice, the whole grant is revoked, as is everything a replayed code led to).
  Only an exchange with the right client, redirect URI and verifier spends a code (or, spent
  already, revokes its grant): one who merely saw it can do neither. An access token lasts an
  hour; the grant, whatever is refreshed, thirty days from the consent. A refresh is refused,
  and the grant revoked, once the person is no longer in the office; removing them from the
  office config revokes their grants there at once (`bot.store.oauth.revoke_principal`), as
  it does their API tokens: added back, they sign in again.

Every value handed out is kept hashed (`bot.store.oauth`) with the person, the office (org)
they signed in to, and the resource. The MCP endpoint takes an access token only for itself,
and acts as its person in its office only (`bot.tools.http.make_call` with the org), so a
token of one office never acts in another. The tool endpoints and the console take API tokens
only: an access token is for /mcp.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import ipaddress
import logging
import re
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import SplitResult, parse_qsl, unquote, urlencode, urlsplit, urlunsplit

from aiohttp import web

from bot.app.bodies import json_response, loads_json, read_body
from bot.app.peers import PerAddress, client_key
from bot.app.services import SERVICES_KEY, Services
from bot.console.frame import error_page, read_form
from bot.console.render import SECURITY_HEADERS, page
from bot.console.visitor import (
    CONSOLE,
    NotSignedIn,
    Visitor,
    check_csrf,
    not_for_a_part,
    public_base,
    sign_in_redirect,
    still_stands,
    visitor,
)
from bot.errors import (
    Denied,
    NotInstalled,
    PayloadTooLarge,
    Unauthenticated,
    VaultmailError,
    retry_headers,
)
from bot.office.config import Office
from bot.store import api_tokens, ledger
from bot.store import oauth as db
from bot.tools.http import make_call

log = logging.getLogger("vaultmail.oauth")

AS_METADATA_PATH = "/.well-known/oauth-authorization-server"
REGISTER = "/oauth/register"
AUTHORIZE = "/oauth/authorize"
TOKEN = "/oauth/token"
CONSENT = f"{CONSOLE}/authorize"

ACCESS_PREFIX, REFRESH_PREFIX, CODE_PREFIX, CLIENT_PREFIX = "vmoa_", "vmor_", "vmoc_", "vmcl_"
LIFETIMES = {
    "request": 600.0,  # seconds to sign in and consent
    "code": 60.0,  # to trade the code for tokens
    "access": 3600.0,
    "refresh": 30 * 86_400.0,
    "grant": 30 * 86_400.0,  # from the consent, however often refreshed
}
REGISTRATION_LIMIT = 16 * 1024  # bytes of client metadata
MAX_REDIRECT_URIS = 10
MAX_URI = 2000  # characters of one redirect URI
MAX_STATE = 512  # characters of a client's `state` (kept until the consent)
REGISTRATIONS_PER_HOUR = 20  # clients one address registers within an hour
AUTHORIZE_PER_MINUTE = 30  # sign-in requests one address starts (each kept in the index)
LOOPBACK_NAMES = {"localhost"}
URI_CHARACTERS = re.compile(r"[A-Za-z0-9\-._~:/?#\[\]@!$&'()*+,;=%]+")
HOST = re.compile(r"[a-z0-9.\-]+|[0-9a-f:.]+")  # a name or address (urlsplit's lower case)
# the authority of a redirect URI: a name, or an IP literal in brackets, and a port
NETLOC = re.compile(r"(\[[0-9a-fA-F:.]+\]|[A-Za-z0-9.-]+)(:\d{1,5})?")
# PKCE as RFC 7636 defines it: the S256 challenge is the unpadded base64url of a SHA-256
# (§4.2), the verifier 43 to 128 unreserved characters (§4.1); nothing else is hashed or kept
CHALLENGE = re.compile(r"[A-Za-z0-9_-]{43}")
VERIFIER = re.compile(r"[A-Za-z0-9._~-]{43,128}")


@dataclass
class OAuthClock:
    """When it is, for codes and tokens: `time.time` unless a test moves it."""

    now: Callable[[], float] = field(default=time.time)


CLOCK_KEY = web.AppKey("oauth_clock", OAuthClock)
STARTS_KEY = web.AppKey("oauth_starts", PerAddress)  # sign-in requests per address


def _now(request: web.Request) -> float:
    return request.app[CLOCK_KEY].now()


def mcp_resource(request: web.Request) -> str:
    """The resource (RFC 8707) every token here is for: this app's /mcp."""
    return f"{public_base(request)}/mcp"


def canonical(url: str) -> str:
    """A resource as compared: scheme and host in lower case, no fragment, no trailing /."""
    parts = urlsplit(url.strip())
    return urlunsplit(parts._replace(scheme=parts.scheme.lower(), netloc=parts.netloc.lower(),
                                     path=parts.path.rstrip("/"), fragment=""))


def same_resource(a: str, b: str) -> bool:
    return canonical(a) == canonical(b)


def challenge_of(verifier: str) -> str:
    """The S256 challenge of a verifier (`VERIFIER`: ASCII only)."""
    digest = hashlib.sha256(verifier.encode("ascii")).digest()
    return base64.urlsafe_b64encode(digest).decode().rstrip("=")


# -- metadata --------------------------------------------------------------------------------

def authorization_server_metadata(base: str) -> dict[str, Any]:
    return {
        "issuer": base,
        "authorization_endpoint": base + AUTHORIZE,
        "token_endpoint": base + TOKEN,
        "registration_endpoint": base + REGISTER,
        "response_types_supported": ["code"],
        "response_modes_supported": ["query"],
        "grant_types_supported": ["authorization_code", "refresh_token"],
        "token_endpoint_auth_methods_supported": ["none"],
        "code_challenge_methods_supported": ["S256"],
        "authorization_response_iss_parameter_supported": True,
        "service_documentation": base + "/console/",
    }


def metadata_cache(request: web.Request) -> dict[str, str]:
    """Caching of metadata built from `public_base`: kept a while when the address is
    configured; else it names the host this client asked for, and is no one else's."""
    if request.app[SERVICES_KEY].settings.public_url:
        return {"Cache-Control": "max-age=300"}
    return {"Cache-Control": "no-store", "Vary": "Host, X-Forwarded-Host, X-Forwarded-Proto"}


async def as_metadata(request: web.Request) -> web.Response:
    return json_response(authorization_server_metadata(public_base(request)),
                         headers=metadata_cache(request))


# -- registration (RFC 7591) -------------------------------------------------------------------

class RegistrationRefused(Exception):
    def __init__(self, error: str, description: str) -> None:
        super().__init__(description)
        self.error, self.description = error, description


def redirect_uri_refusal(uri: str) -> str | None:
    """Why `uri` cannot be a redirect URI, or None: https anywhere, http on a loopback
    address only (RFC 8252 §7.3), an absolute URI without a fragment (RFC 6749 §3.1.2)."""
    if not isinstance(uri, str) or not uri or len(uri) > MAX_URI:
        return "a redirect URI is a non-empty string of at most 2000 characters"
    try:
        parts = urlsplit(uri)
        host = parts.hostname or ""
        parts.port  # noqa: B018 (a port that is not a number raises)
        if parts.netloc.startswith("["):
            ipaddress.IPv6Address(host)
    except ValueError:
        return f"{uri[:200]!r} is not a URI"
    if not NETLOC.fullmatch(parts.netloc):
        return f"{uri[:200]!r} names no host, or names one with a user name or odd characters"
    if not URI_CHARACTERS.fullmatch(uri):
        return f"{uri[:200]!r} has characters a URI does not (RFC 3986): percent-encode them"
    if parts.fragment or "#" in uri:
        return f"{uri[:200]!r} has a fragment, which a redirect URI must not have"
    if not HOST.fullmatch(host) or parts.username is not None:
        return f"{uri[:200]!r} names no host, or names one with a user name"
    if parts.scheme == "https":
        return None
    if parts.scheme == "http":
        if host.lower() in LOOPBACK_NAMES:
            return None
        try:
            if ipaddress.ip_address(host).is_loopback:
                return None
        except ValueError:
            pass
        return (f"{uri[:200]!r} is plain http to a host other than this machine: use https, "
                "or http on a loopback address (127.0.0.1, [::1], localhost)")
    return f"{uri[:200]!r}: a redirect URI here is https, or http on a loopback address"


def _strings(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(item, str) for item in value)


def check_registration(body: Any) -> tuple[str, list[str]]:
    """(client name, redirect URIs) of a registration request, or RegistrationRefused."""
    if not isinstance(body, dict):
        raise RegistrationRefused("invalid_client_metadata", "send the client's metadata as a "
                                  "JSON object (RFC 7591)")
    uris = body.get("redirect_uris")
    if not isinstance(uris, list) or not uris or len(uris) > MAX_REDIRECT_URIS:
        raise RegistrationRefused("invalid_redirect_uri", "redirect_uris: a list of 1 to "
                                  f"{MAX_REDIRECT_URIS} URIs the browser is sent back to")
    for uri in uris:
        why = redirect_uri_refusal(uri)
        if why:
            raise RegistrationRefused("invalid_redirect_uri", why)
    grants = body.get("grant_types", ["authorization_code", "refresh_token"])
    # (a client is issued what it registered, RFC 7591 §2: without a code, nothing at all)
    if not _strings(grants) or not set(grants) <= {"authorization_code", "refresh_token"} \
            or "authorization_code" not in grants:
        raise RegistrationRefused("invalid_client_metadata", "grant_types: authorization_code, "
                                  "and refresh_token if the client refreshes: the ones this "
                                  "server issues")
    responses = body.get("response_types", ["code"])
    if not _strings(responses) or set(responses) != {"code"}:
        raise RegistrationRefused("invalid_client_metadata", "response_types: [\"code\"] only")
    name = body.get("client_name")
    name = name.strip()[:100] if isinstance(name, str) and name.strip() else "an MCP client"
    return name, list(uris)


async def register(request: web.Request) -> web.Response:
    services = request.app[SERVICES_KEY]
    try:
        raw = await read_body(request, REGISTRATION_LIMIT, "the client metadata")
        body = loads_json(raw or b"null", "the client metadata")  # nesting bounded
        name, uris = check_registration(body)
    except PayloadTooLarge as exc:
        return _oauth_error("invalid_client_metadata", exc.message, 413)
    except VaultmailError as exc:  # nested too deep
        return _oauth_error("invalid_client_metadata", exc.message)
    except ValueError:
        return _oauth_error("invalid_client_metadata", "the body is not JSON")
    except RegistrationRefused as exc:
        return _oauth_error(exc.error, exc.description)
    now = _now(request)
    client_id = CLIENT_PREFIX + secrets.token_urlsafe(18)
    answer = {
        "client_id": client_id,
        "client_id_issued_at": int(now),
        "client_name": name,
        "redirect_uris": uris,
        "grant_types": body.get("grant_types", ["authorization_code", "refresh_token"]),
        "response_types": ["code"],
        "token_endpoint_auth_method": "none",  # a public client: PKCE is its proof
    }
    wait = await db.add_client(services.store, client_id, name, uris, answer, now,
                               source=client_key(request, services.settings.trusted_proxies),
                               per_hour=REGISTRATIONS_PER_HOUR)
    if wait is not None:
        return _oauth_error("too_many_registrations", (
            f"this address registered {REGISTRATIONS_PER_HOUR} clients within the hour: "
            "register again later, or keep the client_id a registration gave"), 429, wait)
    log.info("oauth client registered", extra={"client": client_id, "client_name": name})
    return json_response(answer, status=201, headers={"Cache-Control": "no-store"})


# -- authorize ----------------------------------------------------------------------------------

def _with_query(target: str, params: dict[str, str]) -> str:
    parts = urlsplit(target)
    query = parse_qsl(parts.query, keep_blank_values=True) + [
        (k, v) for k, v in params.items() if v]
    return urlunsplit(parts._replace(query=urlencode(query)))


def _refusal_page(request: web.Request, message: str, status: int = 400,
                  retry_after: float | None = None) -> web.Response:
    exc = VaultmailError(message, code="invalid_request")
    exc.status, exc.retry_after = status, retry_after
    return error_page(request, exc)


def _loopback_literal(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _without_port(parts: SplitResult) -> str:
    host = parts.hostname or ""
    return urlunsplit(parts._replace(netloc=f"[{host}]" if ":" in host else host))


def registered_redirect(client: db.Client, given: str) -> bool:
    """Whether `given` is one of the client's redirect URIs: exactly, or for http on a
    loopback address (127.0.0.1, [::1]), with any port (RFC 8252 §7.3: a native client
    listens on whatever port it got)."""
    if given in client.redirect_uris:
        return True
    if redirect_uri_refusal(given) is not None:
        return False
    parts = urlsplit(given)
    if parts.scheme != "http" or not _loopback_literal(parts.hostname or ""):
        return False
    bare = _without_port(parts)
    return any(_without_port(urlsplit(uri)) == bare for uri in client.redirect_uris
               if urlsplit(uri).scheme == "http")


def authorize_refusal(request: web.Request) -> str | None:
    """What is wrong with an authorize request past its client and redirect URI, or None."""
    q = request.query
    if q.get("response_type") != "code":
        return "response_type must be code"
    challenge, method = q.get("code_challenge", ""), q.get("code_challenge_method", "")
    if not challenge:
        return "PKCE is required: send code_challenge and code_challenge_method=S256"
    if method != "S256":
        return "code_challenge_method must be S256 (plain is refused)"
    if not CHALLENGE.fullmatch(challenge):
        return ("code_challenge is the base64url SHA-256 of the code verifier (43 characters, "
                "no padding)")
    resource = q.get("resource") or mcp_resource(request)
    if not same_resource(resource, mcp_resource(request)):
        return f"resource: tokens here are for {mcp_resource(request)} only"
    if len(q.get("state", "")) > MAX_STATE:
        return f"state is at most {MAX_STATE} characters"
    return None


@not_for_a_part  # (an image of it kept a request and spent a start of the reader's address)
async def authorize(request: web.Request) -> web.StreamResponse:
    """Check the request; keep it; on to the consent page. Anything wrong is a page here,
    never a redirect: not to an unchecked URI (RFC 6749 §4.1.2.1), and, clients registering
    themselves, not with an error to a registered one either (RFC 9700 §4.11.2)."""
    services = request.app[SERVICES_KEY]
    q = request.query
    client = await db.client(services.store, q.get("client_id", "")[:200])
    if client is None:
        return _refusal_page(request, "This sign-in link names no client registered here "
                             "(client_id): the MCP client registers itself first "
                             f"({REGISTER}); start the sign-in from it again.")
    redirect_uri = q.get("redirect_uri")
    given = redirect_uri is not None
    if redirect_uri is None and len(client.redirect_uris) == 1:
        redirect_uri = client.redirect_uris[0]
    if redirect_uri is None or not registered_redirect(client, redirect_uri):
        return _refusal_page(request, f"The redirect_uri is not one {client.name} registered: "
                             "nothing was sent anywhere. Its registered URIs are matched "
                             "exactly (a loopback one's port aside).")
    why = authorize_refusal(request)
    if why is not None:
        return _refusal_page(request, f"{client.name} sent a sign-in request this server does "
                             f"not take ({why}): nothing was sent anywhere.")
    starts = request.app[STARTS_KEY]
    if not starts.admit(client_key(request, services.settings.trusted_proxies)):
        return _refusal_page(request, f"More than {AUTHORIZE_PER_MINUTE} sign-in requests "
                             "from your address within a minute: wait a minute, then start "
                             "the sign-in from the MCP client again.", 429, starts.window)
    ident = secrets.token_urlsafe(24)
    await db.add(services.store, [("request", ident)], grant_id=secrets.token_urlsafe(18),
                 client_id=client.client_id, principal=None, org=None,
                 resource=mcp_resource(request), redirect_uri=redirect_uri,
                 now=_now(request), lifetimes=LIFETIMES,
                 detail={"state": q.get("state", ""), "challenge": q["code_challenge"],
                         "redirect_given": given})
    raise web.HTTPSeeOther(f"{CONSENT}?request={ident}")


async def _pending(request: web.Request, ident: str) -> tuple[db.Grant, db.Client] | None:
    store = request.app[SERVICES_KEY].store
    held = await db.find(store, "request", ident)
    if held is None or held.used_at is not None or held.expires_at <= _now(request):
        return None
    client = await db.client(store, held.client_id)
    return (held, client) if client is not None else None


async def _consenting(request: web.Request) -> Visitor | web.StreamResponse:
    """The person in the browser (a console session), or where they go first."""
    try:
        v = await visitor(request)
    except NotSignedIn:
        if request.method == "GET":
            raise sign_in_redirect(request) from None
        return _refusal_page(request, "You are not signed in (any more): start the sign-in "
                             "from the MCP client again.", 401)
    except VaultmailError as exc:
        return error_page(request, exc)
    if v.session is None:
        return error_page(request, Denied("a client is allowed by a person signed in to the "
                                          "console in a browser, not with an API token"), v)
    return v


def _consent_page(request: web.Request, v: Visitor, held: db.Grant, client: db.Client,
                  ident: str) -> web.Response:
    where = csp_source(held.redirect_uri)
    response = page("authorize.html", {
        "v": None, "current": None, "human": v.human, "office": v.call.office,
        "principal": v.principal, "client": client, "redirect_uri": held.redirect_uri,
        "request": ident, "csrf": v.csrf, "resource": held.resource,
        "hours": int(LIFETIMES["access"] // 3600), "days": int(LIFETIMES["grant"] // 86400)})
    # the form's answer sends the browser to the client: CSP's form-action must allow it
    csp = SECURITY_HEADERS["Content-Security-Policy"].replace(
        "form-action 'self'", f"form-action 'self' {where}")
    response.headers["Content-Security-Policy"] = csp
    return response


def csp_source(uri: str) -> str:
    """A redirect URI's origin as a CSP source, made of its parsed scheme, host and port
    (never its raw authority, checked as it is: `redirect_uri_refusal`)."""
    parts = urlsplit(uri)
    host = parts.hostname or ""
    if ":" in host:
        host = f"[{ipaddress.IPv6Address(host).compressed}]"
    elif not re.fullmatch(r"[a-z0-9.\-]+", host):
        raise ValueError(f"{uri[:200]!r} has no host a CSP source can name")
    port = f":{parts.port}" if parts.port is not None else ""
    return f"{parts.scheme.lower()}://{host}{port}"


async def consent_page(request: web.Request) -> web.StreamResponse:
    ident = request.query.get("request", "")
    found = await _pending(request, ident)
    if found is None:
        return _refusal_page(request, "This sign-in request is unknown, used or older than "
                             "10 minutes: start the sign-in from the MCP client again.")
    v = await _consenting(request)
    if not isinstance(v, Visitor):
        return v
    return _consent_page(request, v, *found, ident)


async def consent(request: web.Request) -> web.StreamResponse:
    """The person's answer: back to the client with a code, or with access_denied."""
    services = request.app[SERVICES_KEY]
    form = await read_form(request)
    v = await _consenting(request)
    if not isinstance(v, Visitor):
        return v
    try:
        check_csrf(request, v, form)
    except Denied as exc:
        return error_page(request, exc, v)
    ident = form.get("request", "")
    found = await _pending(request, ident)
    now = _now(request)
    if found is None or not await db.use(services.store, "request", ident, now):
        return _refusal_page(request, "This sign-in request is unknown, used or older than "
                             "10 minutes: start the sign-in from the MCP client again.")
    held, client = found
    state, base = str(held.detail.get("state", "")), public_base(request)
    if form.get("decision") != "allow":
        raise web.HTTPSeeOther(_with_query(held.redirect_uri, {
            "error": "access_denied", "error_description": "the person did not allow it",
            "state": state, "iss": base}))
    code, org = CODE_PREFIX + secrets.token_urlsafe(32), v.call.office.org.lower()
    await db.allow(services.store, code, grant_id=secrets.token_urlsafe(18),
                   client_id=client.client_id, principal=v.principal, org=org, login=v.login,
                   resource=held.resource, redirect_uri=held.redirect_uri, now=now,
                   lifetimes=LIFETIMES, detail={
                       "challenge": held.detail.get("challenge"),
                       "redirect_given": held.detail.get("redirect_given", True)})
    await ledger.record(services.store, "mcp.client_allowed", v.principal, "mcp", {
        "client": client.client_id, "name": client.name, "redirect_uri": held.redirect_uri,
        "resource": held.resource}, org=org)
    raise web.HTTPSeeOther(_with_query(held.redirect_uri, {"code": code, "state": state,
                                                           "iss": base}))


# -- token ----------------------------------------------------------------------------------

def _oauth_error(error: str, description: str, status: int = 400,
                 retry_after: float | None = None) -> web.Response:
    """An RFC 6749 error; a 429 or 503 says when to come back (`retry_after`, else shortly)."""
    headers = {"Cache-Control": "no-store", "Pragma": "no-cache",
               **retry_headers(status, retry_after)}
    if status == 401:
        headers["WWW-Authenticate"] = 'Basic realm="vaultmail"'
    return json_response({"error": error, "error_description": description},
                         status=status, headers=headers)


def _client_id_of(request: web.Request, form: dict[str, str]) -> str:
    auth = request.headers.get("Authorization", "")
    if auth.lower().startswith("basic "):
        try:
            cid, _, _ = base64.b64decode(auth[6:].strip()).decode().partition(":")
        except (ValueError, UnicodeDecodeError):
            cid = ""
        return unquote(cid)
    return form.get("client_id", "")


async def _issue(services: Services, client: db.Client, held: db.Grant, value: str,
                 now: float, replaces: tuple[str, ...] = ()) -> web.Response:
    """Spend `value` (`held`: a code or refresh token) for a new access token, and a refresh
    token for a client that registered the refresh_token grant, in one transaction of its
    grant (`bot.store.oauth.exchange`)."""
    access = ACCESS_PREFIX + secrets.token_urlsafe(32)
    refresh = REFRESH_PREFIX + secrets.token_urlsafe(48) \
        if "refresh_token" in client.grant_types else None
    issued = [("access", access)] + ([("refresh", refresh)] if refresh else [])
    spent = await db.exchange(services.store, held, value, issued,
                              now=now, lifetimes=LIFETIMES, replaces=replaces)
    if spent is db.Spent.REPLAYED:
        log.warning(f"oauth {held.kind} used twice: its grant is revoked",
                    extra={"client": held.client_id, "grant": held.grant_id})
    if spent is not db.Spent.ISSUED:
        what = "code" if held.kind == "code" else "refresh token"
        return _oauth_error("invalid_grant", f"the {what} is unknown, used, expired or "
                            "revoked")
    answer: dict[str, Any] = {"access_token": access, "token_type": "Bearer",
                              "expires_in": int(LIFETIMES["access"])}
    if refresh:
        answer["refresh_token"] = refresh
    return json_response(answer, headers={"Cache-Control": "no-store", "Pragma": "no-cache"})


async def token(request: web.Request) -> web.Response:
    services = request.app[SERVICES_KEY]
    if request.content_type != "application/x-www-form-urlencoded":
        return _oauth_error("invalid_request", "send the token request form-encoded "
                            "(application/x-www-form-urlencoded)")
    form = await read_form(request)
    client_id = _client_id_of(request, form)
    client = await db.client(services.store, client_id) if client_id else None
    if client is None:
        return _oauth_error("invalid_client", "no client registered here has this client_id",
                            401)
    now = _now(request)
    grant_type = form.get("grant_type", "")
    resource = form.get("resource")
    if grant_type in ("authorization_code", "refresh_token") \
            and grant_type not in client.grant_types:  # (RFC 6749 §5.2)
        return _oauth_error("unauthorized_client", f"this client did not register the "
                            f"{grant_type} grant")
    if grant_type == "authorization_code":
        return await _by_code(request, services, form, client, resource, now)
    if grant_type == "refresh_token":
        return await _by_refresh(services, form, client, resource, now)
    return _oauth_error("unsupported_grant_type", "grant_type is authorization_code or "
                        "refresh_token")


async def _by_code(request: web.Request, services: Services, form: dict[str, str],
                   client: db.Client, resource: str | None, now: float) -> web.Response:
    """The code, checked whole (client, redirect URI, PKCE, resource) before it is spent:
    only a request that could have used it spends it, or (spent already) revokes its
    grant."""
    code = form.get("code", "")
    held = await db.find(services.store, "code", code) if code else None
    if held is None or held.client_id != client.client_id:
        return _oauth_error("invalid_grant", "the code is unknown, used, expired or not this "
                            "client's")
    given = form.get("redirect_uri")
    if given != held.redirect_uri and (given is not None or held.detail.get(
            "redirect_given", True)):
        return _oauth_error("invalid_grant", "redirect_uri is not the one the code was "
                            "given for")
    verifier = form.get("code_verifier", "")
    # (compared as bytes: a challenge kept by an older release may be anything)
    if not VERIFIER.fullmatch(verifier) or not hmac.compare_digest(
            challenge_of(verifier).encode(), str(held.detail.get("challenge", "")).encode()):
        return _oauth_error("invalid_grant", "the code_verifier does not match the "
                            "code_challenge (PKCE)")
    if resource is not None and not same_resource(resource, held.resource):
        return _oauth_error("invalid_target", f"the code is for {held.resource} only")
    return await _issue(services, client, held, code, now)


async def _by_refresh(services: Services, form: dict[str, str], client: db.Client,
                      resource: str | None, now: float) -> web.Response:
    value = form.get("refresh_token", "")
    held = await db.find(services.store, "refresh", value) if value else None
    bad = _oauth_error("invalid_grant", "the refresh token is unknown, used, expired or "
                       "revoked")
    if held is None or held.client_id != client.client_id:
        return bad
    if resource is not None and not same_resource(resource, held.resource):
        return _oauth_error("invalid_target", f"the refresh token is for {held.resource} only")
    if held.live(now) and held.principal is not None and held.org is not None:
        try:  # still in the office? (removed: everything of theirs there is revoked now)
            call = await make_call(services, held.principal, None, held.org)
            await _still_granted(services, held, call.office, now)
        except (Denied, NotInstalled, Unauthenticated) as exc:
            return _oauth_error("invalid_grant", exc.message)
        except VaultmailError as exc:
            return _oauth_error("temporarily_unavailable", exc.message, 503, exc.retry_after)
    return await _issue(services, client, held, value, now, replaces=("access",))


async def _still_granted(services: Services, held: db.Grant, office: Office | None,
                         now: float) -> None:
    """Raises when what the grant's person signed in with to allow it no longer stands for
    them in `office` (a forge account the office now says is someone else's or no one's, a
    token revoked): the grant is revoked, for good. (Their place in the office is the call's
    to check: `make_call`.)"""
    assert held.principal is not None
    if office is not None and held.grant_login is not None and not await still_stands(
            services, office, held.principal, held.grant_login):
        await db.revoke_grant(services.store, held.grant_id, now)
        raise Unauthenticated("what this sign-in was allowed with no longer stands for "
                              f"{held.principal} (a forge account the office no longer says "
                              "is theirs, or a revoked token): sign in again")


# -- the MCP endpoint's side -------------------------------------------------------------------

async def access_owner(services: Services, token: str, resource: str,
                       now: float) -> api_tokens.Owner:
    """Who an access token acts for, in which office, if it is live and for `resource`."""
    held = await db.find(services.store, "access", token)
    if held is None or held.revoked_at is not None or held.grant_revoked_at is not None \
            or held.grant_expires_at is None:
        raise Unauthenticated("this access token is unknown or revoked: sign in again")
    if not held.live(now):
        raise Unauthenticated("this access token has expired: refresh it, or sign in again")
    if not same_resource(held.resource, resource):
        raise Unauthenticated(f"this access token is for {held.resource}, not {resource}")
    if held.principal is None or held.org is None:
        raise Unauthenticated("this access token acts for nobody")
    if held.grant_login is not None:  # (the office as the call will read it: kept a minute)
        await services.still_installed(held.org)  # (signed in through another replica)
        office = await services.offices.get(services.forge_for_org(held.org), held.org)
        await _still_granted(services, held, office, now)
    return api_tokens.Owner(held.principal, held.org)


def is_access_token(token: str) -> bool:
    return token.startswith(ACCESS_PREFIX)


def add_oauth_routes(app: web.Application) -> None:
    app[CLOCK_KEY] = OAuthClock()
    app[STARTS_KEY] = PerAddress(AUTHORIZE_PER_MINUTE)
    r = app.router
    r.add_get(AS_METADATA_PATH, as_metadata)
    r.add_post(REGISTER, register)
    r.add_get(AUTHORIZE, authorize)
    r.add_post(TOKEN, token)
    r.add_get(CONSENT, consent_page)
    r.add_post(CONSENT, consent)


__all__ = ["AS_METADATA_PATH", "CLOCK_KEY", "access_owner", "add_oauth_routes",
           "is_access_token", "mcp_resource", "metadata_cache", "public_base"]
