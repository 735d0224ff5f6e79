"""Every 429 and 503 the app answers over HTTP says when to come back (Retry-After, whole
seconds, RFC 9110 §10.2.3): a client (an MCP client, curl --retry, octokit's retry plugin)
reads the header, not the body. Acted out: the long-poll cap (the tool endpoint and
`vaultmail mcp`'s resources/wait), the MCP sessions cap and the OAuth sign-in starts answered
429 without one. Over real HTTP against the embedded app; nothing timed.
"""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
import yaml

from bot.app.embedded import Embedded
from bot.office.config import parse_office
from bot.office.seed import seed_office
from bot.tools import oauth_server
from bot.tools.mcp_server import SESSIONS_KEY
from bot.tools.polls import PER_TOKEN, token_key
from tests.support import forge_sign_in
from tests.test_mcp_oauth import _pkce, authorize_url, register
from tests.test_mcp_sessions import BUILDER, INITIALIZE, _auth, open_session

SHORTLY = "5"  # seconds: bot.errors.RETRY_SHORTLY, as intake and start-up have said


async def test_a_long_poll_over_the_cap_says_when_to_come_back(
        embedded: Embedded, tools: Any, session: aiohttp.ClientSession) -> None:
    """With PER_TOKEN long polls held, one more is refused 429 at the tool endpoint and at
    resources/wait (what `vaultmail mcp` on stdio polls), each with a Retry-After."""
    token = embedded.api_tokens[BUILDER]
    auth = {"Authorization": f"Bearer {token}"}
    builder = tools(BUILDER)
    held = [asyncio.create_task(builder.raw("list_inbox", {"wait": 40}))
            for _ in range(PER_TOKEN)]
    await embedded.services.long_polls.until_held(token_key(token), PER_TOKEN)

    async with session.post(embedded.app_url + "/api/v1/tools/list_inbox",
                            json={"wait": 40}, headers=auth) as resp:
        assert resp.status == 429, await resp.text()
        assert resp.headers.get("Retry-After") == SHORTLY, dict(resp.headers)
    async with session.get(embedded.app_url + "/api/v1/resources/wait",
                           params={"uri": "vaultmail://inbox", "wait": "40"},
                           headers=auth) as resp:
        assert resp.status == 429, await resp.text()
        assert (await resp.json())["error"]["code"] == "too_many_long_polls"
        assert resp.headers.get("Retry-After") == SHORTLY, dict(resp.headers)

    await tools("agent:scout")("mail_send", to="builder", subject="Wake up", body="all")
    assert [status for status, _ in await asyncio.gather(*held)] == [200] * PER_TOKEN


async def test_an_mcp_session_over_the_cap_says_when_to_come_back(
        embedded: Embedded, session: aiohttp.ClientSession) -> None:
    """A token whose every session is busy (an open stream) is refused a new one, 429, with
    a Retry-After beside the JSON-RPC error."""
    embedded.runner.app[SESSIONS_KEY].per_key = 1
    builder = embedded.api_tokens[BUILDER]
    _, sid, _ = await open_session(session, embedded, builder)
    assert sid is not None
    async with session.get(embedded.app_url + "/mcp", headers=_auth(builder, sid)) as stream:
        assert stream.status == 200
        async with session.post(embedded.app_url + "/mcp", json=INITIALIZE,
                                headers=_auth(builder)) as resp:
            assert resp.status == 429, await resp.text()
            assert "too_many_sessions" in await resp.text()
            assert resp.headers.get("Retry-After") == SHORTLY, dict(resp.headers)


async def test_sign_in_starts_over_the_cap_say_to_come_back_in_a_minute(
        embedded: Embedded, session: aiohttp.ClientSession) -> None:
    """Past AUTHORIZE_PER_MINUTE sign-in starts from one address, the page says "wait a
    minute"; its Retry-After says the same (the window the starts are counted in)."""
    _, client = await register(session, embedded)
    url = authorize_url(embedded, client["client_id"], _pkce()[1])
    for _ in range(oauth_server.AUTHORIZE_PER_MINUTE):
        async with session.get(url, allow_redirects=False) as resp:
            assert resp.status == 303
    async with session.get(url, allow_redirects=False) as resp:
        assert resp.status == 429 and "wait a minute" in await resp.text()
        assert resp.headers.get("Retry-After") == "60", dict(resp.headers)


async def test_readyz_not_ready_says_when_to_look_again(
        embedded: Embedded, session: aiohttp.ClientSession) -> None:
    """Acted out: /readyz answered 503 without Retry-After. Each look checks afresh: look
    again shortly."""
    embedded.forge.faults.add(route="GET /", status=502)
    async with session.get(embedded.app_url + "/readyz") as resp:
        assert resp.status == 503 and (await resp.json())["failed"] == ["forge"]
        assert resp.headers.get("Retry-After") == SHORTLY, dict(resp.headers)


async def test_a_forge_sign_in_the_office_of_cannot_be_read_says_when_to_come_back(
        embedded: Embedded) -> None:
    """Acted out: marco signs in with the forge into evil's office while evil's config cannot
    be read; the page said "try again" (502, a forge failure) with no Retry-After, as the
    console's other pages of a refusal carry."""
    evil = {"org": "evil", "humans": [{"email": "m@evil.test", "login": "marco"}]}
    seed_office(embedded.forge, parse_office(yaml.safe_dump(evil), "evil.yml", repository=False))
    (app_id,) = embedded.forge.state.apps
    embedded.forge.install_app(int(app_id), "evil")
    await embedded.settle()
    embedded.forge.state.web.authorizations.setdefault("marco", []).append(int(app_id))
    embedded.forge.faults.add(route="GET /repos/{owner}/{repo}/contents/{path}", status=403,
                              kind="primary_limit", repo="evil/.github")
    embedded.services.offices.max_age = 0.0  # read again at this sign-in
    async with aiohttp.ClientSession(cookie_jar=aiohttp.CookieJar(unsafe=True)) as browser:
        answer = await forge_sign_in(browser, embedded, "/console/sign-in/forge?org=evil",
                                     embedded.forge_tokens["marco"])
    assert answer.status == 502, answer.status
    assert answer.headers.get("Retry-After") == SHORTLY, dict(answer.headers)
