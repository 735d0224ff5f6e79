"""Remote MCP clients sign in with OAuth 2.1 (issue 23): the app is the authorisation server
of its own /mcp. The MCP SDK's own OAuth client discovers it, registers, and a person signs
in through the local forge (its sign-in and authorize forms, filled over HTTP as a browser
would) and allows the client on the console's consent page; then the client lists and calls
tools. Then what is refused: PKCE missing or plain, a wrong verifier, a redirect URI not
registered, a code used twice (what it issued is revoked with it) or after its minute, a token
for another resource, a token of one office on another's mail, an expired token (the app's
OAuth clock moved, nothing slept), a refresh token used twice. And what a review found: a
person removed from the office keeps nothing, a grant ends thirty days after consent, two
uses at once leave nothing live, only a right exchange spends a code, errors are never
redirects, redirect URIs are well formed (a loopback one's port is free), and what anyone may
send is bounded and pruned.
"""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import hashlib
import html
import re
import secrets
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlencode, urlsplit

import aiohttp
import pytest
import yaml
from mcp import Client
from mcp.client.auth import OAuthClientProvider
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client
from mcp.shared.auth import (
    AuthorizationCodeResult,
    OAuthClientInformationFull,
    OAuthClientMetadata,
    OAuthToken,
)
from pydantic import AnyUrl

from bot.app.embedded import Embedded
from bot.app.settings import parse_proxies
from bot.office.config import parse_office
from bot.office.seed import seed_office
from bot.store import oauth as oauth_rows
from bot.tools import oauth_server
from bot.tools.oauth_server import CLOCK_KEY, LIFETIMES
from tests.support import ToolClient
from tests.test_mcp import _refused, _result, mcp_http
from tests.test_tenancy import EVIL, MARCO, SECRET

REDIRECT = "http://127.0.0.1:9/callback"  # never reached: the browser's last stop is read
INPUT = re.compile(r"<input\b[^>]*>")
ATTR = re.compile(r'(\w+)="([^"]*)"')


def _fields(page: str, action: str) -> dict[str, str]:
    """The named inputs of the form that posts to `action`, as a browser would send them."""
    start = page.index(f'action="{action}"')
    form = page[start:page.index("</form>", start)]
    out = {}
    for tag in INPUT.findall(form):
        attrs = {k: html.unescape(v) for k, v in ATTR.findall(tag)}
        if "name" in attrs:
            out[attrs["name"]] = attrs.get("value", "")
    return out


async def consent(browser: aiohttp.ClientSession, embedded: Embedded, login: str,
                  authorize_url: str, decision: str = "allow",
                  redirect: str = REDIRECT) -> dict[str, str]:
    """A person's browser opening a client's authorize link: sign in to the console with the
    forge (its sign-in form with the password, then its Authorize form) unless signed in
    already, then the consent page; the query of where it sends the browser back."""
    async with browser.get(authorize_url) as resp:
        page, at = await resp.text(), str(resp.url)
    assert resp.status == 200, (resp.status, page[:500])
    if "/console/sign-in" in at:
        link = re.search(r'href="(/console/sign-in/forge[^"]*)"', page)
        assert link, "the console's sign-in page offers the forge"
        async with browser.get(embedded.app_url + html.unescape(link[1])) as resp:
            page, at = await resp.text(), str(resp.url)
        forge = embedded.forge.url
        if 'action="/session"' in page:  # the forge's sign-in form
            fields = _fields(page, "/session") | {
                "login": login, "password": embedded.forge.user_password(login)}
            async with browser.post(forge + "/session", data=fields) as resp:
                page, at = await resp.text(), str(resp.url)
        if 'action="/login/oauth/authorize"' in page:  # the forge asks to authorize the App
            fields = _fields(page, "/login/oauth/authorize") | {"decision": "authorize"}
            async with browser.post(forge + "/login/oauth/authorize", data=fields) as resp:
                page, at = await resp.text(), str(resp.url)
        assert resp.status == 200, (resp.status, page[:500])
    assert "/console/authorize?request=" in at, (at, page[:500])
    fields = _fields(page, "/console/authorize") | {"decision": decision}
    async with browser.post(embedded.app_url + "/console/authorize", data=fields,
                            allow_redirects=False) as resp:
        assert resp.status == 303, (resp.status, await resp.text())
        back = resp.headers["Location"]
    assert back.startswith(redirect + "?"), back
    return {k: v[0] for k, v in parse_qs(urlsplit(back).query).items()}


class Memory:
    """The SDK client's token storage, in memory."""

    def __init__(self) -> None:
        self.tokens: OAuthToken | None = None
        self.client: OAuthClientInformationFull | None = None

    async def get_tokens(self) -> OAuthToken | None:
        return self.tokens

    async def set_tokens(self, tokens: OAuthToken) -> None:
        self.tokens = tokens

    async def get_client_info(self) -> OAuthClientInformationFull | None:
        return self.client

    async def set_client_info(self, client_info: OAuthClientInformationFull) -> None:
        self.client = client_info


@pytest.fixture
async def browser() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(cookie_jar=aiohttp.CookieJar(unsafe=True)) as http:
        yield http


async def test_the_sdks_oauth_client_signs_in_through_the_forge_and_calls_tools(
        embedded: Embedded, browser: aiohttp.ClientSession) -> None:
    back: list[dict[str, str]] = []

    async def redirect_handler(url: str) -> None:
        back.append(await consent(browser, embedded, "marco", url))

    async def callback_handler() -> AuthorizationCodeResult:
        got = back[-1]
        return AuthorizationCodeResult(code=got["code"], state=got.get("state"),
                                       iss=got.get("iss"))

    storage = Memory()
    provider = OAuthClientProvider(
        embedded.app_url + "/mcp",
        OAuthClientMetadata(redirect_uris=[AnyUrl(REDIRECT)], client_name="Test desk",
                            grant_types=["authorization_code", "refresh_token"]),
        storage, redirect_handler, callback_handler)
    async with create_mcp_http_client(auth=provider) as http, \
            Client(streamable_http_client(embedded.app_url + "/mcp", http_client=http),
                   mode="auto") as client:
        names = {t.name for t in (await client.list_tools()).tools}
        assert {"mail_send", "mail_list", "list_inbox"} <= names
        sent = _result(await client.call_tool("mail_send", {
            "to": "scout", "subject": "Signed in with OAuth", "body": "hello from MCP"}))
        listed = _result(await client.call_tool("mail_list", {}))
    assert len(back) == 1, "one sign-in"
    assert storage.client is not None and storage.client.client_id.startswith("vmcl_")
    assert storage.tokens is not None and storage.tokens.access_token.startswith("vmoa_")
    assert storage.tokens.refresh_token and storage.tokens.expires_in == 3600
    assert sent["mail"]["from_principal"] == MARCO, "it acts as the person who allowed it"
    assert "Signed in with OAuth" in str(listed)
    [allowed] = await embedded.ledger_events("mcp.client_allowed")
    assert (allowed.actor, allowed.org, allowed.data["name"]) == (MARCO, "acme", "Test desk")


# -- a client by hand ----------------------------------------------------------------------------

def _pkce() -> tuple[str, str]:
    verifier = secrets.token_urlsafe(48)
    digest = hashlib.sha256(verifier.encode()).digest()
    return verifier, base64.urlsafe_b64encode(digest).decode().rstrip("=")


async def register(http: aiohttp.ClientSession, embedded: Embedded,
                   uris: list[str] | None = None, **metadata: Any) -> tuple[int, dict[str, Any]]:
    async with http.post(embedded.app_url + "/oauth/register", json={
            "client_name": "by hand", "redirect_uris": uris or [REDIRECT], **metadata}) as resp:
        return resp.status, await resp.json()


def authorize_url(embedded: Embedded, client_id: str, challenge: str | None,
                  **extra: str) -> str:
    query = {"response_type": "code", "client_id": client_id, "redirect_uri": REDIRECT,
             "state": "st-1", "resource": embedded.app_url + "/mcp"}
    if challenge is not None:
        query |= {"code_challenge": challenge, "code_challenge_method": "S256"}
    return f"{embedded.app_url}/oauth/authorize?{urlencode(query | extra)}"


async def token(http: aiohttp.ClientSession, embedded: Embedded,
                **form: str) -> tuple[int, dict[str, Any]]:
    async with http.post(embedded.app_url + "/oauth/token", data=form) as resp:
        assert resp.headers.get("Cache-Control") == "no-store"
        return resp.status, await resp.json()


async def code_for(browser: aiohttp.ClientSession, embedded: Embedded, login: str,
                   client_id: str, challenge: str) -> str:
    got = await consent(browser, embedded, login, authorize_url(embedded, client_id, challenge))
    assert got["state"] == "st-1" and got["iss"] == embedded.app_url
    return got["code"]


async def signed_in_tokens(browser: aiohttp.ClientSession, embedded: Embedded,
                           login: str, **metadata: Any) -> tuple[str, dict[str, Any]]:
    """(client id, the token answer) of a client a person allowed."""
    _, client = await register(browser, embedded, **metadata)
    verifier, challenge = _pkce()
    code = await code_for(browser, embedded, login, client["client_id"], challenge)
    status, body = await token(browser, embedded, grant_type="authorization_code", code=code,
                               redirect_uri=REDIRECT, client_id=client["client_id"],
                               code_verifier=verifier, resource=embedded.app_url + "/mcp")
    assert status == 200, body
    return client["client_id"], body


async def mcp_status(http: aiohttp.ClientSession, embedded: Embedded,
                     token_value: str) -> tuple[int, str]:
    """A ping-sized initialize at /mcp: its status and WWW-Authenticate."""
    async with http.post(embedded.app_url + "/mcp", json={
            "jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
                "protocolVersion": "2025-06-18", "capabilities": {},
                "clientInfo": {"name": "t", "version": "1"}}},
            headers={"Authorization": f"Bearer {token_value}",
                     "Accept": "application/json, text/event-stream"}) as resp:
        await resp.read()
        return resp.status, resp.headers.get("WWW-Authenticate", "")


async def test_what_authorize_and_token_refuse_codes_good_once_tokens_expire_and_rotate(
        embedded: Embedded, browser: aiohttp.ClientSession, session: aiohttp.ClientSession
) -> None:
    app = embedded.app_url
    async with session.get(app + "/.well-known/oauth-protected-resource/mcp") as resp:
        assert (await resp.json())["authorization_servers"] == [app]
    async with session.get(app + "/.well-known/oauth-authorization-server") as resp:
        meta = await resp.json()
    assert meta["issuer"] == app and meta["code_challenge_methods_supported"] == ["S256"]
    assert meta["registration_endpoint"] == app + "/oauth/register"
    async with session.post(app + "/mcp", json={}) as resp:
        assert resp.status == 401
        assert f'resource_metadata="{app}/.well-known/oauth-protected-resource"' in \
            resp.headers["WWW-Authenticate"]
    for uri in ("http://evil.example/cb", "https://ok.example/cb#frag", "javascript:x"):
        status, body = await register(session, embedded, [uri])
        assert (status, body["error"]) == (400, "invalid_redirect_uri"), uri
    status, client = await register(session, embedded, [REDIRECT, "https://ok.example/cb"])
    assert status == 201 and client["token_endpoint_auth_method"] == "none"
    cid = client["client_id"]
    _, challenge = _pkce()

    # a request that is wrong is a page, never a redirect (open registration: RFC 9700
    # §4.11.2), whatever the client registered
    for url, why in (
            (authorize_url(embedded, cid, None), "PKCE is required"),
            (authorize_url(embedded, cid, None, code_challenge=challenge,
                           code_challenge_method="plain"), "plain is refused"),
            (authorize_url(embedded, cid, None, code_challenge=challenge), "S256"),
            (authorize_url(embedded, cid, challenge, resource="https://elsewhere.example/mcp"),
             "tokens here are for"),
            (authorize_url(embedded, cid, challenge, response_type="token"),
             "response_type must be code")):
        async with session.get(url, allow_redirects=False) as resp:
            assert resp.status == 400 and "Location" not in resp.headers, url
            assert why in html.unescape(await resp.text()), url
    for url in (authorize_url(embedded, cid, challenge, redirect_uri=REDIRECT + "/x"),
                authorize_url(embedded, cid, challenge, redirect_uri="http://127.0.0.1:9/"),
                authorize_url(embedded, "vmcl_unknown", challenge)):
        async with session.get(url, allow_redirects=False) as resp:
            assert resp.status == 400 and "Location" not in resp.headers, url
    async with session.get(authorize_url(embedded, cid, challenge),
                           allow_redirects=False) as resp:
        assert resp.status == 303 and resp.headers["Location"].startswith(
            "/console/authorize?request=")

    verifier, challenge = _pkce()
    code = await code_for(browser, embedded, "marco", cid, challenge)
    exchange = {"grant_type": "authorization_code", "code": code, "redirect_uri": REDIRECT,
                "client_id": cid, "code_verifier": verifier}
    status, body = await token(session, embedded, **exchange | {"code_verifier": _pkce()[0]})
    assert (status, body["error"]) == (400, "invalid_grant"), "a wrong verifier"
    status, body = await token(session, embedded, **exchange)
    assert status == 200, "a wrong verifier spent nothing (only the right exchange does)"

    # signed in to the console now: the next sign-in is the consent page only
    code = await code_for(browser, embedded, "marco", cid, challenge)
    status, body = await token(session, embedded, **exchange | {
        "code": code, "redirect_uri": "http://127.0.0.1:9/other"})
    assert (status, body["error"]) == (400, "invalid_grant"), "another redirect_uri"
    code = await code_for(browser, embedded, "marco", cid, challenge)
    status, body = await token(session, embedded, **exchange | {
        "code": code, "resource": "https://elsewhere.example/mcp"})
    assert (status, body["error"]) == (400, "invalid_target")
    code = await code_for(browser, embedded, "marco", cid, challenge)
    status, tokens = await token(session, embedded, **exchange | {"code": code})
    assert status == 200 and tokens["token_type"] == "Bearer", tokens
    assert (await mcp_status(session, embedded, tokens["access_token"]))[0] == 200
    status, body = await token(session, embedded, **exchange | {"code": code})
    assert (status, body["error"]) == (400, "invalid_grant"), "the code again"
    status, challenge_header = await mcp_status(session, embedded, tokens["access_token"])
    assert status == 401, "a replayed code revokes what it issued"
    assert 'error="invalid_token"' in challenge_header and "resource_metadata=" in \
        challenge_header
    status, body = await token(session, embedded, grant_type="refresh_token",
                               refresh_token=tokens["refresh_token"], client_id=cid)
    assert (status, body["error"]) == (400, "invalid_grant")

    denied = await consent(browser, embedded, "marco", authorize_url(embedded, cid, challenge),
                           decision="deny")
    assert denied["error"] == "access_denied" and "code" not in denied
    clock = embedded.runner.app[CLOCK_KEY]
    real = clock.now
    code = await code_for(browser, embedded, "marco", cid, challenge)
    clock.now = lambda: real() + LIFETIMES["code"] + 1
    try:
        status, body = await token(session, embedded, **exchange | {"code": code})
        assert (status, body["error"]) == (400, "invalid_grant"), "a code lasts a minute"
    finally:
        clock.now = real

    # tokens expire, rotate, and are for this resource only
    cid, tokens = await signed_in_tokens(browser, embedded, "marco")
    access = tokens["access_token"]
    assert (await mcp_status(session, embedded, access))[0] == 200
    status, _ = await ToolClient(session, embedded, MARCO).raw("mail_list", {}, token=access)
    assert status == 401, "an access token is for /mcp, not the tool endpoint"

    clock.now = lambda: real() + LIFETIMES["access"] + 1
    try:
        status, header = await mcp_status(session, embedded, access)
        assert status == 401 and 'error="invalid_token"' in header
        status, fresh = await token(session, embedded, grant_type="refresh_token",
                                    refresh_token=tokens["refresh_token"], client_id=cid,
                                    resource=embedded.app_url + "/mcp")
        assert status == 200 and fresh["refresh_token"] != tokens["refresh_token"], fresh
        assert (await mcp_status(session, embedded, fresh["access_token"]))[0] == 200
        status, body = await token(session, embedded, grant_type="refresh_token",
                                   refresh_token=tokens["refresh_token"], client_id=cid)
        assert (status, body["error"]) == (400, "invalid_grant"), "a refresh token is good once"
        status, _ = await mcp_status(session, embedded, fresh["access_token"])
        assert status == 401, "used twice, it revokes the whole grant"
    finally:
        clock.now = real

    elsewhere = "vmoa_" + secrets.token_urlsafe(32)
    await oauth_rows.add(embedded.services.store, [("access", elsewhere)], grant_id="g-else",
                         client_id=cid, principal=MARCO, org="acme",
                         resource="https://elsewhere.example/mcp", redirect_uri=REDIRECT,
                         now=real(), lifetimes=LIFETIMES)
    assert (await mcp_status(session, embedded, elsewhere))[0] == 401, "another audience"


async def test_a_token_of_one_office_never_acts_in_another(
        embedded: Embedded, browser: aiohttp.ClientSession, session: aiohttp.ClientSession
) -> None:
    """evil's person eve is `human:marco@acme.com` in evil's office: her token, made by
    signing in as herself, finds none of acme's marco's mail."""
    seed_office(embedded.forge, parse_office(yaml.safe_dump(EVIL), "evil.yml", repository=False))
    (app_id,) = embedded.forge.state.apps
    embedded.forge.install_app(int(app_id), "evil")
    sent = (await ToolClient(session, embedded, MARCO)(
        "mail_send", to="scout", subject=SECRET, body="x"))["mail"]
    await embedded.settle()
    _, tokens = await signed_in_tokens(browser, embedded, "eve")
    async with mcp_http(embedded, tokens["access_token"]) as client:
        status, code, _ = _refused(await client.call_tool("mail_get", {"mail": sent["ref"]}))
        assert (status, code) == (404, "not_found")
        listed = _result(await client.call_tool("mail_list", {}))
        assert SECRET not in str(listed)
        mine = _result(await client.call_tool("mail_send", {
            "to": "scout", "subject": "evil's own", "body": "x"}))
    assert mine["mail"]["from_principal"] == MARCO and mine["mail"]["ref"].startswith("evil/")


# -- what the review found ---------------------------------------------------------------------

def _office_text() -> str:
    from importlib import resources

    return resources.files("bot").joinpath("example_office.yml").read_text()


LEE_BLOCK = "  - email: lee@acme.com\n    login: lee\n    permissions: []\n"


async def _refresh(http: aiohttp.ClientSession, embedded: Embedded, cid: str,
                   refresh_token: str) -> tuple[int, dict[str, Any]]:
    return await token(http, embedded, grant_type="refresh_token",
                       refresh_token=refresh_token, client_id=cid)


async def test_a_client_registered_without_refresh_tokens_gets_none_and_may_not_refresh(
        embedded: Embedded, browser: aiohttp.ClientSession, session: aiohttp.ClientSession
) -> None:
    """A client that registered `grant_types: ["authorization_code"]` is issued what it
    registered (RFC 7591 §2): an access token and no refresh token, and a refresh from it is
    refused `unauthorized_client` (RFC 6749 §5.2), whatever token it sends: here one of
    another client's, live (found by review: it got a refresh token, and could use it).
    Registering with no `authorization_code` is refused: such a client could get nothing."""
    cid, tokens = await signed_in_tokens(browser, embedded, "marco",
                                         grant_types=["authorization_code"])
    assert "refresh_token" not in tokens, tokens
    assert (await mcp_status(session, embedded, tokens["access_token"]))[0] == 200
    _, other = await signed_in_tokens(browser, embedded, "marco")
    status, body = await _refresh(session, embedded, cid, other["refresh_token"])
    assert (status, body.get("error")) == (400, "unauthorized_client"), body
    for grants in (["refresh_token"], []):
        status, body = await register(session, embedded, grant_types=grants)
        assert (status, body.get("error")) == (400, "invalid_client_metadata"), body


async def test_a_person_removed_from_the_office_loses_their_grant_for_good(
        embedded: Embedded, browser: aiohttp.ClientSession, session: aiohttp.ClientSession
) -> None:
    """Removed from vaultmail.yml, a person's OAuth grants end as their API tokens do: no
    refresh, and added back, the old tokens stay dead."""
    cid, tokens = await signed_in_tokens(browser, embedded, "lee")
    assert (await mcp_status(session, embedded, tokens["access_token"]))[0] == 200
    text = _office_text()
    assert LEE_BLOCK in text
    embedded.forge.put_file("acme/.github", "vaultmail.yml", text.replace(LEE_BLOCK, ""),
                            pusher="admin")
    await embedded.settle()
    status, body = await _refresh(session, embedded, cid, tokens["refresh_token"])
    assert (status, body.get("error")) == (400, "invalid_grant"), body
    assert (await mcp_status(session, embedded, tokens["access_token"]))[0] == 401
    embedded.forge.put_file("acme/.github", "vaultmail.yml", text, pusher="admin")
    await embedded.settle()
    assert (await mcp_status(session, embedded, tokens["access_token"]))[0] == 401, \
        "added back, the old access token stays revoked"
    status, body = await _refresh(session, embedded, cid, tokens["refresh_token"])
    assert (status, body.get("error")) == (400, "invalid_grant"), body
    # signing in again makes a new grant that works
    _, again = await signed_in_tokens(browser, embedded, "lee")
    assert (await mcp_status(session, embedded, again["access_token"]))[0] == 200


@pytest.mark.parametrize("config_read", ["kept", "from_the_forge"])
async def test_a_grant_ends_when_the_office_gives_its_person_another_forge_account(
        embedded: Embedded, browser: aiohttp.ClientSession, session: aiohttp.ClientSession,
        config_read: str) -> None:
    """lee consented signed in as the forge account `lee`; the office then says lee@acme.com
    is `lee-real` (a login corrected, an account handed over). What the account `lee` was
    granted ends with it, for good, as a person removed (found by review: it went on acting
    as lee@acme.com for up to thirty days). `from_the_forge`: the config this replica had
    read had run out (a minute old, or the replica had just started) when the push's delivery
    ran, so the handler's config "before" the push was already the new one and revoked
    nothing (found by a later review): each use and refresh checks the grant's account."""
    cid, tokens = await signed_in_tokens(browser, embedded, "lee")
    assert (await mcp_status(session, embedded, tokens["access_token"]))[0] == 200
    if config_read == "from_the_forge":
        embedded.services.offices.max_age = 0.0  # (each read of the config asks the forge)
    text = _office_text()
    embedded.forge.put_file("acme/.github", "vaultmail.yml", text.replace(
        LEE_BLOCK, LEE_BLOCK.replace("login: lee\n", "login: lee-real\n")), pusher="admin")
    await embedded.settle()
    assert (await mcp_status(session, embedded, tokens["access_token"]))[0] == 401
    status, body = await _refresh(session, embedded, cid, tokens["refresh_token"])
    assert (status, body.get("error")) == (400, "invalid_grant"), body


async def test_a_refresh_for_someone_no_longer_in_the_office_revokes_their_grants(
        embedded: Embedded, session: aiohttp.ClientSession) -> None:
    """Removed without the push being seen (another replica, a missed webhook): the refresh
    asks the office itself, and revokes every grant of theirs there (`make_call`)."""
    store, ghost = embedded.services.store, "human:ghost@acme.com"
    _, client = await register(session, embedded)
    cid, resource, now = client["client_id"], embedded.app_url + "/mcp", \
        embedded.runner.app[CLOCK_KEY].now()
    for grant in ("g-ghost-1", "g-ghost-2"):
        await oauth_rows.allow(store, f"code-{grant}", grant_id=grant, client_id=cid,
                               principal=ghost, org="acme", resource=resource,
                               redirect_uri=REDIRECT, now=now, lifetimes=LIFETIMES)
        assert await oauth_rows.add(store, [("refresh", f"refresh-{grant}")], grant_id=grant,
                                    client_id=cid, principal=ghost, org="acme",
                                    resource=resource, redirect_uri=REDIRECT, now=now,
                                    lifetimes=LIFETIMES)
    status, body = await _refresh(session, embedded, cid, "refresh-g-ghost-1")
    assert (status, body.get("error")) == (400, "invalid_grant"), body
    assert "not in the office config" in body["error_description"]
    other = await oauth_rows.find(store, "refresh", "refresh-g-ghost-2")
    assert other is not None and other.grant_revoked_at is not None, "all of theirs end"
    assert not await oauth_rows.add(store, [("access", "vmoa_x")], grant_id="g-ghost-2",
                                    client_id=cid, principal=ghost, org="acme",
                                    resource=resource, redirect_uri=REDIRECT, now=now,
                                    lifetimes=LIFETIMES), "nothing is added to a revoked grant"


async def test_a_grant_ends_thirty_days_after_consent_however_often_refreshed(
        embedded: Embedded, browser: aiohttp.ClientSession, session: aiohttp.ClientSession
) -> None:
    clock = embedded.runner.app[CLOCK_KEY]
    real = clock.now
    cid, tokens = await signed_in_tokens(browser, embedded, "marco")
    try:
        clock.now = lambda: real() + 29 * 86_400
        status, fresh = await _refresh(session, embedded, cid, tokens["refresh_token"])
        assert status == 200, fresh
        assert fresh["expires_in"] == 3600
        clock.now = lambda: real() + 30 * 86_400 - 600
        status, body = await token(session, embedded, grant_type="refresh_token",
                                   refresh_token=fresh["refresh_token"], client_id=cid)
        assert status == 200, body
        assert (await mcp_status(session, embedded, body["access_token"]))[0] == 200
        clock.now = lambda: real() + 30 * 86_400 + 1
        assert (await mcp_status(session, embedded, body["access_token"]))[0] == 401, \
            "no access token outlives its grant"
        status, late = await _refresh(session, embedded, cid, body["refresh_token"])
        assert (status, late.get("error")) == (400, "invalid_grant"), late
    finally:
        clock.now = real


async def test_a_refresh_token_or_code_used_twice_at_once_leaves_nothing_live(
        embedded: Embedded, browser: aiohttp.ClientSession, session: aiohttp.ClientSession
) -> None:
    for _ in range(2):
        cid, tokens = await signed_in_tokens(browser, embedded, "marco")
        answers = await asyncio.gather(
            _refresh(session, embedded, cid, tokens["refresh_token"]),
            _refresh(session, embedded, cid, tokens["refresh_token"]))
        assert sorted(s for s, _ in answers)[-1] == 400, answers
        for status, body in answers:
            if status == 200:
                assert (await mcp_status(session, embedded, body["access_token"]))[0] == 401
                again, _ = await _refresh(session, embedded, cid, body["refresh_token"])
                assert again == 400
    _, client = await register(session, embedded)
    cid = client["client_id"]
    for _ in range(2):
        verifier, challenge = _pkce()
        code = await code_for(browser, embedded, "marco", cid, challenge)
        exchange = {"grant_type": "authorization_code", "code": code, "redirect_uri": REDIRECT,
                    "client_id": cid, "code_verifier": verifier}
        answers = await asyncio.gather(token(session, embedded, **exchange),
                                       token(session, embedded, **exchange))
        assert sorted(s for s, _ in answers)[-1] == 400, answers
        for status, body in answers:
            if status == 200:
                assert (await mcp_status(session, embedded, body["access_token"]))[0] == 401
                again, _ = await _refresh(session, embedded, cid, body["refresh_token"])
                assert again == 400


async def test_only_a_right_exchange_spends_a_code_or_revokes_its_grant(
        embedded: Embedded, browser: aiohttp.ClientSession, session: aiohttp.ClientSession
) -> None:
    _, client = await register(session, embedded)
    cid = client["client_id"]
    verifier, challenge = _pkce()
    code = await code_for(browser, embedded, "marco", cid, challenge)
    exchange = {"grant_type": "authorization_code", "code": code, "redirect_uri": REDIRECT,
                "client_id": cid, "code_verifier": verifier}
    for wrong in ({"code_verifier": _pkce()[0]}, {"redirect_uri": "http://127.0.0.1:9/x"},
                  {"code_verifier": "short"}):
        status, body = await token(session, embedded, **exchange | wrong)
        assert (status, body["error"]) == (400, "invalid_grant"), wrong
    status, tokens = await token(session, embedded, **exchange)
    assert status == 200, "a wrong guess did not burn the code"
    status, body = await token(session, embedded, **exchange | {"code_verifier": _pkce()[0]})
    assert (status, body["error"]) == (400, "invalid_grant")
    assert (await mcp_status(session, embedded, tokens["access_token"]))[0] == 200, \
        "whoever saw the code but not the verifier revokes nothing"
    status, body = await token(session, embedded, **exchange)
    assert status == 400
    assert (await mcp_status(session, embedded, tokens["access_token"]))[0] == 401, \
        "the code replayed with its verifier: the grant ends"


async def test_authorize_errors_are_a_page_never_a_redirect(
        embedded: Embedded, session: aiohttp.ClientSession) -> None:
    evil = "https://evil.example/phish"
    status, client = await register(session, embedded, [evil])
    assert status == 201
    _, challenge = _pkce()
    for extra in ({"response_type": "x"}, {"code_challenge_method": "plain"},
                  {"code_challenge": ""}, {"resource": "https://elsewhere.example/mcp"}):
        url = authorize_url(embedded, client["client_id"], challenge, redirect_uri=evil,
                            **extra)
        async with session.get(url, allow_redirects=False) as resp:
            assert resp.status == 400 and "Location" not in resp.headers, (extra, resp.status)


async def test_pkce_values_are_as_rfc_7636_defines_them(
        embedded: Embedded, browser: aiohttp.ClientSession, session: aiohttp.ClientSession
) -> None:
    """A code_challenge is the base64url SHA-256 of the verifier (43 characters) and a
    code_verifier 43 to 128 unreserved characters (RFC 7636 §4.1, §4.2). Found by review: any
    43 to 128 characters were taken as a challenge, so a sign-in the person allowed led to a
    code no verifier could trade, and the exchange was a 500 (a challenge not ASCII); and a
    verifier was hashed with whatever was not ASCII made `?`, so `é...` traded a code whose
    challenge was that of `?...`."""
    _, client = await register(session, embedded)
    cid = client["client_id"]
    for challenge in ("é" * 43, "!" * 43, _pkce()[1] + "A", "A" * 128):
        async with session.get(authorize_url(embedded, cid, challenge),
                               allow_redirects=False) as resp:
            assert resp.status == 400 and "Location" not in resp.headers, challenge
            assert "base64url SHA-256" in html.unescape(await resp.text()), challenge
    # a code kept with such a challenge (by the release before): refused, never a 500
    store, now = embedded.services.store, embedded.runner.app[CLOCK_KEY].now()
    await oauth_rows.allow(store, "vmoc_kept", grant_id="g-kept", client_id=cid,
                           principal=MARCO, org="acme", resource=embedded.app_url + "/mcp",
                           redirect_uri=REDIRECT, now=now, lifetimes=LIFETIMES,
                           detail={"challenge": "é" * 43})
    status, body = await token(session, embedded, grant_type="authorization_code",
                               code="vmoc_kept", redirect_uri=REDIRECT, client_id=cid,
                               code_verifier=_pkce()[0])
    assert (status, body.get("error")) == (400, "invalid_grant"), body
    # a verifier of other characters is refused, whatever it hashes to
    odd = "?" * 43
    challenge = base64.urlsafe_b64encode(hashlib.sha256(odd.encode()).digest()).decode()
    code = await code_for(browser, embedded, "marco", cid, challenge.rstrip("="))
    for verifier in ("é" * 43, odd):
        status, body = await token(session, embedded, grant_type="authorization_code",
                                   code=code, redirect_uri=REDIRECT, client_id=cid,
                                   code_verifier=verifier)
        assert (status, body.get("error")) == (400, "invalid_grant"), (verifier, body)


async def test_redirect_uris_are_well_formed_and_loopback_ports_are_free(
        embedded: Embedded, browser: aiohttp.ClientSession, session: aiohttp.ClientSession
) -> None:
    for uri in ("http://*;[::1]/cb", "http://[::1]evil.example/cb", "https://[::1]x/cb",
                "https://a.example;b/cb", "https://[zz]/cb", "https://a.example:99999/cb"):
        status, body = await register(session, embedded, [uri])
        assert (status, body.get("error")) == (400, "invalid_redirect_uri"), (uri, body)
    status, client = await register(session, embedded, [REDIRECT])
    cid = client["client_id"]
    # RFC 8252 §7.3: a loopback redirect URI takes any port at authorize
    other = "http://127.0.0.1:54321/callback"
    verifier, challenge = _pkce()
    url = authorize_url(embedded, cid, challenge, redirect_uri=other)
    got = await consent(browser, embedded, "marco", url, redirect=other)
    async with browser.get(url) as resp:  # signed in now: the consent page at once
        assert "/console/authorize?request=" in str(resp.url)
        csp = resp.headers["Content-Security-Policy"]
    assert "form-action 'self' http://127.0.0.1:54321;" in csp + ";", csp
    status, body = await token(session, embedded, grant_type="authorization_code",
                               code=got["code"], redirect_uri=other, client_id=cid,
                               code_verifier=verifier)
    assert status == 200, body
    for wrong in ("http://127.0.0.1:54321/elsewhere", "http://localhost:54321/callback",
                  "https://127.0.0.1:54321/callback"):
        async with session.get(authorize_url(embedded, cid, challenge, redirect_uri=wrong),
                               allow_redirects=False) as resp:
            assert resp.status == 400 and "Location" not in resp.headers, wrong
    # redirect_uri left out at authorize (one registered): the exchange leaves it out too
    verifier, challenge = _pkce()
    query = {"response_type": "code", "client_id": cid, "state": "st-1",
             "code_challenge": challenge, "code_challenge_method": "S256"}
    got = await consent(browser, embedded, "marco",
                        f"{embedded.app_url}/oauth/authorize?{urlencode(query)}")
    status, body = await token(session, embedded, grant_type="authorization_code",
                               code=got["code"], client_id=cid, code_verifier=verifier)
    assert status == 200, body


async def test_what_anyone_may_send_is_bounded(
        embedded: Embedded, session: aiohttp.ClientSession,
        monkeypatch: pytest.MonkeyPatch) -> None:
    app = embedded.app_url
    status, client = await register(session, embedded)
    _, challenge = _pkce()
    async with session.get(authorize_url(embedded, client["client_id"], challenge,
                                         state="s" * 600), allow_redirects=False) as resp:
        assert resp.status == 400 and "state" in await resp.text()
    for raw in (b"[" * 100_000 + b"]" * 100_000,
                b'{"redirect_uris": ["' + REDIRECT.encode() + b'"], "grant_types": [{}]}',
                b'{"redirect_uris": ["' + REDIRECT.encode() + b'"], "response_types": [[]]}',
                b'{"redirect_uris": [{}]}', b"\xff"):
        async with session.post(app + "/oauth/register", data=raw,
                                headers={"Content-Type": "application/json"}) as resp:
            body = await resp.json()
            assert resp.status in (400, 413) and body["error"] in (
                "invalid_client_metadata", "invalid_redirect_uri"), (raw[:40], body)
    monkeypatch.setattr(oauth_server, "REGISTRATIONS_PER_HOUR", 3)
    for _ in range(2):
        assert (await register(session, embedded))[0] == 201
    async with session.post(app + "/oauth/register", json={"redirect_uris": [REDIRECT]}) as resp:
        assert resp.status == 429 and int(resp.headers["Retry-After"]) > 0
    clock = embedded.runner.app[CLOCK_KEY]
    real = clock.now
    clock.now = lambda: real() + 3601
    try:
        assert (await register(session, embedded))[0] == 201, "an hour later, again"
    finally:
        clock.now = real


async def test_sign_in_requests_one_address_may_start_are_bounded(
        embedded: Embedded, session: aiohttp.ClientSession) -> None:
    """Each sign-in request (`GET /oauth/authorize`, before anyone signs in) is kept in the
    index for the person to consent to: a row written at a stranger's request, one a GET,
    unbounded. One address may start AUTHORIZE_PER_MINUTE a minute; past it, a page saying
    so (429) and nothing written."""
    _, client = await register(session, embedded)
    _, challenge = _pkce()
    url = authorize_url(embedded, client["client_id"], challenge)
    store = embedded.services.store

    async def kept() -> int:
        row = await store.fetchone("SELECT count(*) AS n FROM oauth_grants WHERE kind=?",
                                   ("request",))
        return int(row["n"]) if row else 0

    before = await kept()
    statuses = []
    for _ in range(oauth_server.AUTHORIZE_PER_MINUTE + 2):
        async with session.get(url, allow_redirects=False) as resp:
            statuses.append(resp.status)
            text = await resp.text()
    assert statuses == [303] * oauth_server.AUTHORIZE_PER_MINUTE + [429, 429], statuses
    assert "sign-in requests from your address" in text, text[:500]
    assert await kept() == before + oauth_server.AUTHORIZE_PER_MINUTE


async def test_an_image_of_a_sign_in_request_keeps_nothing_and_spends_none(
        embedded: Embedded, session: aiohttp.ClientSession) -> None:
    """Anyone may register a client, and words on a console page may draw
    `![](/oauth/authorize?client_id=...)` (`img-src 'self'`): each reader's browser fetched
    it, which kept a sign-in request in the index and spent one of the reader's address's
    AUTHORIZE_PER_MINUTE. A sign-in request is taken from a page navigated to (or a client
    that sends no Sec-Fetch-Dest); an image is 403, keeps nothing and spends nothing."""
    _, client = await register(session, embedded)
    _, challenge = _pkce()
    url = authorize_url(embedded, client["client_id"], challenge)
    store = embedded.services.store

    async def kept() -> int:
        row = await store.fetchone("SELECT count(*) AS n FROM oauth_grants WHERE kind=?",
                                   ("request",))
        return int(row["n"]) if row else 0

    before = await kept()
    image = {"Sec-Fetch-Dest": "image", "Sec-Fetch-Mode": "no-cors",
             "Sec-Fetch-Site": "same-origin"}
    for _ in range(oauth_server.AUTHORIZE_PER_MINUTE):
        async with session.get(url, headers=image, allow_redirects=False) as resp:
            assert resp.status == 403, resp.status
            assert "Sec-Fetch-Dest: image" in await resp.text()
    assert await kept() == before
    async with session.get(url, allow_redirects=False, headers={
            "Sec-Fetch-Dest": "document", "Sec-Fetch-Mode": "navigate"}) as resp:
        assert resp.status == 303, "the address's own sign-in"
    assert await kept() == before + 1


async def test_registrations_are_counted_per_client_behind_a_trusted_proxy(
        embedded: Embedded, session: aiohttp.ClientSession,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Behind an ingress every request comes from the ingress's address, so the limit on
    registrations an address may make was one for the whole internet: 20 an hour by anyone
    and no office's new MCP client could register. With VAULTMAIL_TRUSTED_PROXIES naming the
    ingress, the client is the address the ingress heard from (the nearest in
    X-Forwarded-For that is no trusted proxy); without it, that header is anyone's to write
    and counts for nothing."""
    monkeypatch.setattr(oauth_server, "REGISTRATIONS_PER_HOUR", 2)
    url = embedded.app_url + "/oauth/register"

    async def register_from(forwarded: str) -> int:
        async with session.post(url, json={"redirect_uris": [REDIRECT]},
                                headers={"X-Forwarded-For": forwarded}) as resp:
            return resp.status

    # not trusted: what a client says of itself is not whom it is counted as
    assert [await register_from(f"198.51.100.{n}") for n in (1, 2, 3)] == [201, 201, 429]
    services = embedded.services
    services.settings = dataclasses.replace(services.settings,
                                            trusted_proxies=parse_proxies("127.0.0.1, ::1"))
    # the ingress (on loopback here) appends whom it heard from; a client's own claim
    # before that is skipped past, never taken
    assert [await register_from(f"10.9.9.9, 203.0.113.{n}") for n in (1, 1, 2, 2)] == \
        [201, 201, 201, 201]
    assert await register_from("203.0.113.1") == 429
    assert await register_from("203.0.113.9, 127.0.0.1") == 201  # two proxies: 203.0.113.9
    # an IPv6 host has a /64 to itself: its addresses share one count
    assert [await register_from(f"2001:db8:1:2::{n}") for n in (1, 2, 3)] == \
        [201, 201, 429]
    assert await register_from("2001:db8:1:3::1") == 201  # the next /64: another host
    # what a trusted proxy wrote that is no address counts as the proxy's own: loopback's,
    # spent above (never a fresh count per string)
    assert await register_from("junk") == 429
    assert await register_from("203.0.113.77, junk") == 429


async def test_the_metadata_built_from_request_headers_is_not_cached(
        embedded: Embedded, session: aiohttp.ClientSession) -> None:
    """Without VAULTMAIL_PUBLIC_URL the metadata name the host the client asked (through a
    trusted proxy here): a cache must not hand one client's answer to another."""
    embedded.services.settings = dataclasses.replace(
        embedded.services.settings, trusted_proxies=parse_proxies("127.0.0.1, ::1"))
    settings = embedded.services.settings
    for path in ("/.well-known/oauth-authorization-server",
                 "/.well-known/oauth-protected-resource/mcp"):
        object.__setattr__(settings, "public_url", None)
        try:
            async with session.get(embedded.app_url + path,
                                   headers={"X-Forwarded-Host": "other.example"}) as resp:
                assert resp.headers.get("Cache-Control") == "no-store", path
                assert "other.example" in await resp.text()
        finally:
            object.__setattr__(settings, "public_url", embedded.app_url)


async def test_the_address_in_the_metadata_is_a_trusted_proxys_to_say_only(
        embedded: Embedded, session: aiohttp.ClientSession) -> None:
    """Without VAULTMAIL_PUBLIC_URL, the issuer and resource the metadata advertise are the
    address the request came to. X-Forwarded-Host and X-Forwarded-Proto say it only from a
    proxy in VAULTMAIL_TRUSTED_PROXIES, as X-Forwarded-For does: from anyone else they are
    the client's own words (it would pick the issuer and resource it is told)."""
    services = embedded.services
    services.settings = dataclasses.replace(services.settings, public_url="")
    own = embedded.app_url.rstrip("/")
    forwarded = {"X-Forwarded-Host": "evil.example", "X-Forwarded-Proto": "https"}

    async def advertised() -> tuple[str, str]:
        async with session.get(embedded.app_url + "/.well-known/oauth-authorization-server",
                               headers=forwarded) as resp:
            issuer = (await resp.json())["issuer"]
        async with session.get(embedded.app_url + "/.well-known/oauth-protected-resource/mcp",
                               headers=forwarded) as resp:
            return issuer, (await resp.json())["resource"]

    assert await advertised() == (own, own + "/mcp")
    services.settings = dataclasses.replace(services.settings,
                                            trusted_proxies=parse_proxies("127.0.0.1, ::1"))
    assert await advertised() == ("https://evil.example", "https://evil.example/mcp")
    # a proxy that appends: what the trusted one nearest the app wrote, never the client's
    forwarded = {"X-Forwarded-Host": "evil.example, vault.acme.com",
                 "X-Forwarded-Proto": "http, https"}
    assert await advertised() == ("https://vault.acme.com", "https://vault.acme.com/mcp")


async def test_the_oauth_tables_are_pruned(tmp_path: Path, database_url: str) -> None:
    from bot.store import open_store
    from bot.store.prune import DAY, prune

    now = 2_000_000_000.0
    store = await open_store(database_url or tmp_path / "index.sqlite3")
    try:
        for cid, at in (("vmcl_old_never", now - 2 * DAY), ("vmcl_new", now - 3600),
                        ("vmcl_old_allowed", now - 2 * DAY)):
            await oauth_rows.add_client(store, cid, "c", [REDIRECT], {}, at)
        await oauth_rows.add(store, [("request", "r-old")], grant_id="g0",
                             client_id="vmcl_new", principal=None, org=None,
                             resource="r", redirect_uri=REDIRECT, now=now - 2 * DAY,
                             lifetimes=LIFETIMES)
        await oauth_rows.allow(store, "c-live", grant_id="g1", client_id="vmcl_old_allowed",
                               principal=MARCO, org="acme", resource="r",
                               redirect_uri=REDIRECT, now=now - 3600, lifetimes=LIFETIMES)
        await oauth_rows.allow(store, "c-old", grant_id="g2", client_id="vmcl_old_allowed",
                               principal=MARCO, org="acme", resource="r",
                               redirect_uri=REDIRECT, now=now - 40 * DAY,
                               lifetimes=LIFETIMES)
        deleted = await prune(store, now=now, keep=7 * DAY)
        assert (deleted["oauth_grants"], deleted["oauth_consents"],
                deleted["oauth_clients"]) == (2, 1, 1), deleted
        clients = {r["client_id"] for r in await store.fetchall(
            "SELECT client_id FROM oauth_clients")}
        assert clients == {"vmcl_new", "vmcl_old_allowed"}
        assert await oauth_rows.find(store, "code", "c-live") is not None
    finally:
        await store.close()
