"""Sign-in and sign-out, as GitHub's: `GET /login` is the form, it posts to `/session`;
`GET /logout` asks, `POST /logout` ends the session. A seeded user's password is a per-user
secret the forge hands out (`LocalForge.user_password`, `GET /_forge/users/{login}/password`);
one of the user's personal access tokens is taken as the password too (for scripts)."""

from __future__ import annotations

import hmac
import json

from aiohttp import web

from .html import WebError, h, page, redirect, with_query
from .session import (
    check_csrf,
    csrf_field,
    end_session,
    forge_of,
    safe_return_to,
    start_session,
    viewer,
)

WRONG = "Incorrect username or password."


def _form(request: web.Request, login_value: str, return_to: str, error: str = "") -> str:
    who = viewer(request).login
    note = ""
    if who:
        note = (f"<p>You are signed in as <strong>{h(who)}</strong>. Signing in here "
                "replaces that session.</p>")
    alert = f'<p class="error" role="alert">{h(error)}</p>' if error else ""
    return (
        "<h1>Sign in to the local forge</h1>" + note + alert +
        '<form class="box" method="post" action="/session">' + csrf_field(request) +
        f'<input type="hidden" name="return_to" value="{h(return_to)}">'
        '<label for="login_field">Username or email address</label>'
        f'<input type="text" id="login_field" name="login" value="{h(login_value)}" '
        'autocomplete="username" autocapitalize="none" required>'
        '<label for="password">Password</label>'
        '<input type="password" id="password" name="password" '
        'autocomplete="current-password" required>'
        '<button class="primary" type="submit">Sign in</button></form>'
        '<p class="muted">A seeded user\'s password comes from the forge '
        "(<code>forge.user_password(login)</code> or "
        "<code>GET /_forge/users/{login}/password</code>); a personal access token of "
        "the user works as the password too.</p>"
    )


async def login_page(request: web.Request) -> web.Response:
    return_to = safe_return_to(request.query.get("return_to", "/"))
    body = _form(request, request.query.get("login", ""), return_to)
    return page(request, "Sign in", body, viewer(request).login)


def _password_ok(request: web.Request, login: str, password: str) -> str | None:
    """The account's login if `password` is its forge password or one of its PATs."""
    forge = forge_of(request)
    st = forge.state
    acct = st.account(login)
    if acct is None and "@" in login:
        acct = next((a for a in st.accounts.values()
                     if a.email and a.email.lower() == login.lower()), None)
    if acct is None or acct.type != "User":
        return None
    known = st.web.passwords.get(acct.login.lower())
    if known is not None and hmac.compare_digest(known.encode(), password.encode()):
        return acct.login
    tok = st.tokens.get(password)
    if (tok is not None and tok.kind == "user" and tok.app_id is None and tok.login
            and tok.login.lower() == acct.login.lower()
            and (tok.expires_at is None or forge.clock.now() < tok.expires_at)):
        return acct.login
    return None


async def create_session(request: web.Request) -> web.Response:
    forge = forge_of(request)
    form = await request.post()
    check_csrf(request, form.get("authenticity_token"))
    login = str(form.get("login") or "").strip()
    password = str(form.get("password") or "")
    return_to = safe_return_to(form.get("return_to"))
    if not login or not password:
        raise WebError(422, "Sign in", "Enter your login (username or email address) and "
                       "your password, then sign in.")
    who = _password_ok(request, login, password)
    if who is None:
        return page(request, "Sign in", _form(request, login, return_to, WRONG),
                    viewer(request).login, status=401)
    resp = redirect(return_to)
    start_session(forge, request, resp, who)
    return resp


async def logout_page(request: web.Request) -> web.Response:
    who = viewer(request).login
    if who:
        text = f"<p>You are signed in as <strong>{h(who)}</strong>.</p>"
    else:
        text = "<p>You are not signed in.</p>"
    body = ("<h1>Sign out</h1>" + text +
            '<form class="box" method="post" action="/logout">' + csrf_field(request) +
            '<button type="submit">Sign out</button></form>')
    return page(request, "Sign out", body, who)


async def logout(request: web.Request) -> web.Response:
    form = await request.post()
    check_csrf(request, form.get("authenticity_token"))
    resp = redirect(safe_return_to(form.get("return_to")))
    end_session(forge_of(request), request, resp)
    forge_of(request).save()
    return resp


async def user_password(request: web.Request) -> web.Response:
    """`GET /_forge/users/{login}/password`: the password a seeded user signs in with."""
    forge = forge_of(request)
    login = request.match_info["login"]
    try:
        password = forge.user_password(login)
    except KeyError:
        return web.json_response({"message": f"no user {login!r}: seed it with POST "
                                             "/_forge/users first"}, status=404,
                                 dumps=json.dumps)
    acct = forge.state.account(login)
    assert acct is not None
    return web.json_response({"login": acct.login, "password": password})


def sign_in_url(return_to: str, login: str | None = None) -> str:
    params = {"return_to": return_to}
    if login:
        params = {"login": login, **params}
    return with_query("/login", **params)
