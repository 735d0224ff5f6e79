"""GitHub's OAuth web flow for GitHub Apps ("Generating a user access token for a GitHub App",
"Authorizing OAuth apps", "Troubleshooting OAuth app access token request errors").

`GET /login/oauth/authorize?client_id&redirect_uri&state[&login][&prompt][&code_challenge]`:
sign-in first if nobody is (or someone other than `login`), then a page with Authorize and
Cancel, or straight through once the user has authorised the App; back to the `redirect_uri`
(which must be one of the App's callback URLs, else an error page; none given: the first) with
`code` and `state`, or `error=access_denied`.

`POST /login/oauth/access_token` (client_id, client_secret, code, redirect_uri, code_verifier;
or grant_type=refresh_token with refresh_token): form-encoded answers unless `Accept` asks for
JSON or XML; errors as GitHub sends them, with 200. Codes are good once, for ten minutes on the
forge clock. A user access token (`ghu_`) expires after eight hours with a refresh token
(`ghr_`, six months, good once) when the App has expiring user tokens, which is the default.
At most `limits.oauth_tokens_per_hour` (2,000) token requests an hour per App; past that 429
with `Retry-After` (GitHub lists the limit but not its answer: this one is the forge's).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import secrets
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit
from xml.sax.saxutils import escape as xml_escape

from aiohttp import web

from ..forge import random_token
from ..state import App, OAuthCode, RefreshToken, Token
from .html import WebError, h, link, page, path_of, redirect
from .session import check_csrf, csrf_field, forge_of, viewer
from .signin import sign_in_url

if TYPE_CHECKING:
    from ..forge import LocalForge

CODE_TTL = 600.0
USER_TOKEN_TTL = 8 * 3600
REFRESH_TOKEN_TTL = 15811200  # six months, as GitHub's responses give it
DOCS = "https://docs.github.com/apps/managing-oauth-apps/"
TOKEN_ERRORS = DOCS + "troubleshooting-oauth-app-access-token-request-errors/"
AUTHORIZE_ERRORS = DOCS + "troubleshooting-authorization-request-errors/"
RATE_DOCS = ("https://docs.github.com/rest/using-the-rest-api/rate-limits-for-the-rest-api"
             "#about-secondary-rate-limits")


def app_by_client_id(forge: LocalForge, client_id: str | None) -> App | None:
    if not client_id:
        return None
    return next((a for a in forge.state.apps.values() if a.client_id == client_id), None)


# -- authorize --------------------------------------------------------------------------------
def _target(app: App, redirect_uri: str | None) -> str:
    """Where the user goes back to: the `redirect_uri` if it is a callback URL of the App."""
    if redirect_uri:
        if redirect_uri not in app.callback_urls:
            raise WebError(400, "Redirect URI mismatch",
                           f"The redirect_uri {redirect_uri} is not associated with this "
                           f"application ({app.name}): the application might be misconfigured "
                           "or could be trying to send you to a site you were not expecting. "
                           "Its callback URLs are: "
                           f"{', '.join(app.callback_urls) or 'none'}.")
        return redirect_uri
    if not app.callback_urls:
        raise WebError(400, "No callback URL", f"{app.name} has no callback URL to send you "
                       "back to: register one (callback_urls) for the OAuth web flow.")
    return app.callback_urls[0]


def _back(target: str, **params: str) -> web.Response:
    parts = urlsplit(target)
    query = parse_qsl(parts.query, keep_blank_values=True) + [
        (k, v) for k, v in params.items() if v]
    return redirect(urlunsplit(parts._replace(query=urlencode(query))))


def _pkce(params: Mapping[str, str]) -> tuple[str | None, str | None]:
    challenge = params.get("code_challenge") or None
    method = params.get("code_challenge_method") or None
    if challenge is None:
        if method:
            raise WebError(400, "Invalid request", "code_challenge_method was given without a "
                           "code_challenge: send both, or neither.")
        return None, None
    if (method or "S256") != "S256":
        raise WebError(400, "Invalid request", "code_challenge_method must be S256 (the only "
                       "method GitHub supports).")
    if not 43 <= len(challenge) <= 128:
        raise WebError(400, "Invalid request", "code_challenge should be the base64url "
                       "SHA-256 of the code verifier (43 characters).")
    return challenge, "S256"


def _grant(forge: LocalForge, app: App, login: str, params: Mapping[str, str],
           target: str) -> web.Response:
    challenge, method = _pkce(params)
    code = secrets.token_hex(10)
    forge.state.web.codes[code] = OAuthCode(
        code=code, app_id=app.id, login=login, redirect_uri=params.get("redirect_uri") or None,
        created_at=forge.clock.now(), code_challenge=challenge, code_challenge_method=method)
    forge.save()
    return _back(target, code=code, state=params.get("state", ""))


def _authorized(forge: LocalForge, login: str, app: App) -> bool:
    return app.id in forge.state.web.authorizations.get(login.lower(), [])


def _app_and_target(request: web.Request, params: Mapping[str, str]) -> tuple[App, str]:
    app = app_by_client_id(forge_of(request), params.get("client_id"))
    if app is None:
        raise WebError(404, "Not Found", "No GitHub App has this client_id: check the "
                       "client_id of the authorize link (the App's `client_id`, Iv1.…).")
    return app, _target(app, params.get("redirect_uri") or None)


async def authorize(request: web.Request) -> web.Response:
    forge = forge_of(request)
    params = dict(request.query)
    app, target = _app_and_target(request, params)
    _pkce(params)  # a bad challenge is refused before anyone signs in
    who = viewer(request).login
    hint = params.get("login") or None
    if who is None or (hint and hint.lower() != who.lower()) or \
            params.get("prompt") == "select_account":
        again = {k: v for k, v in params.items() if k != "prompt"}  # or it would loop
        return redirect(sign_in_url(f"{request.path}?{urlencode(again)}", hint))
    if _authorized(forge, who, app):
        return _grant(forge, app, who, params, target)
    owner = forge.state.account(app.owner)
    hidden = "".join(f'<input type="hidden" name="{h(k)}" value="{h(params.get(k, ""))}">'
                     for k in ("client_id", "redirect_uri", "state", "code_challenge",
                               "code_challenge_method") if params.get(k))
    body = (
        f"<h1>Authorize {h(app.name)}</h1>"
        f"<p>{h(app.name)} by {link(path_of(owner.login), owner.login) if owner else ''} "
        f"wants to act on your behalf, <strong>{h(who)}</strong>:</p>"
        "<ul><li>Verify your forge identity (your login and email address).</li>"
        "<li>Know which resources you can access, and act on them where the App is installed "
        "and may do so: never beyond what you may do yourself.</li></ul>"
        f"<p>You will be sent back to <code>{h(target)}</code>.</p>"
        '<form class="box" method="post" action="/login/oauth/authorize">' +
        csrf_field(request) + hidden +
        '<button type="submit" name="decision" value="cancel">Cancel</button> '
        f'<button class="primary" type="submit" name="decision" value="authorize">Authorize '
        f"{h(app.name)}</button></form>"
    )
    return page(request, f"Authorize {app.name}", body, who)


async def authorize_decision(request: web.Request) -> web.Response:
    forge = forge_of(request)
    form = await request.post()
    params = {k: str(v) for k, v in form.items() if isinstance(v, str)}
    check_csrf(request, params.get("authenticity_token"))
    app, target = _app_and_target(request, params)
    who = viewer(request).login
    if who is None:
        raise WebError(401, "Sign in", "You are not signed in (any more): open the "
                       "application's sign-in link again.")
    decision = params.get("decision")
    if decision == "cancel":
        return _back(target, error="access_denied",
                     error_description="The user has denied your application access.",
                     error_uri=AUTHORIZE_ERRORS + "#access-denied",
                     state=params.get("state", ""))
    if decision != "authorize":
        raise WebError(422, "Unprocessable Entity", "Press Authorize or Cancel: the form "
                       "sent no decision.")
    granted = forge.state.web.authorizations.setdefault(who.lower(), [])
    if app.id not in granted:
        granted.append(app.id)
    return _grant(forge, app, who, params, target)


# -- access_token -----------------------------------------------------------------------------
def _answer(request: web.Request, data: Mapping[str, Any], status: int = 200,
            headers: Mapping[str, str] | None = None) -> web.Response:
    """In the form the client asked for: JSON, XML, or (GitHub's default) form-encoded."""
    accept = request.headers.get("Accept", "")
    if "json" in accept:
        resp = web.Response(text=json.dumps(data), content_type="application/json",
                            charset="utf-8", status=status)
    elif "xml" in accept:
        items = "".join(f"<{k}>{xml_escape(str(v))}</{k}>" for k, v in data.items())
        resp = web.Response(text=f"<OAuth>{items}</OAuth>", content_type="application/xml",
                            charset="utf-8", status=status)
    else:
        resp = web.Response(text=urlencode({k: str(v) for k, v in data.items()}),
                            content_type="application/x-www-form-urlencoded",
                            charset="utf-8", status=status)
    resp.headers.update(headers or {})
    resp.headers["Cache-Control"] = "no-store"
    return resp


def _error(request: web.Request, error: str, description: str, anchor: str,
           base: str = TOKEN_ERRORS) -> web.Response:
    return _answer(request, {"error": error, "error_description": description,
                             "error_uri": base + anchor})


async def _params(request: web.Request) -> dict[str, str]:
    """The token request's fields: query, form or JSON body, and HTTP Basic client auth."""
    params = dict(request.query)
    if request.can_read_body:
        if request.content_type == "application/json":
            try:
                data = await request.json()
            except ValueError:
                data = None
            if isinstance(data, dict):
                params.update({k: str(v) for k, v in data.items() if v is not None})
        else:
            form = await request.post()
            params.update({k: v for k, v in form.items() if isinstance(v, str)})
    auth = request.headers.get("Authorization", "")
    if auth.lower().startswith("basic "):
        try:
            cid, _, secret = base64.b64decode(auth[6:].strip()).decode().partition(":")
        except (ValueError, UnicodeDecodeError):
            cid, secret = "", ""
        params.setdefault("client_id", cid)
        params.setdefault("client_secret", secret)
    return params


def _issue(forge: LocalForge, app: App, login: str) -> dict[str, Any]:
    now = forge.clock.now()
    access = random_token("ghu_", 36)
    forge.state.tokens[access] = Token(
        token=access, kind="user", login=login, created_at=now, app_id=app.id,
        expires_at=now + USER_TOKEN_TTL if app.expiring_user_tokens else None)
    if not app.expiring_user_tokens:
        return {"access_token": access, "token_type": "bearer", "scope": ""}
    refresh = random_token("ghr_", 76)
    forge.state.web.refresh_tokens[refresh] = RefreshToken(
        token=refresh, app_id=app.id, login=login, access_token=access,
        expires_at=now + REFRESH_TOKEN_TTL)
    return {"access_token": access, "expires_in": USER_TOKEN_TTL, "refresh_token": refresh,
            "refresh_token_expires_in": REFRESH_TOKEN_TTL, "token_type": "bearer",
            "scope": ""}


def _verifier_ok(code: OAuthCode, verifier: str | None) -> bool:
    if code.code_challenge is None:
        return True
    if not verifier:
        return False
    digest = base64.urlsafe_b64encode(hashlib.sha256(verifier.encode()).digest())
    return hmac.compare_digest(digest.rstrip(b"=").decode(), code.code_challenge)


async def access_token(request: web.Request) -> web.Response:
    forge = forge_of(request)
    params = await _params(request)
    app = app_by_client_id(forge, params.get("client_id"))
    if app is not None:
        wait = forge.rates.take(f"oauth:{app.id}", forge.limits.oauth_tokens_per_hour)
        if wait is not None:
            return _answer(request, {
                "error": "rate_limited",
                "error_description": "You have exceeded a secondary rate limit: at most "
                f"{forge.limits.oauth_tokens_per_hour} OAuth access token requests an hour "
                f"for this App. Wait {wait} seconds (Retry-After) and try again.",
                "error_uri": RATE_DOCS}, 429, {"Retry-After": str(wait)})
    secret = params.get("client_secret", "")
    if app is None or not app.client_secret or not hmac.compare_digest(
            app.client_secret.encode(), secret.encode()):
        return _error(request, "incorrect_client_credentials",
                      "The client_id and/or client_secret passed are incorrect.",
                      "#incorrect-client-credentials")
    grant = params.get("grant_type") or "authorization_code"
    if grant == "refresh_token":
        return _refresh(request, forge, app, params.get("refresh_token", ""))
    if grant != "authorization_code":
        return _error(request, "unsupported_grant_type",
                      f"The grant type {grant!r} is not supported: use authorization_code "
                      "(with code) or refresh_token (with refresh_token).",
                      "#unsupported-grant-type")
    code = forge.state.web.codes.get(params.get("code", ""))
    bad = _error(request, "bad_verification_code", "The code passed is incorrect or expired.",
                 "#bad-verification-code")
    if code is not None and forge.clock.now() - code.created_at >= CODE_TTL:
        del forge.state.web.codes[code.code]
        forge.save()
        code = None
    if code is None or code.app_id != app.id:
        return bad
    asked = params.get("redirect_uri") or None
    used = code.redirect_uri or (app.callback_urls[0] if app.callback_urls else None)
    if asked is not None and asked != used:
        return _error(request, "redirect_uri_mismatch", "The redirect_uri MUST match the "
                      "registered callback URL for this application.",
                      "#redirect-uri-mismatch2", AUTHORIZE_ERRORS)
    if not _verifier_ok(code, params.get("code_verifier")):
        return bad
    del forge.state.web.codes[code.code]
    out = _issue(forge, app, code.login)
    forge.save()
    return _answer(request, out)


def _refresh(request: web.Request, forge: LocalForge, app: App, value: str) -> web.Response:
    held = forge.state.web.refresh_tokens.get(value)
    if held is None or held.app_id != app.id or forge.clock.now() >= held.expires_at:
        return _error(request, "bad_refresh_token",
                      "The refresh token passed is incorrect or expired.", "#bad-refresh-token")
    del forge.state.web.refresh_tokens[value]
    forge.state.tokens.pop(held.access_token, None)  # the token it replaces stops working
    out = _issue(forge, app, held.login)
    forge.save()
    return _answer(request, out)
