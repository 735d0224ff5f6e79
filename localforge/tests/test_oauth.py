"""GitHub's OAuth web flow for Apps: authorize (sign-in first, an authorize page, or straight
through once authorised), codes exchanged at /login/oauth/access_token, user access tokens
(`ghu_`, eight hours, refreshed with `ghr_`) that act as the user on the REST API within what
the App's installation can reach; driven by hand and by an unmodified OAuth client (Authlib)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qs, urlencode

import pytest
from authlib.integrations.httpx_client import AsyncOAuth2Client

from localforge import LocalForge

from .conftest import World
from .webclient import Browser, Reply, accessible

CALLBACK = "http://127.0.0.1:9/auth/callback"  # never visited: tests read the redirect


@dataclass
class Client:
    app_id: int
    client_id: str
    client_secret: str


@pytest.fixture
def client(world: World) -> Client:
    world.forge.set_callback_urls(world.app_id, [CALLBACK, "http://127.0.0.1:9/other"])
    client_id, secret = world.forge.client_credentials(world.app_id)
    return Client(world.app_id, client_id, secret)


@pytest.fixture
async def browser(world: World) -> AsyncIterator[Browser]:
    b = Browser.open(world.forge)
    yield b
    await b.close()


def authorize_path(client: Client, **extra: str) -> str:
    query = {"client_id": client.client_id, "redirect_uri": CALLBACK, "state": "s-123"}
    query.update(extra)
    return "/login/oauth/authorize?" + urlencode({k: v for k, v in query.items() if v})


async def authorize(browser: Browser, client: Client, login: str = "marco",
                    **extra: str) -> Reply:
    """Sign in if asked, press Authorize if asked; the reply that leaves for the callback."""
    reply = await browser.follow(await browser.get(authorize_path(client, **extra)))
    if reply.url.startswith(browser.forge.url + "/login?"):
        reply = await browser.follow(await browser.submit(
            reply, {"login": login, "password": browser.forge.user_password(login)}))
    if reply.status == 200:
        reply = await browser.submit(reply, button="authorize")
    assert reply.status == 302 and reply.location.startswith(CALLBACK), reply.body
    return reply


async def exchange(world: World, client: Client, accept: str | None = "application/json",
                   **fields: str) -> tuple[int, dict[str, Any], str]:
    data = {"client_id": client.client_id, "client_secret": client.client_secret}
    data.update(fields)
    headers = {"Accept": accept} if accept else {}
    async with world.session.post(world.url + "/login/oauth/access_token", data=data,
                                  headers=headers) as resp:
        raw = await resp.text()
        ctype = resp.headers.get("Content-Type", "")
        body = (json.loads(raw) if ctype.startswith("application/json")
                else {k: v[0] for k, v in parse_qs(raw, keep_blank_values=True).items()})
        return resp.status, body, ctype


async def user_token(world: World, browser: Browser, client: Client,
                     login: str = "marco") -> dict[str, Any]:
    code = (await authorize(browser, client, login)).query()["code"]
    status, body, _ = await exchange(world, client, code=code)
    assert status == 200 and "access_token" in body, body
    return body


async def test_the_whole_flow_by_hand(world: World, client: Client, browser: Browser) -> None:
    first = await browser.get(authorize_path(client))
    assert first.status == 302 and first.location.startswith("/login?")
    assert "return_to=" in first.location
    signin = await browser.follow(first)
    reply = await browser.follow(await browser.submit(
        signin, {"login": "marco", "password": world.forge.user_password("marco")}))
    assert reply.status == 200  # the authorize page
    page = reply.page
    accessible(page)
    assert "vaultmail" in page.find("h1")[0].text
    assert page.forms[0].method == "post" and page.forms[0].action == "/login/oauth/authorize"
    assert {b.get("value") for b in page.forms[0].buttons} >= {"authorize", "cancel"}
    back = await browser.submit(reply, button="authorize")
    assert back.status == 302 and back.location.startswith(CALLBACK + "?")
    q = back.query()
    assert q["state"] == "s-123" and len(q["code"]) == 20
    status, body, ctype = await exchange(world, client, code=q["code"], redirect_uri=CALLBACK)
    assert status == 200 and ctype.startswith("application/json")
    assert body["access_token"].startswith("ghu_") and body["token_type"] == "bearer"
    assert body["refresh_token"].startswith("ghr_") and body["scope"] == ""
    assert body["expires_in"] == 28800 and body["refresh_token_expires_in"] == 15811200
    status, _, me = await world.call("GET", "/user", auth=f"Bearer {body['access_token']}")
    assert status == 200 and me["login"] == "marco" and me["type"] == "User"
    assert me["email"] == "marco@acme.com" and "two_factor_authentication" in me
    # Authorised once: the next authorize goes straight through with a new code.
    again = await browser.get(authorize_path(client, state="s-2"))
    assert again.status == 302 and again.location.startswith(CALLBACK)
    assert again.query()["state"] == "s-2" and again.query()["code"] != q["code"]


async def test_answers_are_form_encoded_unless_json_is_asked_for(
        world: World, client: Client, browser: Browser) -> None:
    code = (await authorize(browser, client)).query()["code"]
    status, body, ctype = await exchange(world, client, accept=None, code=code)
    assert status == 200 and ctype.startswith("application/x-www-form-urlencoded")
    assert body["access_token"].startswith("ghu_") and body["token_type"] == "bearer"
    status, body, _ = await exchange(world, client, accept=None, code="nope")
    assert status == 200 and body["error"] == "bad_verification_code"


async def test_codes_are_single_use_and_last_ten_minutes(
        world: World, client: Client, browser: Browser) -> None:
    code = (await authorize(browser, client)).query()["code"]
    assert (await exchange(world, client, code=code))[1]["access_token"]
    status, body, _ = await exchange(world, client, code=code)
    assert status == 200 and body["error"] == "bad_verification_code"
    assert body["error_description"] == "The code passed is incorrect or expired."
    assert body["error_uri"].startswith("https://docs.github.com/")
    late = (await authorize(browser, client)).query()["code"]
    world.forge.clock.advance(601)
    assert (await exchange(world, client, code=late))[1]["error"] == "bad_verification_code"
    soon = (await authorize(browser, client)).query()["code"]
    world.forge.clock.advance(590)
    assert "access_token" in (await exchange(world, client, code=soon))[1]


async def test_exchange_errors_as_github_sends_them(
        world: World, client: Client, browser: Browser) -> None:
    code = (await authorize(browser, client)).query()["code"]
    wrong = Client(client.app_id, client.client_id, "0" * 40)
    status, body, _ = await exchange(world, wrong, code=code)
    assert status == 200 and body["error"] == "incorrect_client_credentials"
    status, body, _ = await exchange(world, client, code=code,
                                     redirect_uri="http://127.0.0.1:9/other")
    assert status == 200 and body["error"] == "redirect_uri_mismatch"
    assert body["error_description"] == ("The redirect_uri MUST match the registered callback "
                                         "URL for this application.")
    # A code is the App's it was issued to.
    other_id = world.forge.register_app(slug="other", name="other",
                                        public_key_pem=world.keys.public_pem,
                                        callback_urls=[CALLBACK])
    oid, osecret = world.forge.client_credentials(other_id)
    status, body, _ = await exchange(world, Client(other_id, oid, osecret), code=code)
    assert body["error"] == "bad_verification_code"
    # The failed tries above did not burn it.
    assert "access_token" in (await exchange(world, client, code=code))[1]
    status, body, _ = await exchange(world, client, grant_type="password")
    assert body["error"] == "unsupported_grant_type"


async def test_redirect_uri_must_be_a_registered_callback(
        world: World, client: Client, browser: Browser) -> None:
    await browser.sign_in("marco")
    reply = await browser.get(authorize_path(client, redirect_uri="https://evil.example/cb"))
    assert reply.status == 400
    assert "redirect_uri" in reply.page.text and "evil.example" in reply.page.text
    accessible(reply.page)
    assert not reply.location
    # Without redirect_uri, the first registered callback is used.
    reply = await browser.get(authorize_path(client, redirect_uri=""))
    if reply.status == 200:
        reply = await browser.submit(reply, button="authorize")
    assert reply.status == 302 and reply.location.startswith(CALLBACK + "?")
    unknown = await browser.get("/login/oauth/authorize?client_id=Iv1.nope")
    assert unknown.status == 404
    missing = await browser.get("/login/oauth/authorize")
    assert missing.status == 404


async def test_cancel_sends_access_denied_back(
        world: World, client: Client, browser: Browser) -> None:
    await browser.sign_in("rita")
    page = await browser.get(authorize_path(client))
    assert page.status == 200
    reply = await browser.submit(page, button="cancel")
    assert reply.status == 302 and reply.location.startswith(CALLBACK)
    q = reply.query()
    assert q["error"] == "access_denied" and q["state"] == "s-123" and "code" not in q
    assert (await browser.get(authorize_path(client))).status == 200  # still not authorised


async def test_authorize_form_needs_its_authenticity_token(
        world: World, client: Client, browser: Browser) -> None:
    await browser.sign_in("rita")
    page = await browser.get(authorize_path(client))
    reply = await browser.submit(page, {"authenticity_token": "forged"}, button="authorize")
    assert reply.status == 422 and not reply.location


async def test_login_hint_prefills_and_switches_account(
        world: World, client: Client, browser: Browser) -> None:
    first = await browser.follow(await browser.get(authorize_path(client, login="rita")))
    assert first.page.find("input", name="login")[0].attrs.get("value") == "rita"
    await browser.sign_in("marco")
    reply = await browser.follow(await browser.get(authorize_path(client, login="rita")))
    assert reply.url.startswith(world.url + "/login?")  # signed in as marco, asked for rita
    assert "marco" in reply.page.text
    done = await browser.follow(await browser.submit(
        reply, {"password": world.forge.user_password("rita")}))
    if done.status == 200:
        done = await browser.submit(done, button="authorize")
    code = done.query()["code"]
    token = (await exchange(world, client, code=code))[1]["access_token"]
    assert (await world.call("GET", "/user", auth=f"token {token}"))[2]["login"] == "rita"


async def test_user_tokens_expire_after_eight_hours_and_refresh(
        world: World, client: Client, browser: Browser) -> None:
    body = await user_token(world, browser, client)
    auth = f"token {body['access_token']}"
    world.forge.clock.advance(8 * 3600 - 5)
    assert (await world.call("GET", "/user", auth=auth))[0] == 200
    world.forge.clock.advance(10)
    status, _, err = await world.call("GET", "/user", auth=auth)
    assert status == 401 and err["message"] == "Bad credentials"
    status, fresh, _ = await exchange(world, client, grant_type="refresh_token",
                                      refresh_token=body["refresh_token"])
    assert status == 200 and fresh["access_token"].startswith("ghu_")
    assert fresh["refresh_token"] != body["refresh_token"]
    assert (await world.call("GET", "/user", auth=f"token {fresh['access_token']}"))[0] == 200
    status, again, _ = await exchange(world, client, grant_type="refresh_token",
                                      refresh_token=body["refresh_token"])
    assert again["error"] == "bad_refresh_token"
    # A refresh revokes the access token it replaces, expired or not.
    status, newer, _ = await exchange(world, client, grant_type="refresh_token",
                                      refresh_token=fresh["refresh_token"])
    assert "access_token" in newer
    assert (await world.call("GET", "/user", auth=f"token {fresh['access_token']}"))[0] == 401
    # Another App's secret cannot use this App's refresh token.
    other_id = world.forge.register_app(slug="other", name="other",
                                        public_key_pem=world.keys.public_pem,
                                        callback_urls=[CALLBACK])
    oid, osecret = world.forge.client_credentials(other_id)
    status, stolen, _ = await exchange(world, Client(other_id, oid, osecret),
                                       grant_type="refresh_token",
                                       refresh_token=newer["refresh_token"])
    assert stolen["error"] == "bad_refresh_token"


async def test_an_app_without_expiring_tokens_gets_plain_ones(
        world: World, browser: Browser) -> None:
    app_id = world.forge.register_app(slug="plain", name="plain",
                                      public_key_pem=world.keys.public_pem,
                                      callback_urls=[CALLBACK], expiring_user_tokens=False)
    cid, secret = world.forge.client_credentials(app_id)
    plain = Client(app_id, cid, secret)
    body = await user_token(world, browser, plain)
    assert set(body) == {"access_token", "token_type", "scope"}
    world.forge.clock.advance(30 * 86400)
    assert (await world.call("GET", "/user", auth=f"token {body['access_token']}"))[0] == 200


async def test_token_reaches_what_both_the_user_and_the_installation_reach(
        world: World, browser: Browser) -> None:
    forge = world.forge
    forge.add_repo("acme", "outside")  # marco can read it (org member); the App is not on it
    forge.set_permission("acme/outside", "marco", "write")
    app_id = forge.register_app(slug="narrow", name="narrow",
                                public_key_pem=world.keys.public_pem, callback_urls=[CALLBACK],
                                permissions={"issues": "read", "metadata": "read"})
    forge.install_app(app_id, "acme", repositories=["vault"])
    cid, secret = forge.client_credentials(app_id)
    narrow = Client(app_id, cid, secret)
    marco = f"token {(await user_token(world, browser, narrow))['access_token']}"
    assert (await world.call("GET", "/repos/acme/outside", "marco"))[0] == 200  # the PAT
    assert (await world.call("GET", "/repos/acme/outside", auth=marco))[0] == 404
    status, _, repo = await world.call("GET", "/repos/acme/vault", auth=marco)
    assert status == 200 and repo["permissions"]["pull"] and not repo["permissions"]["push"]
    assert (await world.call("GET", "/repos/acme/vault/issues", auth=marco))[0] == 200
    # The App may only read issues: marco's write access does not carry over.
    status, _, err = await world.call("POST", "/repos/acme/vault/issues", auth=marco,
                                      json_body={"title": "via narrow"})
    assert status == 403 and err["message"] == "Resource not accessible by integration"
    # olga (an outsider) authorises the App: it reaches nothing of acme for her.
    other = Browser.open(forge)
    try:
        olga = f"token {(await user_token(world, other, narrow, 'olga'))['access_token']}"
    finally:
        await other.close()
    assert (await world.call("GET", "/repos/acme/vault", auth=olga))[0] == 404


async def test_writes_with_a_user_token_are_the_users_via_the_app(
        world: World, client: Client, browser: Browser) -> None:
    token = (await user_token(world, browser, client))["access_token"]
    status, _, issue = await world.call("POST", "/repos/acme/vault/issues",
                                        auth=f"token {token}",
                                        json_body={"title": "by hand", "labels": ["mail:new"]})
    assert status == 201
    assert issue["user"]["login"] == "marco"
    assert issue["performed_via_github_app"]["slug"] == "vaultmail"
    assert [lb["name"] for lb in issue["labels"]] == ["mail:new"]  # marco may push
    # tina (triage) cannot push, whatever the App may do: her labels are dropped, as GitHub
    # drops them for anyone without push access.
    other = Browser.open(world.forge)
    try:
        tina = (await user_token(world, other, client, "tina"))["access_token"]
    finally:
        await other.close()
    status, _, issue = await world.call("POST", "/repos/acme/vault/issues",
                                        auth=f"token {tina}",
                                        json_body={"title": "tina's", "labels": ["mail:new"]})
    assert status == 201 and issue["user"]["login"] == "tina" and issue["labels"] == []


async def test_get_user_needs_a_user(world: World) -> None:
    status, _, body = await world.call("GET", "/user")
    assert status == 401 and body["message"] == "Requires authentication"
    token = await world.installation_token()
    status, _, body = await world.call("GET", "/user", auth=f"token {token}")
    assert status == 403 and body["message"] == "Resource not accessible by integration"
    status, _, me = await world.call("GET", "/user", "rita")
    assert status == 200 and me["login"] == "rita"
    assert me["html_url"] == f"{world.url}/rita"
    for key in ("private_gists", "total_private_repos", "owned_private_repos", "disk_usage",
                "collaborators", "two_factor_authentication", "plan", "created_at"):
        assert key in me, key
    status, _, me = await world.call("GET", "/api/v3/user", "rita")
    assert status == 200 and me["login"] == "rita"


async def test_at_most_2000_token_requests_an_hour_per_app(
        world: World, client: Client, browser: Browser) -> None:
    assert world.forge.limits.oauth_tokens_per_hour == 2000
    world.forge.limits.oauth_tokens_per_hour = 3
    for _ in range(3):
        assert (await exchange(world, client, code="x"))[1]["error"] == "bad_verification_code"
    code = (await authorize(browser, client)).query()["code"]
    async with world.session.post(world.url + "/login/oauth/access_token",
                                  data={"client_id": client.client_id,
                                        "client_secret": client.client_secret, "code": code},
                                  headers={"Accept": "application/json"}) as resp:
        assert resp.status == 429
        assert 1 <= int(resp.headers["Retry-After"]) <= 3600
        body = await resp.json()
        assert "secondary rate limit" in body["error_description"]
    # Another App has its own budget.
    other_id = world.forge.register_app(slug="other", name="other",
                                        public_key_pem=world.keys.public_pem,
                                        callback_urls=[CALLBACK])
    oid, osecret = world.forge.client_credentials(other_id)
    assert (await exchange(world, Client(other_id, oid, osecret), code="x"))[0] == 200
    world.forge.clock.advance(3601)  # the window has passed (and the code expired with it)
    code = (await authorize(browser, client)).query()["code"]
    assert "access_token" in (await exchange(world, client, code=code))[1]


async def test_authlib_client_end_to_end(world: World, client: Client,
                                         browser: Browser) -> None:
    """Authlib's OAuth 2 client, unmodified: its authorization URL (with PKCE, which GitHub
    accepts and the forge too), its token request (client_secret_post), its refresh."""
    oauth = AsyncOAuth2Client(client.client_id, client.client_secret, redirect_uri=CALLBACK,
                              token_endpoint_auth_method="client_secret_post",
                              code_challenge_method="S256")
    try:
        verifier = "v" * 64
        url, state = oauth.create_authorization_url(
            world.url + "/login/oauth/authorize", code_verifier=verifier)
        await browser.sign_in("marco")
        reply = await browser.get(url)
        if reply.status == 200:
            reply = await browser.submit(reply, button="authorize")
        assert reply.status == 302 and reply.query()["state"] == state
        token = await oauth.fetch_token(world.url + "/login/oauth/access_token",
                                        authorization_response=reply.location,
                                        code_verifier=verifier,
                                        headers={"Accept": "application/json"})
        assert token["access_token"].startswith("ghu_") and token["expires_in"] == 28800
        me = await oauth.get(world.url + "/user")
        assert me.status_code == 200 and me.json()["login"] == "marco"
        refreshed = await oauth.refresh_token(world.url + "/login/oauth/access_token",
                                              headers={"Accept": "application/json"})
        assert refreshed["access_token"] != token["access_token"]
        assert (await oauth.get(world.url + "/user")).json()["login"] == "marco"
    finally:
        await oauth.aclose()


async def test_pkce_verifier_is_checked_when_a_challenge_was_sent(
        world: World, client: Client, browser: Browser) -> None:
    import base64
    import hashlib

    verifier = "w" * 50
    challenge = base64.urlsafe_b64encode(
        hashlib.sha256(verifier.encode()).digest()).rstrip(b"=").decode()
    code = (await authorize(browser, client, code_challenge=challenge,
                            code_challenge_method="S256")).query()["code"]
    status, body, _ = await exchange(world, client, code=code, code_verifier="x" * 50)
    assert body["error"] == "bad_verification_code"
    assert "access_token" in (await exchange(world, client, code=code,
                                             code_verifier=verifier))[1]


async def test_oauth_flow_over_http_seeding(hooks: object, keys: object) -> None:
    """An App registered over /_forge/apps with callback URLs gets its client id and secret
    back, for a process that seeds the forge from outside."""
    import aiohttp

    forge = LocalForge()
    await forge.start()
    try:
        async with aiohttp.ClientSession() as s:
            await s.post(forge.url + "/_forge/users", json={"login": "owner"})
            async with s.post(forge.url + "/_forge/apps", json={
                    "slug": "x", "public_key_pem": keys.public_pem,  # type: ignore[attr-defined]
                    "owner": "owner", "callback_urls": [CALLBACK]}) as resp:
                body = await resp.json()
        assert resp.status == 201
        assert body["client_id"].startswith("Iv") and len(body["client_secret"]) == 40
        assert forge.state.apps[body["id"]].callback_urls == [CALLBACK]
    finally:
        await forge.stop()
