"""The console over plain HTTP: sign-in and its cookies, CSRF, API tokens, who sees what, the
ledger's chain, the live stream. (What a person does in the pages is in test_browser.py.)"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import re
from typing import Any

import aiohttp
from yarl import URL

from bot.app.embedded import Embedded
from bot.app.settings import Settings
from tests.items_support import MARCO, SARA, SCOUT, TOKEN_TTL, make_item
from tests.support import Actor, ToolClient

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
    status, body, _ = await get(session, embedded, "/console/oauth/callback?error=access_denied"
                                "&error_description=The+user+has+denied+your+application")
    assert status == 401 and "The user has denied your application" in body
    async with aiohttp.ClientSession(cookie_jar=aiohttp.CookieJar(unsafe=True)) as browser:
        async with browser.get(embedded.app_url + "/console/sign-in/forge",
                               allow_redirects=False) as resp:
            where = resp.headers["Location"]
        assert where.startswith(embedded.forge.url + "/login/oauth/authorize?")
        assert "code_challenge_method=S256" in where and "client_id=Iv1." in where
        state = re.search(r"state=([^&]+)", where)
        assert state
        async with browser.get(embedded.app_url + "/console/oauth/callback?code=bogus&state="
                               + state.group(1)) as resp:
            assert resp.status == 401 and "bad_verification_code" in await resp.text()


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
                        if c.startswith("vaultmail_session=")]
    assert "Secure" in cookie and "HttpOnly" in cookie


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
