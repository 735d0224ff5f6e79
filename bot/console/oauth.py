"""GitHub's OAuth web flow for a GitHub App, as the app's side of it: who signs in.

GitHub documents it in "Generating a user access token for a GitHub App": the browser goes to
`{web}/login/oauth/authorize?client_id&redirect_uri&state[&login]`; the forge sends it back to
`redirect_uri` with `code` and the same `state`; the app trades the code (with its client id and
secret) at `POST {web}/login/oauth/access_token` for a user access token, and asks
`GET {api}/user` with it who the person is. Only the login is kept: the token is not stored.
The request carries a PKCE challenge (S256) as GitHub recommends, so a code caught on the way
back is useless without the verifier kept in the browser's HTTP-only cookie.
"""

from __future__ import annotations

import base64
import hashlib
from typing import Any
from urllib.parse import urlencode

import aiohttp

from bot.app.settings import Settings

TIMEOUT = aiohttp.ClientTimeout(total=15)


class SignInFailed(Exception):
    """The forge did not sign the person in; the message says why and what to do."""


def enabled(settings: Settings) -> bool:
    return bool(settings.client_id and settings.client_secret) and settings.dialect == "github"


def challenge(verifier: str) -> str:
    digest = hashlib.sha256(verifier.encode()).digest()
    return base64.urlsafe_b64encode(digest).decode().rstrip("=")


def authorize_url(settings: Settings, redirect_uri: str, state: str, verifier: str,
                  login: str | None = None) -> str:
    query = {"client_id": settings.client_id, "redirect_uri": redirect_uri, "state": state,
             "code_challenge": challenge(verifier), "code_challenge_method": "S256"}
    if login:
        query["login"] = login  # GitHub: "suggests a specific account to use for signing in"
    return f"{settings.web_url}/login/oauth/authorize?{urlencode(query)}"


async def sign_in(settings: Settings, code: str, redirect_uri: str,
                  verifier: str) -> tuple[str, int | None]:
    """The forge login that `code` was given to (the code is single-use), and its account's
    id (a login is a name its owner may give up: the id says whose it is now)."""
    async with aiohttp.ClientSession(timeout=TIMEOUT) as http:
        token = await _access_token(http, settings, code, redirect_uri, verifier)
        return await _login(http, settings, token)


async def _access_token(http: aiohttp.ClientSession, settings: Settings, code: str,
                        redirect_uri: str, verifier: str) -> str:
    form = {"client_id": settings.client_id, "client_secret": settings.client_secret,
            "code": code, "redirect_uri": redirect_uri, "code_verifier": verifier}
    try:
        # (the client secret goes to the forge alone, and who signed in is the forge's word
        # alone: a redirect is not followed, but refused below)
        async with http.post(f"{settings.web_url}/login/oauth/access_token", data=form,
                             headers={"Accept": "application/json"},
                             allow_redirects=False) as resp:
            body: Any = await resp.json(content_type=None)
            status = resp.status
    except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
        raise SignInFailed(f"the forge at {settings.web_url} did not answer the sign-in "
                           f"({exc!r}); try again") from exc
    if status != 200 or not isinstance(body, dict):
        raise SignInFailed(f"the forge answered {status} to the sign-in; try again")
    if "error" in body:  # GitHub answers 200 with {"error", "error_description", "error_uri"}
        why = body.get("error_description") or body["error"]
        raise SignInFailed(f"the forge refused the sign-in: {why} ({body['error']}); "
                           "sign in again")
    token = body.get("access_token")
    if not isinstance(token, str) or not token:
        raise SignInFailed("the forge's answer to the sign-in held no access_token; try again")
    return token


async def _login(http: aiohttp.ClientSession, settings: Settings,
                 token: str) -> tuple[str, int | None]:
    headers = {"Authorization": f"Bearer {token}", "Accept": "application/vnd.github+json"}
    try:
        async with http.get(f"{settings.api_url}/user", headers=headers,
                            allow_redirects=False) as resp:
            body: Any = await resp.json(content_type=None)
            status = resp.status
    except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
        raise SignInFailed(f"the forge did not say who signed in ({exc!r}); try again") from exc
    if status != 200 or not isinstance(body, dict) or not isinstance(body.get("login"), str):
        raise SignInFailed(f"the forge answered {status} to GET /user; sign in again")
    user_id = body.get("id")
    return str(body["login"]), user_id if isinstance(user_id, int) else None
