"""The console over plain HTTP: sign-in and its cookies, CSRF, API tokens, who sees what, the
ledger's chain, the live stream. (What a person does in the pages is in test_browser.py.)"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
import re
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
from yarl import URL

from bot.app.embedded import Embedded
from bot.app.settings import Settings, parse_proxies
from bot.store import ledger
from tests.items_support import MARCO, SARA, SCOUT, TOKEN_TTL, make_item, where
from tests.support import Actor, ToolClient, redirected_elsewhere

LEE = "human:lee@acme.com"


def bearer(embedded: Embedded, principal: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {embedded.api_tokens[principal]}"}


async def get(session: aiohttp.ClientSession, embedded: Embedded, path: str,
              principal: str | None = None) -> tuple[int, str, aiohttp.ClientResponse]:
    headers = bearer(embedded, principal) if principal else {}
    async with session.get(embedded.app_url + path, headers=headers,
                           allow_redirects=False) as resp:
        return resp.status, await resp.text(), resp


async def test_a_request_without_a_session_is_sent_to_sign_in(
        embedded: Embedded, session: aiohttp.ClientSession) -> None:
    status, _, resp = await get(session, embedded, "/console/mail?state=new")
    where = URL(resp.headers["Location"])
    assert status == 303 and where.path == "/console/sign-in"
    assert where.query["next"] == "/console/mail?state=new"
    status, _, resp = await get(session, embedded, "/")
    assert status == 302 and resp.headers["Location"] == "/console/inbox"
    status, body, _ = await get(session, embedded, "/console/events")
    assert status == 401 and json.loads(body)["error"]["code"] == "unauthenticated"
    status, body, resp = await get(session, embedded, "/console/sign-in")
    assert status == 200 and "Sign in with the forge" in body and "API token" in body
    assert "default-src 'self'" in resp.headers["Content-Security-Policy"]
    # framed by no one, also where a browser knows no frame-ancestors (CSP level 1)
    assert resp.headers["X-Frame-Options"] == "DENY"


async def test_pages_take_an_api_token_and_are_for_people_only(
        embedded: Embedded, session: aiohttp.ClientSession) -> None:
    for path in ("/console/inbox", "/console/mail", "/console/agents", "/console/agents/scout",
                 "/console/ledger"):
        status, body, _ = await get(session, embedded, path, MARCO)
        assert status == 200, (path, body[:300])
        assert "Signed in as <strong>marco</strong>" in body
    status, body, _ = await get(session, embedded, "/console/inbox", SCOUT)
    assert status == 403 and "the console is for the office&#39;s people" in body
    async with session.get(embedded.app_url + "/console/inbox",
                           headers={"Authorization": "Bearer vm_nope"}) as resp:
        assert resp.status == 401 and "unknown or revoked" in await resp.text()


def _field(html: str, name: str) -> str:
    found = re.search(rf'name="{name}" value="([^"]*)"', html)
    assert found, name
    return found.group(1)


async def test_token_sign_in_makes_a_session_and_every_form_needs_its_csrf_token(
        embedded: Embedded) -> None:
    async with aiohttp.ClientSession(cookie_jar=aiohttp.CookieJar(unsafe=True)) as browser:
        url = embedded.app_url + "/console"
        async with browser.get(url + "/sign-in?next=/console/mail") as resp:
            page = await resp.text()
        token = embedded.api_tokens[MARCO]
        form = {"csrf": "forged", "token": token, "next": _field(page, "next")}
        async with browser.post(url + "/sign-in/token", data=form) as resp:
            assert resp.status == 403 and "CSRF" in await resp.text(), "no login CSRF"
        form["csrf"] = _field(page, "csrf")
        async with browser.post(url + "/sign-in/token", data=form,
                                allow_redirects=False) as resp:
            assert resp.status == 303 and resp.headers["Location"] == "/console/mail"
            cookie = resp.headers.getall("Set-Cookie")
        [session_cookie] = [c for c in cookie if c.startswith("vaultmail_session=")]
        assert "HttpOnly" in session_cookie and "SameSite=Lax" in session_cookie
        assert "Path=/console" in session_cookie and "Secure" not in session_cookie, (
            "Secure only over https: this app is served over http")

        async with browser.get(url + "/mail") as resp:
            page = await resp.text()
        csrf = _field(page, "csrf")
        send = {"to": "scout", "subject": "No token", "body": "x"}
        async with browser.post(url + "/mail/send", data=send) as resp:
            assert "CSRF token does not match" in await resp.text()
        async with browser.post(url + "/mail/send", data={**send, "csrf": csrf}) as resp:
            assert "Sent to agent:scout: acme/scout-vault#1" in await resp.text()
        await embedded.settle()
        assert [m.subject for m in await _mails(embedded)] == ["No token"]

        async with browser.post(url + "/sign-out", data={"csrf": csrf},
                                allow_redirects=False) as resp:
            assert resp.status == 303
        async with browser.get(url + "/mail", allow_redirects=False) as resp:
            assert resp.status == 303, "the session ended with sign-out"


async def _mails(embedded: Embedded) -> list[Any]:
    from bot.store import mails

    return await mails.all_mails(embedded.services.store)


async def test_the_same_rules_as_the_tools_with_the_reason_shown(
        embedded: Embedded, session: aiohttp.ClientSession) -> None:
    status, body, _ = await get(session, embedded, "/console/mail", LEE)
    assert "You cannot send mail: human:lee@acme.com lacks the mail.send permission" in body
    async with session.post(embedded.app_url + "/console/mail/send", headers=bearer(
            embedded, LEE), data={"to": "scout", "subject": "Hi", "body": "x"}) as resp:
        assert resp.status == 403 and "lacks the mail.send permission" in await resp.text()
    denied = await embedded.ledger_events("run.denied")
    assert [(e.actor, e.subject) for e in denied] == [(LEE, "mail to agent:scout")]
    async with session.post(embedded.app_url + "/console/agents/critic/chat", headers=bearer(
            embedded, MARCO), data={"message": "hi"}) as resp:
        assert resp.status == 409 and "does not take chat runs" in await resp.text()


async def test_a_person_sees_only_what_their_forge_account_may_see(
        embedded: Embedded, session: aiohttp.ClientSession, tools: Any) -> None:
    marco = tools(MARCO)
    to_scout = await marco("mail_send", to="scout", subject="For scout", body="x")
    await marco("mail_send", to="echo", subject="For echo", body="y")
    await embedded.settle()
    _, body, _ = await get(session, embedded, "/console/mail", SARA)
    assert "For echo" in body, "sara is echo's person"
    assert "For scout" not in body, "a mail is for its parties, the recipient's person, editors"
    thread = to_scout["mail"]["thread_id"]
    status, body, _ = await get(session, embedded, f"/console/mail/{thread}", SARA)
    assert status == 404 and "no mail thread" in body
    status, body, _ = await get(session, embedded, f"/console/mail/{thread}", MARCO)
    assert status == 200 and "Signature verified" in body
    assert 'name="inReplyTo" value="acme/scout-vault#1"' in body, "write again in the thread"
    async with session.post(embedded.app_url + "/console/mail/send", headers=bearer(
            embedded, MARCO), data={"to": "scout", "subject": "Re: For scout", "body": "z",
                                    "inReplyTo": "acme/scout-vault#1"}) as resp:
        assert resp.status == 200
    await embedded.settle()
    thread_mails = [m for m in await _mails(embedded) if m.thread_id == thread]
    assert [m.subject for m in thread_mails] == ["For scout", "Re: For scout"]

    # lee leaves the org: their forge account no longer sees the vaults, nor the desks
    status, body, _ = await get(session, embedded, "/console/agents/scout", LEE)
    assert status == 200
    embedded.forge.remove_org_member("acme", "lee")
    for vault in embedded.office.vaults():
        embedded.forge.remove_permission(vault, "lee")
    embedded.services.visibility.forget(login="lee")
    status, body, _ = await get(session, embedded, "/console/agents/scout", LEE)
    assert status == 404 and "no agent &#39;scout&#39; whose desk you may see" in body
    _, body, _ = await get(session, embedded, "/console/agents", LEE)
    assert "sees none of the agents" in body


async def test_the_ledger_page_filters_and_shows_the_chain(
        embedded: Embedded, session: aiohttp.ClientSession, tools: Any) -> None:
    await tools(MARCO)("mail_send", to="scout", subject="Ledgered", body="x")
    await embedded.settle()
    _, body, _ = await get(session, embedded, "/console/ledger?kind=mail.sent", MARCO)
    assert "Hash chain intact" in body and "<code>mail.sent</code>" in body
    assert "<code>run.queued</code>" not in body
    _, body, _ = await get(session, embedded, "/console/ledger?principal=agent%3Ascout", MARCO)
    assert "<code>mail.sent</code>" not in body
    _, body, _ = await get(session, embedded, "/console/ledger?from=2999-01-01", MARCO)
    assert "No entries you may see match these filters" in body
    _, body, _ = await get(session, embedded, "/console/ledger", SARA)
    assert "<code>mail.sent</code>" not in body, "sara may not see marco's mail to scout"
    status, body, _ = await get(session, embedded, "/console/ledger?kind=mail.nope", MARCO)
    assert status == 422 and "is not a ledger event" in body

    async with embedded.services.store.transaction() as db:
        await db.execute("UPDATE ledger SET actor='human:sara@acme.com' WHERE seq=1")
    _, body, _ = await get(session, embedded, "/console/ledger", MARCO)
    assert "Hash chain broken at entry #1" in body


async def _events(resp: aiohttp.ClientResponse) -> Any:
    """The `change` events of a live stream, as they come."""
    event: dict[str, str] = {}
    async for raw in resp.content:
        line = raw.decode().rstrip("\n")
        if not line:
            if event.get("event") == "change":
                yield json.loads(event["data"])
            event = {}
        elif not line.startswith(":") and ":" in line:
            key, _, value = line.partition(":")
            event[key] = value.strip()


async def test_the_live_stream_tells_of_something_new_at_once(
        embedded: Embedded, session: aiohttp.ClientSession, person: Any) -> None:
    outcome = await make_item(embedded, person("marco"), "outcome", "Auth",
                              assignees=["scout-bot"])
    async with session.get(embedded.app_url + "/console/events",
                           headers=bearer(embedded, MARCO)) as resp:
        assert resp.headers["Content-Type"] == "text/event-stream"
        changes = _events(resp)
        first = await asyncio.wait_for(anext(changes), 10)
        assert first["badge"] == 0
        await ToolClient(session, embedded, SCOUT)("add_comment", target=outcome, **TOKEN_TTL)
        second = await asyncio.wait_for(anext(changes), 10)
        assert second["badge"] == 1 and second["version"] != first["version"]


async def test_the_forge_callback_refuses_what_it_did_not_start(
        embedded: Embedded, session: aiohttp.ClientSession) -> None:
    status, body, _ = await get(session, embedded, "/console/oauth/callback?code=x&state=y")
    assert status == 403 and "did not start here" in body
    # anyone's link may carry an error: its words are never shown on this site, nor is an
    # error at all unless the sign-in started here
    phish = ("&error_description=Your+account+is+locked%3A+call+%2B1+555+0100"
             "+or+visit+evil.example")
    status, body, _ = await get(session, embedded, "/console/oauth/callback?error=access_denied"
                                + phish)
    assert status == 403 and "did not start here" in body and "evil.example" not in body
    async with aiohttp.ClientSession(cookie_jar=aiohttp.CookieJar(unsafe=True)) as browser:
        async with browser.get(embedded.app_url + "/console/sign-in/forge",
                               allow_redirects=False) as resp:
            where = resp.headers["Location"]
        assert where.startswith(embedded.forge.url + "/login/oauth/authorize?")
        assert "code_challenge_method=S256" in where and "client_id=Iv1." in where
        state = re.search(r"state=([^&]+)", where)
        assert state
        callback = embedded.app_url + "/console/oauth/callback?state=" + state.group(1)
        async with browser.get(callback + "&error=access_denied" + phish) as resp:
            page = await resp.text()
            assert resp.status == 401 and "access_denied" in page, page
            assert "evil.example" not in page and "locked" not in page
        async with browser.get(callback + "&error=Call+555+0100+now" + phish) as resp:
            page = await resp.text()
            assert resp.status == 401 and "did not sign you in" in page
            # (the words, not "555" alone: a loopback port may hold those digits)
            assert "555 0100" not in page and "evil.example" not in page
        async with browser.get(embedded.app_url + "/console/oauth/callback?code=bogus&state="
                               + state.group(1)) as resp:
            assert resp.status == 401 and "bad_verification_code" in await resp.text()


def token_requests(embedded: Embedded) -> int:
    """The `POST /login/oauth/access_token` requests the forge has had (its own count of
    them, per App: web routes are not in its API request log)."""
    return sum(len(hits) for key, hits in embedded.forge.rates.hits.items()
               if key.startswith("oauth:"))


async def test_one_address_cannot_make_the_app_ask_the_forge_for_tokens_without_end(
        embedded: Embedded) -> None:
    """Acted out (found by review): with a state cookie from the sign-in start page (or one
    it made up: the cookie is the browser's), a stranger called the callback with a made-up
    code as often as they liked, and each call cost the app a POST to the forge's
    /login/oauth/access_token with the App's OAuth client credentials (50 calls: 50 POSTs),
    where the forge counts every one against the App (GitHub: 2,000 an hour, then everyone's
    sign-in is refused). Now one address is admitted SIGN_INS_PER_MINUTE such trades, and as
    many starts, a minute; past that a 429 page with Retry-After saying to wait a minute."""
    from bot.console import signin

    limit = signin.SIGN_INS_PER_MINUTE
    before = token_requests(embedded)
    async with aiohttp.ClientSession(cookie_jar=aiohttp.CookieJar(unsafe=True)) as browser:
        async with browser.get(embedded.app_url + "/console/sign-in/forge",
                               allow_redirects=False) as resp:
            state = re.search(r"state=([^&]+)", resp.headers["Location"])
        assert state
        statuses = []
        for n in range(limit + 20):
            async with browser.get(embedded.app_url + f"/console/oauth/callback?code=made-up-{n}"
                                   f"&state={state.group(1)}", allow_redirects=False) as resp:
                statuses.append(resp.status)
                page, wait = await resp.text(), resp.headers.get("Retry-After")
    assert token_requests(embedded) - before == limit, token_requests(embedded) - before
    assert statuses == [401] * limit + [429] * 20, statuses
    assert wait == "60" and "wait a minute" in page, (wait, page[-800:])
    # a made-up cookie is as good as one the start page gave: the limit is on the trade
    async with aiohttp.ClientSession(cookie_jar=aiohttp.CookieJar(unsafe=True)) as other:
        other.cookie_jar.update_cookies({signin.STATE_COOKIE: "s:v::"}, URL(embedded.app_url))
        async with other.get(embedded.app_url + "/console/oauth/callback?code=x&state=s",
                             allow_redirects=False) as resp:
            assert resp.status == 429, resp.status
    assert token_requests(embedded) - before == limit
    # the start page: as many a minute, then the same answer
    async with aiohttp.ClientSession() as browser:
        starts = []
        for _ in range(limit + 2):
            async with browser.get(embedded.app_url + "/console/sign-in/forge",
                                   allow_redirects=False) as resp:
                starts.append(resp.status)
                page, wait = await resp.text(), resp.headers.get("Retry-After")
    assert starts == [303] * (limit - 1) + [429] * 3, starts  # (one start above)
    assert wait == "60" and "wait a minute" in page, (wait, page[-800:])


async def test_answers_and_refusals_come_back_as_pages(
        embedded: Embedded, session: aiohttp.ClientSession, person: Any) -> None:
    outcome = await make_item(embedded, person("marco"), "outcome", "Auth",
                              assignees=["scout-bot"])
    asked = await ToolClient(session, embedded, SCOUT)("add_comment", target=outcome,
                                                       **TOKEN_TTL)
    answer = {"thread": asked["comment"]["id"], "target": outcome, "targetType": "outcome",
              "option": "1"}
    url = embedded.app_url + "/console/inbox/answer"
    async with session.post(url, data=answer, headers=bearer(embedded, MARCO),
                            allow_redirects=False) as resp:
        assert resp.status == 303
    async with session.post(url, data=answer, headers=bearer(embedded, MARCO)) as resp:
        assert resp.status == 409 and "already answered" in await resp.text()
    async with session.post(url, data=answer, headers=bearer(embedded, SARA)) as resp:
        assert resp.status == 403 and "only those the question asks" in await resp.text()
    actor = Actor(session, embedded, "admin")
    assert any("Keep 30 days" in c["body"] for c in await actor.comments(
        *outcome.split("#")[0:1], int(outcome.split("#")[1])))


def test_serve_reads_the_oauth_client_and_the_public_address() -> None:
    env = {"GITHUB_APP_ID": "7", "GITHUB_WEBHOOK_SECRET": "s", "GITHUB_CLIENT_ID": "Iv1.abc",
           "GITHUB_CLIENT_SECRET": "shh", "VAULTMAIL_PUBLIC_URL": "https://vault.acme.com/",
           "PRIVATE_KEY": "-----BEGIN PRIVATE KEY-----\\nx\\n-----END PRIVATE KEY-----"}
    settings = Settings.from_env(env=env)
    assert (settings.client_id, settings.client_secret) == ("Iv1.abc", "shh")
    assert settings.public_url == "https://vault.acme.com" and not settings.token_sign_in
    assert settings.web_url == "https://github.com", "api.github.com signs in on github.com"
    ghe = Settings.from_env(env={**env, "GHE_HOST": "git.acme.com"})
    assert ghe.web_url == "https://git.acme.com"


async def test_over_https_the_session_cookie_is_secure(embedded: Embedded) -> None:
    services = embedded.services
    services.settings = dataclasses.replace(services.settings,
                                            public_url="https://vault.acme.com")
    async with aiohttp.ClientSession() as http:  # (the test speaks http to it: no jar)
        async with http.get(embedded.app_url + "/console/sign-in") as resp:
            page = await resp.text()
            [pre] = resp.headers.getall("Set-Cookie")
        assert "Secure" in pre, "the sign-in form's own cookie too"
        async with http.post(embedded.app_url + "/console/sign-in/token", data={
                "csrf": _field(page, "csrf"), "token": embedded.api_tokens[MARCO]},
                headers={"Cookie": pre.split(";")[0]}, allow_redirects=False) as resp:
            [cookie] = [c for c in resp.headers.getall("Set-Cookie")
                        if c.startswith("__Host-vaultmail_session=")]
    assert "Secure" in cookie and "HttpOnly" in cookie


def _cookie(headers: list[str], name: str) -> str:
    found = [c for c in headers if c.startswith(name + "=")]
    assert len(found) == 1, (name, headers)
    return found[0]


async def test_over_https_no_other_site_can_plant_the_consoles_cookies(
        embedded: Embedded) -> None:
    """Over https the session, the sign-in form's token and the OAuth state are `__Host-`
    cookies (Secure, Path=/, no Domain), which a browser takes from this origin over https
    only (RFC 6265bis §4.1.3.2). Before, they were plain names: a page of a sibling subdomain
    (`Set-Cookie: vaultmail_session=...; Domain=acme.com`) or a man in the middle of any
    plain-http request to the host could plant the attacker's own session in a person's
    browser (they then write to the attacker's inbox) or the sign-in form's token, and the
    app took it. A cookie by the plain name is no session there."""
    services, forge = embedded.services, embedded.forge
    public = "https://vault.acme.com"
    services.settings = dataclasses.replace(services.settings, public_url=public)
    (app_id,) = forge.state.apps
    forge.set_callback_urls(int(app_id), [public + "/console/oauth/callback"])
    forge.state.web.authorizations.setdefault("marco", []).append(int(app_id))
    async with aiohttp.ClientSession() as http:  # (it speaks http to the app: no jar)
        async with http.get(embedded.app_url + "/console/sign-in") as resp:
            page = await resp.text()
            pre = _cookie(resp.headers.getall("Set-Cookie"), "__Host-vaultmail_signin")
        async with http.post(embedded.app_url + "/console/sign-in/token", data={
                "csrf": _field(page, "csrf"), "token": embedded.api_tokens[MARCO]},
                headers={"Cookie": pre.split(";")[0]}, allow_redirects=False) as resp:
            assert resp.status == 303, await resp.text()
            made = _cookie(resp.headers.getall("Set-Cookie"), "__Host-vaultmail_session")
        for cookie in (pre, made):
            attributes = [a.strip().lower() for a in cookie.split(";")[1:]]
            assert "secure" in attributes and "path=/" in attributes, cookie
            assert not any(a.startswith("domain") for a in attributes), cookie
        value = made.split(";")[0].partition("=")[2]
        async with http.get(embedded.app_url + "/console/inbox", allow_redirects=False,
                            headers={"Cookie": f"vaultmail_session={value}"}) as resp:
            assert resp.status == 303, "a cookie anyone may have planted is no session"
        async with http.get(embedded.app_url + "/console/inbox", allow_redirects=False,
                            headers={"Cookie": f"__Host-vaultmail_session={value}"}) as resp:
            page = await resp.text()
            assert resp.status == 200, page[:300]
        async with http.post(embedded.app_url + "/console/sign-out", allow_redirects=False,
                             data={"csrf": _field(page, "csrf")},
                             headers={"Cookie": f"__Host-vaultmail_session={value}"}) as resp:
            assert resp.status == 303
            gone = _cookie(resp.headers.getall("Set-Cookie"), "__Host-vaultmail_session")
        # (a browser drops a `__Host-` deletion without Secure and Path=/, keeping the cookie)
        assert "Max-Age=0" in gone and "Secure" in gone and "Path=/;" in gone + ";", gone

        # the forge's OAuth web flow: its state cookie likewise, and its session
        async with http.get(embedded.app_url + "/console/sign-in/forge",
                            allow_redirects=False) as resp:
            authorize = resp.headers["Location"]
            state = _cookie(resp.headers.getall("Set-Cookie"), "__Host-vaultmail_oauth")
        assert "Secure" in state and "Path=/;" in state + ";", state
        async with http.get(authorize, allow_redirects=False, headers={
                "Authorization": f"token {embedded.forge_tokens['marco']}"}) as resp:
            back = URL(resp.headers["Location"])
        assert str(back).startswith(public + "/console/oauth/callback?"), back
        async with http.get(embedded.app_url + back.path_qs, allow_redirects=False,
                            headers={"Cookie": state.split(";")[0]}) as resp:
            assert resp.status == 303, await resp.text()
            _cookie(resp.headers.getall("Set-Cookie"), "__Host-vaultmail_session")


async def test_behind_a_tls_proxy_the_session_cookie_is_secure(embedded: Embedded) -> None:
    """With no VAULTMAIL_PUBLIC_URL, behind an ingress that ends TLS and speaks http to the
    app: its X-Forwarded-Proto (a proxy in VAULTMAIL_TRUSTED_PROXIES) says the browser is on
    https, and the cookies go out Secure. The same header from anyone else says nothing."""
    services = embedded.services
    services.settings = dataclasses.replace(services.settings, public_url="")
    tls = {"X-Forwarded-Proto": "https"}

    async def cookies() -> list[str]:
        async with aiohttp.ClientSession() as http:  # (no jar: the cookies as sent)
            async with http.get(embedded.app_url + "/console/sign-in", headers=tls) as resp:
                page = await resp.text()
                [pre] = resp.headers.getall("Set-Cookie")
            async with http.post(embedded.app_url + "/console/sign-in/token", data={
                    "csrf": _field(page, "csrf"), "token": embedded.api_tokens[MARCO]},
                    headers={**tls, "Cookie": pre.split(";")[0]},
                    allow_redirects=False) as resp:
                [session] = [c for c in resp.headers.getall("Set-Cookie")
                             if c.partition("=")[0].endswith("vaultmail_session")]
        return [pre, session]

    assert not any("Secure" in c for c in await cookies()), "a client's own word"
    services.settings = dataclasses.replace(services.settings,
                                            trusted_proxies=parse_proxies("127.0.0.1, ::1"))
    assert all("Secure" in c for c in await cookies())


async def test_api_token_sign_in_is_for_the_embedded_default_only(embedded: Embedded) -> None:
    services = embedded.services
    services.settings = dataclasses.replace(services.settings, token_sign_in=False)
    async with aiohttp.ClientSession(cookie_jar=aiohttp.CookieJar(unsafe=True)) as browser:
        async with browser.get(embedded.app_url + "/console/sign-in") as resp:
            page = await resp.text()
        assert "API token" not in page and "Sign in with the forge" in page
        async with browser.post(embedded.app_url + "/console/sign-in/token", data={
                "csrf": "x", "token": embedded.api_tokens[MARCO]}) as resp:
            assert resp.status == 403 and "embedded default only" in await resp.text()


def _section(page: str, heading_id: str) -> str:
    """The HTML of the inbox section headed `heading_id`, up to the next section."""
    start = page.index(f'<h2 id="{heading_id}">')
    end = page.find("<section", start)
    return page[start:end if end >= 0 else len(page)]


async def test_the_inbox_shows_unread_waiting_and_what_your_agents_are_handling(
        embedded: Embedded, session: aiohttp.ClientSession, person: Any, tools: Any) -> None:
    """Below the card stack: the person's unread comments, their questions waiting on others,
    and, as history only (no badge, nothing to answer), what their agents are handling."""
    outcome = await make_item(embedded, person("marco"), "outcome", "Auth",
                              assignees=["scout-bot"])
    marco, sara = tools(MARCO), tools(SARA)
    base = {"targetType": "outcome", "target": outcome}
    await sara("add_comment", **base, body="For Marco himself", to=["marco@acme.com"])
    await sara("add_comment", **base, body="For the agent on it")
    await marco("add_comment", **{**TOKEN_TTL, **base, "to": ["sara@acme.com"]})
    await embedded.settle()
    status, page, _ = await get(session, embedded, "/console/inbox?part=live", MARCO)
    assert status == 200, page
    unread, waiting = _section(page, "unread"), _section(page, "waiting")
    history = _section(page, "history")
    assert "For Marco himself" in unread and "For the agent on it" not in unread
    assert "Token TTL" in waiting and "asked of sara" in waiting
    assert "sara@acme.com to scout" in history and "For the agent on it" in history
    assert "<form" not in history and "<button" not in history, "history, nothing to answer"


@contextlib.asynccontextmanager
async def signed_in(embedded: Embedded, principal: str) -> AsyncIterator[
        tuple[aiohttp.ClientSession, str]]:
    """A client signed in as a browser is (the API token form, then the session cookie), and
    its session's CSRF token, read from a page as a form would carry it."""
    async with aiohttp.ClientSession(cookie_jar=aiohttp.CookieJar(unsafe=True)) as browser:
        url = embedded.app_url + "/console"
        async with browser.get(url + "/sign-in") as resp:
            form = {"csrf": _field(await resp.text(), "csrf"),
                    "token": embedded.api_tokens[principal]}
        async with browser.post(url + "/sign-in/token", data=form,
                                allow_redirects=False) as resp:
            assert resp.status == 303, await resp.text()
        async with browser.get(url + "/mail") as resp:
            yield browser, _field(await resp.text(), "csrf")


def _form(page: str, action: str) -> dict[str, str]:
    """The hidden fields of the (first) form of `page` that posts to `action`."""
    found = re.search(rf'<form method="post" action="{re.escape(action)}"[^>]*>(.*?)</form>',
                      page, re.S)
    assert found, f"no form posting to {action}"
    return dict(re.findall(r'<input type="hidden" name="(\w+)" value="([^"]*)">',
                           found.group(1)))


async def test_the_inbox_shows_updates_on_the_outcomes_a_person_owns_as_they_come(
        embedded: Embedded, session: aiohttp.ClientSession, person: Any) -> None:
    """What others did on an outcome the person created: a plan under it, the claim, its
    status; newest first, each with who and a link to the item; never their own doings."""
    marco, sara = person("marco"), person("sara")
    outcome = await make_item(embedded, marco, "outcome", "Checkout")
    repo, n = where(outcome)
    plan = await make_item(embedded, sara, "plan", "Plan A", body=f"Part of #{n}")
    await sara.call("PATCH", f"/repos/{repo}/issues/{n}", {"assignees": ["builder-bot"]},
                    expect=200)
    await embedded.settle()
    _, page, _ = await get(session, embedded, "/console/inbox", MARCO)
    updates = re.findall(r"<li>(.*?)</li>", _section(page, "updates"), re.S)
    assert len(updates) == 2, updates
    assert "builder-bot assigned; the claim is now held by agent:builder" in updates[0]
    assert f"new plan {plan}: Plan A" in updates[1]
    web = embedded.services.settings.web_url
    assert all("sara@acme.com" in u and f'href="{web}/{repo}/issues/{n}"' in u
               for u in updates)
    _, page, _ = await get(session, embedded, "/console/inbox", SARA)
    assert "No updates on your outcomes." in _section(page, "updates"), "sara did it herself"

    # a new update reaches an open inbox page without a reload (the stream says it changed)
    async with session.get(embedded.app_url + "/console/events",
                           headers=bearer(embedded, MARCO)) as resp:
        changes = _events(resp)
        first = await asyncio.wait_for(anext(changes), 10)
        await sara.call("PATCH", f"/repos/{repo}/issues/{n}", {"state": "closed"}, expect=200)
        second = await asyncio.wait_for(anext(changes), 10)
        assert second["version"] != first["version"]
    _, page, _ = await get(session, embedded, "/console/inbox?part=live", MARCO)
    updates = re.findall(r"<li>(.*?)</li>", _section(page, "updates"), re.S)
    assert len(updates) == 3 and "outcome closed: Checkout" in updates[0]


async def test_an_update_reaches_the_open_page_of_someone_who_asked_on_the_outcome(
        embedded: Embedded, session: aiohttp.ClientSession, person: Any, tools: Any) -> None:
    """Updates reach the people who asked a question on the outcome too, not only its
    author: their open inbox page hears of a new update without a reload."""
    marco, sara = person("marco"), person("sara")
    outcome = await make_item(embedded, marco, "outcome", "Checkout")
    repo, n = where(outcome)
    await tools(LEE)("add_comment", targetType="outcome", target=outcome, header="When?",
                     body="When does it ship?", to=["marco@acme.com"],
                     options=[{"label": "Friday"}, {"label": "Monday"}])
    await embedded.settle()
    async with session.get(embedded.app_url + "/console/events",
                           headers=bearer(embedded, LEE)) as resp:
        changes = _events(resp)
        first = await asyncio.wait_for(anext(changes), 10)
        await make_item(embedded, sara, "plan", "Plan B", body=f"Part of #{n}")
        second = await asyncio.wait_for(anext(changes), 10)
        assert second["version"] != first["version"]
    _, page, _ = await get(session, embedded, "/console/inbox?part=live", LEE)
    assert "Plan B" in _section(page, "updates")


async def test_the_asker_resolves_an_answered_question_from_its_card(
        embedded: Embedded, session: aiohttp.ClientSession, person: Any, tools: Any) -> None:
    outcome = await make_item(embedded, person("marco"), "outcome", "Auth")
    asked = await tools(SARA)("add_comment", **TOKEN_TTL, target=outcome)
    thread = asked["comment"]["id"]
    await tools(MARCO)("add_comment", targetType="outcome", target=outcome, parent=thread,
                       option="1")
    await embedded.settle()
    async with signed_in(embedded, SARA) as (browser, _):
        inbox = embedded.app_url + "/console/inbox"
        async with browser.get(inbox) as resp:
            page = await resp.text()
        card = _section(page, "your-turn")
        assert "A reply to your question" in card and "Keep 30 days" in card
        resolve = _form(card, "/console/inbox/resolve")
        assert resolve["thread"] == thread
        assert "Resolve: I have what I need" in card

        # someone who may not resolve it (neither its asker nor an editor) is refused, why said
        async with session.post(embedded.app_url + "/console/inbox/resolve",
                                data={"thread": thread}, headers=bearer(embedded, LEE)) as resp:
            body = await resp.text()
            assert resp.status == 403, body
            assert ("only the asker (human:sara@acme.com) or an editor can resolve this "
                    "question") in body
        async with browser.get(inbox) as resp:
            assert resolve == _form(_section(await resp.text(), "your-turn"),
                                    "/console/inbox/resolve"), "still sara's to resolve"

        async with browser.post(embedded.app_url + "/console/inbox/resolve",
                                data=resolve) as resp:  # the button, as the page has it
            page = await resp.text()
            assert resp.url.path == "/console/inbox"
        assert "Resolved: the thread is done" in page
        assert "Nothing waits on you." in _section(page, "your-turn")
    assert (await tools(SARA)("list_inbox"))["you"]["yourTurn"] == []
    resolved = await embedded.ledger_events("comment.resolved")
    assert [(e.actor, e.data["thread"]) for e in resolved] == [(SARA, thread)]


THEN = [o["then"] for o in TOKEN_TTL["options"]]


async def test_a_human_only_card_says_so_and_no_page_shows_an_options_then(
        embedded: Embedded, session: aiohttp.ClientSession, person: Any, tools: Any) -> None:
    """`then` is the asker's own note: it comes back to them in the tools, never on a page (the
    console shows what anyone asked or answering may see)."""
    outcome = await make_item(embedded, person("marco"), "outcome", "Auth",
                              assignees=["scout-bot"])
    sara, scout = tools(SARA), ToolClient(session, embedded, SCOUT)
    asked = await sara("add_comment", **TOKEN_TTL, target=outcome)
    await embedded.settle()
    _, page, _ = await get(session, embedded, "/console/inbox", MARCO)
    first = _section(page, "your-turn")
    assert "Token TTL" in first and "For a person to decide" in first
    assert "Keep 30 days" in first and "Nobody is signed out" in first, "labels, descriptions"
    marco = tools(MARCO)
    await marco("add_comment", targetType="outcome", target=outcome,
                parent=asked["comment"]["id"], option="1")
    await scout("add_comment", **{**TOKEN_TTL, "humanOnly": False, "header": "Cache TTL"},
                target=outcome)
    await embedded.settle()
    _, page, _ = await get(session, embedded, "/console/inbox", MARCO)
    first = _section(page, "your-turn")
    assert "Cache TTL" in first and "For a person to decide" not in first, "not humanOnly"
    await marco("add_comment", targetType="outcome", target=outcome,
                parent=asked["comment"]["id"], option="2", amend=True)
    await embedded.settle()
    look = await sara("list_inbox")
    assert look["you"]["yourTurn"][0]["answer"]["then"] == THEN[1], "the asker's, in the tools"

    asking = ["/console/inbox", "/console/inbox?part=live", "/console/ledger"]
    others = ["/console/mail", "/console/agents", "/console/agents/scout",
              "/console/agents/scout?part=chat"]
    for who in (MARCO, SARA):
        for path in asking + others:
            status, body, _ = await get(session, embedded, path, who)
            assert status == 200, (who, path, body[:300])
            assert ("Token TTL" in body) == (path in asking), (who, path, "the question")
            for then in THEN:
                assert then.split(",")[0] not in body, (who, path, then)


async def test_an_agents_desk_lists_its_mail_by_state(
        embedded: Embedded, session: aiohttp.ClientSession, tools: Any) -> None:
    marco, scout = tools(MARCO), tools(SCOUT)
    sent = {}
    for subject in ("Fresh", "Opened", "Answered", "Done"):
        sent[subject] = (await marco("mail_send", to="scout", subject=subject,
                                     body="x"))["mail"]
    await scout("mail_open", mail=sent["Opened"]["ref"])
    await scout("mail_reply", mail=sent["Answered"]["ref"], body="Here you are.")
    await scout("mail_close", mail=sent["Done"]["ref"])
    await embedded.settle()
    status, page, _ = await get(session, embedded, "/console/agents/scout", MARCO)
    assert status == 200, page
    mail = _section(page, "desk-mail")
    groups = re.findall(r'<h3><span class="state state-(\w+)"[^>]*>([^<]*)</span> '
                        r'<span class="count">(\d+)</span></h3>\s*<ul class="list">(.*?)</ul>',
                        mail, re.S)
    shown = {state: (label, int(count), re.findall(r'<a href="/console/mail/[^"]+">([^<]+)</a>',
                                                    items))
             for state, label, count, items in groups}
    assert shown == {"new": ("mail:new", 1, ["Fresh"]), "working": ("mail:working", 1, ["Opened"]),
                     "replied": ("mail:replied", 1, ["Answered"]),
                     "closed": ("mail:closed", 1, ["Done"])}
    assert [g[0] for g in groups] == ["new", "working", "replied", "closed"]
    assert f'href="/console/mail/{sent["Done"]["thread_id"]}"' in mail
    status, page, _ = await get(session, embedded, "/console/agents/scout", SARA)
    assert status == 200 and "No mail you may see." in _section(page, "desk-mail"), (
        "marco's mail to scout is not sara's to see")


def _console_posts(embedded: Embedded) -> set[str]:
    return {r.resource.canonical for r in embedded.runner.app.router.routes()
            if r.method == "POST" and r.resource is not None
            and r.resource.canonical.startswith("/console/")}


async def test_no_console_form_acts_without_its_sessions_csrf_token(
        embedded: Embedded, session: aiohttp.ClientSession, person: Any, tools: Any) -> None:
    """Every POST route of the console, from a signed-in browser with no CSRF token, a forged
    one, another session's, or a forged X-CSRF-Token header: refused, and nothing changes."""
    outcome = await make_item(embedded, person("marco"), "outcome", "Auth",
                              assignees=["scout-bot"])
    to_marco = await tools(SCOUT)("add_comment", **TOKEN_TTL, target=outcome)
    by_marco = await tools(MARCO)("add_comment", **{**TOKEN_TTL, "to": ["sara@acme.com"]},
                                  target=outcome)
    await tools(SARA)("add_comment", targetType="outcome", target=outcome,
                      parent=by_marco["comment"]["id"], option="2")
    await embedded.settle()
    question = to_marco["comment"]["id"]
    async with session.post(embedded.app_url + "/oauth/register", json={
            "redirect_uris": ["http://127.0.0.1:9/cb"]}) as resp:
        client_id = (await resp.json())["client_id"]
    async with session.get(embedded.app_url + "/oauth/authorize", allow_redirects=False,
                           params={"response_type": "code", "client_id": client_id,
                                   "code_challenge": "c" * 43,
                                   "code_challenge_method": "S256"}) as resp:
        mcp_client = resp.headers["Location"].partition("request=")[2]  # its consent
    forms: dict[str, dict[str, str]] = {
        "/console/sign-in/token": {"token": embedded.api_tokens[LEE]},
        "/console/inbox/answer": {"thread": question, "target": outcome,
                                  "targetType": "outcome", "option": "1"},
        "/console/inbox/defer": {"thread": question},
        "/console/inbox/resolve": {"thread": by_marco["comment"]["id"]},
        "/console/mail/send": {"to": "scout", "subject": "Forged", "body": "x"},
        # the held queue (issue 24; with a mail there, tests/test_email_policy.py): here each
        # acts by refusing, its flash naming what it refused
        "/console/held/release": {"mail": "no-such-mail"},
        "/console/held/drop": {"mail": "no-such-mail"},
        "/console/agents/{slug}/chat": {"message": "Forged"},
        "/console/authorize": {"request": mcp_client, "decision": "allow"},
        "/console/sign-out": {},  # last: the session ends with it
    }
    assert _console_posts(embedded) == set(forms), "a new form: add it here"
    store = embedded.services.store

    async def state() -> Any:
        rows = await store.fetchall("SELECT id_hash, principal, flash FROM console_sessions"
                                    " ORDER BY id_hash")
        deferred = await store.fetchall("SELECT * FROM console_deferred")
        inbox = await tools(MARCO)("list_inbox", markRead=False)
        return (len(await ledger.entries(store)), [tuple(r) for r in rows],
                [tuple(r) for r in deferred], await _mails(embedded),
                [(t["thread"], t["turn"], t["answer"]) for t in inbox["you"]["yourTurn"]],
                len(await Actor(session, embedded, "admin").comments(*where(outcome))))

    async with signed_in(embedded, SARA) as (_, other_csrf), \
            signed_in(embedded, MARCO) as (browser, csrf):
        before = await state()
        assert len(before[4]) == 2, "a question to answer or defer, a reply to resolve"
        for path, fields in forms.items():
            url = embedded.app_url + path.format(slug="scout")
            for csrf_field, header in ((None, None), ("forged", None), (other_csrf, None),
                                       (None, "forged"), (None, other_csrf)):
                data = dict(fields, **({} if csrf_field is None else {"csrf": csrf_field}))
                headers = {} if header is None else {"X-CSRF-Token": header}
                async with browser.post(url, data=data, headers=headers,
                                        allow_redirects=False) as resp:
                    body = await resp.text()
                assert resp.status == 403, (path, csrf_field, header, resp.status, body[:300])
                assert "CSRF token does not match" in body, (path, body[:300])
                assert await state() == before, (path, csrf_field, header)
        async with browser.get(embedded.app_url + "/console/inbox",
                               allow_redirects=False) as resp:
            assert resp.status == 200 and "Signed in as <strong>marco</strong>" in (
                await resp.text()), "still signed in as marco"

        # with the session's own token (a field, or the page script's header) each one acts
        done = before
        for path, fields in forms.items():
            if path == "/console/sign-in/token":
                continue  # its token is the sign-in page's own (test_token_sign_in_...)
            url = embedded.app_url + path.format(slug="scout")
            by_header = path.endswith("/chat")  # as the page's script sends it
            async with browser.post(url, data=fields if by_header else dict(fields, csrf=csrf),
                                    headers={"X-CSRF-Token": csrf} if by_header else {},
                                    allow_redirects=False) as resp:
                assert resp.status == 303, (path, await resp.text())
            now = await state()
            assert now != done, (path, "acted with its token")
            done = now


async def test_a_desk_offers_no_chat_to_an_agent_that_takes_no_chat_runs(
        embedded: Embedded, session: aiohttp.ClientSession) -> None:
    """critic takes no runs and builder only mail runs: their desks say so and offer no chat
    form; scout's does. The refusal of a chat sent anyway names the triggers in words."""
    for slug, triggers in (("critic", "none"), ("builder", "mail")):
        status, body, _ = await get(session, embedded, f"/console/agents/{slug}", MARCO)
        assert status == 200, body[:300]
        assert f'action="/console/agents/{slug}/chat"' not in body, slug
        assert f"{slug} takes no chat runs (its run.triggers: {triggers})" in body
    status, body, _ = await get(session, embedded, "/console/agents/scout", MARCO)
    assert 'action="/console/agents/scout/chat"' in body
    async with session.post(embedded.app_url + "/console/agents/builder/chat", headers=bearer(
            embedded, MARCO), data={"message": "hi"}) as resp:
        text = await resp.text()
    assert resp.status == 409 and "(its run.triggers: mail)" in text, text
    assert "[&#39;" not in text and "['" not in text, "no Python list in the message"


async def test_an_option_without_a_description_is_shown_without_one(
        embedded: Embedded, session: aiohttp.ClientSession, person: Any) -> None:
    outcome = await make_item(embedded, person("marco"), "outcome", "Launch",
                              assignees=["scout-bot"])
    await ToolClient(session, embedded, SCOUT)(
        "add_comment", targetType="outcome", target=outcome, header="Launch date",
        to=["marco@acme.com"], body="Launch on Monday?",
        options=[{"label": "Yes"}, {"label": "No", "description": "We wait a week"}])
    status, body, _ = await get(session, embedded, "/console/inbox", MARCO)
    assert status == 200 and "Launch on Monday?" in body
    assert "No description" not in body
    assert "We wait a week" in body
    yes = re.search(r'<button[^>]*value="1"[^>]*>', body)
    assert yes and "aria-describedby" not in yes.group(0), "nothing to describe it by"


def _section(html: str, heading_id: str) -> str:
    found = re.search(rf'<section aria-labelledby="{heading_id}".*?</section>', html, re.S)
    assert found, heading_id
    return found.group(0)


async def test_a_question_waiting_on_you_is_listed_once(
        embedded: Embedded, session: aiohttp.ClientSession, person: Any) -> None:
    """scout asks marco: the card is in Your turn, not again under "Your agents are handling"
    (where scout's question waits on marco); a question scout asks sara stays there."""
    outcome = await make_item(embedded, person("marco"), "outcome", "Auth",
                              assignees=["scout-bot"])
    scout = ToolClient(session, embedded, SCOUT)
    await scout("add_comment", target=outcome, **TOKEN_TTL)
    await scout("add_comment", targetType="outcome", target=outcome, header="Budget",
                to=["sara@acme.com"], body="Budget?", options=[{"label": "10k"}])
    status, body, _ = await get(session, embedded, "/console/inbox", MARCO)
    assert status == 200
    history = _section(body, "history")
    assert "Token TTL" in body.replace(history, "")
    assert "Token TTL" not in history, "listed twice"
    assert "Budget" in history



async def test_an_answer_without_words_shows_its_option_not_a_bare_link(
        embedded: Embedded, session: aiohttp.ClientSession, person: Any, tools: Any) -> None:
    """An answer given by an option alone has no body: where it is listed (the asker's agent's
    unread, in what its person's agents are handling; an answer to a question one was copied
    on) it says which option was chosen, not the item's link alone."""
    outcome = await make_item(embedded, person("marco"), "outcome", "Auth",
                              assignees=["scout-bot"])
    asked = await tools(SCOUT)("add_comment", targetType="outcome", target=outcome,
                               header="Launch", body="Launch on Monday?", to=["sara@acme.com"],
                               cc=["lee@acme.com"], options=[{"label": "Yes"}, {"label": "No"}])
    await tools(SARA)("add_comment", targetType="outcome", target=outcome,
                      parent=asked["thread"]["thread"], option=1, body="")
    await embedded.settle()
    for who, section in ((MARCO, "history"), (LEE, "unread")):
        status, page, _ = await get(session, embedded, "/console/inbox?part=live", who)
        assert status == 200, page
        listed = _section(page, section)
        assert "sara@acme.com" in listed, listed
        assert "Chose “Yes”" in listed, listed


async def test_console_sign_in_takes_no_answer_from_where_a_redirect_points(
        tmp_path: Path) -> None:
    """The OAuth code exchange posts the App's client secret; then GET /user says who signed
    in: a 307 from the forge is refused, not followed (found by review: the secret was posted
    elsewhere, and a login from elsewhere signed the person in)."""
    from bot.app.settings import Settings
    from bot.console.oauth import SignInFailed, sign_in

    async with redirected_elsewhere() as (url, seen):
        settings = Settings(api_url=f"{url}/api/v3", app_id="1", private_key_pem="",
                            webhook_secret="w", data_dir=tmp_path, client_id="cid",
                            client_secret="THE-CLIENT-SECRET")
        login: str | None = None
        with contextlib.suppress(SignInFailed):
            login = await sign_in(settings, "code", "http://x/cb", "verifier")
    assert seen == [], f"asked elsewhere: {seen}; signed in as {login!r}"


async def test_only_a_card_waiting_on_the_person_is_set_aside(
        embedded: Embedded, session: aiohttp.ClientSession, person: Any) -> None:
    """Defer kept whatever `thread` a form named, unchecked, as a row of the index: any text
    up to a request's size (1 MiB), a row per distinct one, without end (only the person's
    next look at the Inbox page dropped them). One person of any office on the deployment
    could so fill the index every office shares. Now only a card of the person's own stack
    (a question waiting on them) is set aside; anything else is 404 and keeps nothing."""
    from bot.console import sessions

    store = embedded.services.store
    outcome = await make_item(embedded, person("marco"), "outcome", "Auth",
                              assignees=["scout-bot"])
    asked = await ToolClient(session, embedded, SCOUT)("add_comment", target=outcome,
                                                       **TOKEN_TTL)
    card = asked["comment"]["id"]
    url = embedded.app_url + "/console/inbox/defer"
    for thread, who in (("x" * 200_000, MARCO), ("no-such-thread", MARCO), (card, SARA)):
        async with session.post(url, data={"thread": thread}, headers=bearer(embedded, who),
                                allow_redirects=False) as resp:
            assert resp.status == 404, (resp.status, (await resp.text())[:300])
            assert "x" * 300 not in await resp.text()
    for who in (MARCO, SARA):
        assert await sessions.deferred(store, who, org="acme") == {}, "nothing kept"
    async with session.post(url, data={"thread": card}, headers=bearer(embedded, MARCO),
                            allow_redirects=False) as resp:
        assert resp.status == 303, (await resp.text())[:300]
    assert list(await sessions.deferred(store, MARCO, org="acme")) == [card]


async def test_a_sign_in_link_shows_no_words_but_a_forge_login(
        embedded: Embedded, session: aiohttp.ClientSession) -> None:
    """The sign-in page showed the `login` of its address in its button, whatever it was:
    anyone's link to this site (`/console/sign-in?login=...`) put their words on the page,
    "Sign in with the forge as <them>", and on to the forge's own sign-in as the login it
    suggests. As for the forge's `error_description` (test_the_forge_callback_refuses_what_
    it_did_not_start), only what can be a forge login is taken from a link; anything else is
    left out, and the page works as without it."""
    phish = "support. Your account is locked: call +1 555 0100 or visit evil.example"
    status, body, _ = await get(session, embedded, "/console/sign-in?login="
                                + phish.replace(" ", "+"))
    assert status == 200 and "Sign in with the forge" in body
    assert "evil.example" not in body and "555 0100" not in body, body
    async with session.get(embedded.app_url + "/console/sign-in/forge?login="
                           + phish.replace(" ", "+"), allow_redirects=False) as resp:
        assert resp.status == 303
        assert "evil.example" not in resp.headers["Location"], resp.headers["Location"]
    status, body, _ = await get(session, embedded, "/console/sign-in?login=marco")
    assert "Sign in with the forge as marco" in body, "a login, as `vaultmail up` prints"
    async with session.get(embedded.app_url + "/console/sign-in/forge?login=marco",
                           allow_redirects=False) as resp:
        assert "login=marco" in resp.headers["Location"]


async def test_an_image_starts_no_sign_in(embedded: Embedded) -> None:
    """`![](/console/sign-in/forge)` in someone's words, drawn on a console page: the reader's
    browser fetched it, which started a sign-in with the forge (one of the address's
    SIGN_INS_PER_MINUTE, and a new OAuth state cookie over the one of a sign-in under way,
    whose return then "did not start here"). The start and the forge's return are taken only
    as a page (`Sec-Fetch-Dest: document`, or a client that sends none); an image is 403,
    saying so, and starts nothing."""
    from bot.console import signin

    image = {"Sec-Fetch-Dest": "image", "Sec-Fetch-Mode": "no-cors",
             "Sec-Fetch-Site": "same-origin"}
    page = {"Sec-Fetch-Dest": "document", "Sec-Fetch-Mode": "navigate", "Sec-Fetch-Site": "none"}
    async with aiohttp.ClientSession(cookie_jar=aiohttp.CookieJar(unsafe=True)) as browser:
        async with browser.get(embedded.app_url + "/console/sign-in/forge", headers=page,
                               allow_redirects=False) as resp:
            assert resp.status == 303
            state = re.search(r"state=([^&]+)", resp.headers["Location"])
        assert state
        for _ in range(signin.SIGN_INS_PER_MINUTE):
            async with browser.get(embedded.app_url + "/console/sign-in/forge?next=/console/mail",
                                   headers=image, allow_redirects=False) as resp:
                text = await resp.text()
                assert resp.status == 403, (resp.status, text[:300])
                assert "image" in text and "Sec-Fetch-Dest" in text, text
                assert not any("vaultmail_oauth" in c for c in resp.headers.getall(
                    "Set-Cookie", [])), "the state of the sign-in under way is kept"
        async with browser.get(embedded.app_url + "/console/oauth/callback?code=x&state="
                               + state.group(1), headers=image, allow_redirects=False) as resp:
            assert resp.status == 403, resp.status
        # the sign-in under way has its state still (a made-up code: the forge refuses it),
        # and the address its sign-ins
        async with browser.get(embedded.app_url + "/console/oauth/callback?code=x&state="
                               + state.group(1), headers=page) as resp:
            text = await resp.text()
            assert resp.status == 401 and "bad_verification_code" in text, text[-600:]
        async with browser.get(embedded.app_url + "/console/sign-in/forge", headers=page,
                               allow_redirects=False) as resp:
            assert resp.status == 303, resp.status


async def test_a_sign_in_link_too_long_for_its_cookie_says_so(
        embedded: Embedded, session: aiohttp.ClientSession) -> None:
    """The forge sign-in keeps the page to come back to (`next=`) and the office chosen
    (`org=`) in its state cookie: a link with a few KB of either made a cookie past the 4,096
    bytes a browser keeps, so it kept none, and the forge's return was refused as "did not
    start here" (Chromium: test_browser::test_a_sign_in_link_too_long_for_its_cookie_says_so).
    Now such a link is a 400 sign-in page saying what was wrong and what to do, sending
    nothing to the forge; `org=` is an organisation's name on a forge (`bot.names.is_name`,
    not letters and digits picked out of anything), else likewise."""
    start = embedded.app_url + "/console/sign-in/forge"
    long_next = "/console/mail?q=" + "x" * 3000
    for query, says in ((f"next={long_next}", "next="), ("org=" + "a" * 3000, "org="),
                        ("org=ac%20me%21", "org="), ("org=acme:x", "org=")):
        async with session.get(f"{start}?{query}", allow_redirects=False) as resp:
            text = await resp.text()
            assert resp.status == 400, (query[:40], resp.status)
            assert says in text and "sign in" in text.lower(), text[-1500:]
            assert not any("vaultmail_oauth" in c for c in resp.headers.getall(
                "Set-Cookie", [])), "nothing started"
            assert "x" * 100 not in text and "ac me" not in text, "no words of the link shown"
    async with session.get(f"{start}?org=acme.corp_1&next=/console/mail",
                           allow_redirects=False) as resp:
        assert resp.status == 303, resp.status
        [state] = [c for c in resp.headers.getall("Set-Cookie")
                   if c.startswith("vaultmail_oauth=")]
        assert ":acme.corp_1:" in state, state  # (a name: '.' and '_' are a forge's too)


async def _metric(embedded: Embedded, place: str, outcome: str) -> float:
    async with aiohttp.ClientSession() as http, http.get(embedded.app_url + "/metrics") as resp:
        text = await resp.text()
    found = re.search(rf'vaultmail_failed_token_tries_total\{{outcome="{outcome}",'
                      rf'place="{place}"\}} ([0-9.e+]+)', text)
    return float(found.group(1)) if found else 0.0


async def test_failed_token_sign_ins_are_limited_per_address_and_a_success_is_not_charged(
        embedded: Embedded, caplog: Any) -> None:
    """Found by review: the sign-in form took API tokens as fast as the server answered, each
    try a lookup in the index. Now PER_ADDRESS unknown tokens a minute from one address, then
    429 with Retry-After saying what was wrong, before any lookup (a live token too); a
    success costs nothing; another address (a trusted proxy's client) is not refused; a
    client's own X-Forwarded-For moves nothing; each failure is logged with the address,
    never the token, and counted."""
    from bot.app.tries import PER_ADDRESS

    caplog.set_level(logging.INFO, logger="vaultmail.tries")
    url = embedded.app_url + "/console"
    live = embedded.api_tokens[MARCO]
    refused_before = await _metric(embedded, "sign_in", "refused")

    async def sign_in(token: str, headers: dict[str, str] | None = None
                      ) -> tuple[int, str, str | None]:
        async with aiohttp.ClientSession(cookie_jar=aiohttp.CookieJar(unsafe=True)) as browser:
            async with browser.get(url + "/sign-in") as resp:
                page = await resp.text()
            async with browser.post(url + "/sign-in/token", data={
                    "csrf": _field(page, "csrf"), "token": token}, headers=headers or {},
                    allow_redirects=False) as resp:
                return resp.status, await resp.text(), resp.headers.get("Retry-After")

    for _ in range(PER_ADDRESS + 3):  # successes are not charged
        assert (await sign_in(live))[0] == 303
    spoofed = {"X-Forwarded-For": "203.0.113.9"}  # (no trusted proxy: the client's word)
    statuses = [(await sign_in(f"vm_guess{n}", spoofed))[0] for n in range(PER_ADDRESS)]
    assert statuses == [401] * PER_ADDRESS, statuses
    status, page, wait = await sign_in("vm_one-more")
    assert (status, wait) == (429, "60"), (status, wait)
    assert "too many failed tries with an API token from your address" in page, page[-900:]
    assert (await sign_in(live))[0] == 429, "nothing looked up, a live token too"
    # behind a trusted proxy, its client is whom the limit counts
    services = embedded.services
    services.settings = dataclasses.replace(services.settings,
                                            trusted_proxies=parse_proxies("127.0.0.1, ::1"))
    assert (await sign_in(live, {"X-Forwarded-For": "198.51.100.4"}))[0] == 303
    assert await _metric(embedded, "sign_in", "refused") - refused_before == 2
    failed = [r for r in caplog.records if r.name == "vaultmail.tries"]
    assert len([r for r in failed if r.getMessage() == "token try failed"]) == PER_ADDRESS
    assert all(getattr(r, "client", None) in ("127.0.0.1", "::1") for r in failed), failed
    assert not any("vm_guess" in str(r.__dict__) for r in caplog.records), "no token logged"


async def test_failed_token_sign_ins_from_every_address_together_are_limited_too(
        embedded: Embedded) -> None:
    """A backstop for a flood from many addresses: EVERYONE failed sign-ins a minute from
    all of them together, then 429 for a new address too. The tools' Bearer tokens are not
    under it (there it would let any outsider lock every agent out)."""
    from bot.app.tries import EVERYONE, PER_ADDRESS

    services = embedded.services
    services.settings = dataclasses.replace(services.settings,
                                            trusted_proxies=parse_proxies("127.0.0.1, ::1"))
    url = embedded.app_url + "/console"
    async with aiohttp.ClientSession(cookie_jar=aiohttp.CookieJar(unsafe=True)) as browser:
        async with browser.get(url + "/sign-in") as resp:
            csrf = _field(await resp.text(), "csrf")

        async def fail(n: int) -> tuple[int, str]:
            client = {"X-Forwarded-For": f"10.0.{n // (PER_ADDRESS - 1)}.1"}  # under its own
            async with browser.post(url + "/sign-in/token", headers=client, data={
                    "csrf": csrf, "token": f"vm_guess{n}"}, allow_redirects=False) as resp:
                return resp.status, await resp.text()

        statuses = [(await fail(n))[0] for n in range(EVERYONE)]
        assert statuses == [401] * EVERYONE, [s for s in statuses if s != 401]
        status, page = await fail(EVERYONE * PER_ADDRESS)  # an address not seen before
        assert status == 429 and "from every address together" in page, page[-900:]
    async with aiohttp.ClientSession() as http, http.post(
            embedded.app_url + "/api/v1/tools/mail_list", json={},
            headers={**bearer(embedded, MARCO), "X-Forwarded-For": "10.200.0.1"}) as resp:
        assert resp.status == 200, await resp.text()
