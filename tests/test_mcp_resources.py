"""MCP as clients expect it, with the SDK's own client over streamable HTTP and stdio: mail,
items and the inbox as resources (read as the caller, as the tools would show them), the inbox
subscription (2025 `resources/subscribe` and 2026 `subscriptions/listen`) woken by the app's
notifier, `Origin` checked on /mcp, a missing or bad token answered with a
`WWW-Authenticate` that points at the protected-resource metadata, and `vaultmail mcp` failing
at start when it cannot work."""

from __future__ import annotations

import asyncio
import json
import sys
import warnings
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx2
import mcp_types as types
import pytest
from mcp import Client
from mcp.client.auth.utils import extract_resource_metadata_from_www_auth
from mcp.client.session import IncomingMessage
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client
from mcp.shared.exceptions import MCPError
from mcp.shared.subscriptions import ResourceUpdated

from bot.app.embedded import Embedded, start_embedded
from bot.app.settings import SettingsError, parse_origins
from bot.store import api_tokens
from tests.items_support import MARCO, SCOUT, make_item
from tests.support import free_port
from tests.test_mcp import ROOT, _stdio_params

BUILDER = "agent:builder"
INBOX = "vaultmail://inbox"
WAIT = 30  # seconds a test waits for an event before it fails (a bound, not a pause)


class Heard:
    """The notifications a 2025-protocol client is sent, for a test to wait on."""

    def __init__(self) -> None:
        self.updated: list[str] = []
        self.event = asyncio.Event()

    async def __call__(self, message: IncomingMessage) -> None:
        if isinstance(message, types.ResourceUpdatedNotification):
            self.updated.append(str(message.params.uri))
            self.event.set()

    async def next(self) -> str:
        async with asyncio.timeout(WAIT):
            await self.event.wait()
        self.event.clear()
        return self.updated[-1]


@asynccontextmanager
async def http_client(embedded: Embedded, who: str, mode: str = "auto",
                      heard: Heard | None = None) -> AsyncIterator[Client]:
    token = embedded.api_tokens.get(who, who)
    async with create_mcp_http_client(headers={"Authorization": f"Bearer {token}"}) as http, \
            Client(streamable_http_client(embedded.app_url + "/mcp", http_client=http),
                   mode=mode, message_handler=heard) as client:  # type: ignore[arg-type]
        yield client


@asynccontextmanager
async def stdio_client(embedded: Embedded, who: str, mode: str = "auto",
                       heard: Heard | None = None) -> AsyncIterator[Client]:
    params = _stdio_params(embedded, "--as", who, "--data", str(embedded.data_dir))
    async with Client(params, mode=mode, message_handler=heard) as client:  # type: ignore[arg-type]
        yield client


CLIENTS = {"http": http_client, "stdio": stdio_client}


def _content(result: types.ReadResourceResult) -> dict[str, Any]:
    [content] = result.contents
    assert isinstance(content, types.TextResourceContents)
    assert content.mime_type == "application/json"
    found: dict[str, Any] = json.loads(content.text)
    return found


def _without_inbox(result: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in result.items() if k != "inbox"}


@pytest.mark.parametrize("transport", ["http", "stdio"])
async def test_mail_items_and_the_inbox_are_resources_read_as_the_tools_show_them(
        embedded: Embedded, person: Any, tools: Any, transport: str) -> None:
    marco = person("marco")
    outcome = await make_item(embedded, marco, "outcome", "Checkout", assignees=["scout-bot"])
    sent = (await tools(BUILDER)("mail_send", to="scout", subject="Spec", body="v1"))["mail"]
    await tools(SCOUT)("add_comment", targetType="outcome", target=outcome,
                       body="Card first?", to=["marco@acme.com"], needsReply=True)
    owner_repo, n = sent["ref"].split("#")
    mail_uri = f"vaultmail://mail/{owner_repo}/{n}"
    item_uri = "vaultmail://item/" + outcome.replace("#", "/")

    async with CLIENTS[transport](embedded, SCOUT) as client:
        listed = {r.uri: r for r in (await client.list_resources()).resources}
        assert {INBOX, mail_uri, item_uri} <= set(listed)
        assert listed[mail_uri].title == "Spec" and listed[INBOX].mime_type == "application/json"
        templates = {t.uri_template for t in (await client.list_resource_templates())
                     .resource_templates}
        assert templates == {"vaultmail://mail/{owner}/{repo}/{n}",
                             "vaultmail://item/{owner}/{repo}/{n}"}

        mail = _content(await client.read_resource(mail_uri))
        assert mail == _without_inbox(await tools(SCOUT)("mail_get", mail=sent["ref"]))
        item = _content(await client.read_resource(item_uri))
        assert item["outcome"]["ref"] == outcome and item["decisions"] == []
        [thread] = item["threads"]
        assert thread["body"] == "Card first?" and thread["askedTo"] == [MARCO]
        inbox = _content(await client.read_resource(INBOX))
        assert [m["subject"] for m in inbox["inbox"]["mail"]] == ["Spec"]

    async with CLIENTS[transport](embedded, MARCO) as client:
        first = _content(await client.read_resource(INBOX))
        [card] = first["you"]["yourTurn"]
        assert card["body"] == "Card first?" and "inbox" not in first, "a person's has none"
        again = _content(await client.read_resource(INBOX))
        assert again["you"]["unread"] == first["you"]["unread"] != [], "reading marks nothing"

    async with CLIENTS[transport](embedded, "agent:critic") as client:
        with pytest.raises(MCPError) as hidden:
            await client.read_resource(mail_uri)
        with pytest.raises(MCPError) as absent:
            await client.read_resource(f"vaultmail://mail/{owner_repo}/999")
        assert hidden.value.code == absent.value.code == -32002
        assert hidden.value.message.replace(f"#{n}", "#999") == absent.value.message
        with pytest.raises(MCPError) as wrong:
            await client.read_resource("vaultmail://nothing")
        assert wrong.value.code == -32602 and "vaultmail://mail/OWNER/REPO/N" in \
            wrong.value.message


async def _send(tools: Any, subject: str) -> None:
    await tools(BUILDER)("mail_send", to="scout", subject=subject, body="text")


@pytest.mark.parametrize("transport", ["http", "stdio"])
async def test_a_listen_stream_hears_each_change_to_the_inbox(
        embedded: Embedded, tools: Any, transport: str) -> None:
    async with CLIENTS[transport](embedded, SCOUT) as client, \
            client.listen(resource_subscriptions=[INBOX, "vaultmail://mail/a/b/1"]) as sub:
        assert sub.honored.resource_subscriptions == [INBOX], "only the inbox is watched"
        events = aiter(sub)
        for subject in ("First", "Second"):
            await _send(tools, subject)
            async with asyncio.timeout(WAIT):
                assert await anext(events) == ResourceUpdated(INBOX)
            inbox = _content(await client.read_resource(INBOX, cache_mode="bypass"))
            assert subject in [m["subject"] for m in inbox["inbox"]["mail"]]


@pytest.mark.parametrize("transport", ["http", "stdio"])
async def test_a_2025_subscription_is_sent_resources_updated_until_unsubscribed(
        embedded: Embedded, tools: Any, transport: str) -> None:
    heard = Heard()
    async with CLIENTS[transport](embedded, SCOUT, "legacy", heard) as client:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the SDK marks the 2025 method deprecated
            with pytest.raises(MCPError, match="only vaultmail://inbox"):
                await client.subscribe_resource("vaultmail://mail/acme/scout-vault/1")
            await client.subscribe_resource(INBOX)
            await _send(tools, "First")
            assert await heard.next() == INBOX
            await _send(tools, "Second")
            assert await heard.next() == INBOX
            await client.unsubscribe_resource(INBOX)
            await client.subscribe_resource(INBOX)
            await _send(tools, "Third")
            assert await heard.next() == INBOX
        assert heard.updated == [INBOX] * 3, "one update per change, none doubled"


async def test_a_revoked_token_ends_its_listen_stream(embedded: Embedded, tools: Any) -> None:
    store = embedded.services.store
    token = await api_tokens.create_token(store, SCOUT)
    async with http_client(embedded, token) as client, \
            client.listen(resource_subscriptions=[INBOX]) as sub:
        await api_tokens.revoke_token(store, (await api_tokens.list_tokens(store))[-1].id)
        await _send(tools, "After revocation")
        with pytest.raises(Exception) as ended:  # noqa: B017  the stream ends: lost or refused
            async with asyncio.timeout(WAIT):
                async for event in sub:
                    raise AssertionError(f"a revoked token heard {event}")
        assert not isinstance(ended.value, TimeoutError | AssertionError), ended.value


# -- /mcp at the HTTP level -----------------------------------------------------------------

INITIALIZE = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
    "protocolVersion": "2025-06-18", "capabilities": {},
    "clientInfo": {"name": "test", "version": "1"}}}
ACCEPT = {"Accept": "application/json, text/event-stream"}


async def _post(url: str, headers: dict[str, str]) -> httpx2.Response:
    async with httpx2.AsyncClient() as http:
        return await http.post(url, json=INITIALIZE, headers={**ACCEPT, **headers})


async def test_a_missing_or_bad_token_points_at_the_protected_resource_metadata(
        embedded: Embedded) -> None:
    url = embedded.app_url + "/mcp"
    metadata_url = embedded.app_url + "/.well-known/oauth-protected-resource"
    missing = await _post(url, {})
    bad = await _post(url, {"Authorization": "Bearer vm_not-a-token"})
    for resp in (missing, bad):
        assert resp.status_code == 401
        assert resp.headers["www-authenticate"].startswith("Bearer ")
        assert extract_resource_metadata_from_www_auth(resp) == metadata_url  # the SDK's own
        assert resp.json()["error"]["code"] == -32001
    assert 'error="invalid_token"' in bad.headers["www-authenticate"]
    assert "error=" not in missing.headers["www-authenticate"], "RFC 6750: none without a token"

    async with httpx2.AsyncClient() as http:
        for path in ("", "/mcp"):
            resp = await http.get(metadata_url + path)
            assert resp.status_code == 200, path
            assert resp.json() == {"resource": url, "bearer_methods_supported": ["header"],
                                   "authorization_servers": [embedded.app_url],
                                   "resource_name": "vaultmail"}


async def test_a_wait_that_is_not_a_number_of_seconds_is_refused_saying_so(
        embedded: Embedded) -> None:
    """`wait=nan` passed the clamp to 0-50 s as NaN and was not counted as a long poll (no
    cap of its token's applied), then reached the event loop's timer (uvloop's refuses it:
    a 500), where any other bad `wait` is refused with a 422 saying what it should be."""
    auth = {"Authorization": f"Bearer {embedded.api_tokens[SCOUT]}"}
    async with httpx2.AsyncClient() as http:
        for wait in ("nan", "NaN", "soon"):
            resp = await http.get(embedded.app_url + "/api/v1/resources/wait",
                                  params={"wait": wait}, headers=auth)
            assert resp.status_code == 422, (wait, resp.status_code, resp.text)
            assert "wait: a number of seconds" in resp.text, resp.text


async def test_an_origin_not_allowed_is_refused_before_anything_else(embedded: Embedded) -> None:
    url, token = embedded.app_url + "/mcp", embedded.api_tokens[SCOUT]
    auth = {"Authorization": f"Bearer {token}"}
    for origin in ("http://evil.example", embedded.app_url, "null"):
        resp = await _post(url, {**auth, "Origin": origin})
        assert resp.status_code == 403, origin
        assert resp.json()["error"]["data"]["code"] == "origin_not_allowed"
        assert "VAULTMAIL_ALLOWED_ORIGINS" in resp.json()["error"]["message"]
    assert (await _post(url, {"Origin": "http://evil.example"})).status_code == 403, \
        "before the token is even looked at"
    assert (await _post(url, auth)).status_code == 200, "no Origin: not a browser"


async def test_allowed_origins_come_from_vaultmail_allowed_origins(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("VAULTMAIL_ALLOWED_ORIGINS",
                       "https://console.acme.example, http://localhost:5173/")
    embedded = await start_embedded(data_dir=tmp_path, port=0, forge_port=0)
    try:
        url = embedded.app_url + "/mcp"
        auth = {"Authorization": f"Bearer {embedded.api_tokens[SCOUT]}"}
        for origin in ("https://console.acme.example", "http://localhost:5173"):
            resp = await _post(url, {**auth, "Origin": origin})
            assert resp.status_code == 200, origin
            assert resp.headers["access-control-allow-origin"] == origin
            assert "Mcp-Session-Id" in resp.headers["access-control-expose-headers"]
            # (a 429's or 503's wait: not a header a page may read unless exposed)
            assert "Retry-After" in resp.headers["access-control-expose-headers"]
        for origin in ("https://console.acme.example.evil", "http://localhost:5174"):
            assert (await _post(url, {**auth, "Origin": origin})).status_code == 403, origin
        async with httpx2.AsyncClient() as http:  # a page's preflight, before its POST
            preflight = await http.options(url, headers={
                "Origin": "http://localhost:5173", "Access-Control-Request-Method": "POST",
                "Access-Control-Request-Headers": "authorization, content-type"})
            refused = await http.options(url, headers={"Origin": "http://localhost:5174"})
            unauthenticated = await http.post(url, json=INITIALIZE, headers={
                **ACCEPT, "Origin": "http://localhost:5173"})
        assert preflight.status_code == 204 and refused.status_code == 403
        assert preflight.headers["access-control-allow-origin"] == "http://localhost:5173"
        assert "Authorization" in preflight.headers["access-control-allow-headers"]
        assert unauthenticated.status_code == 401, "the page can read why"
        assert unauthenticated.headers["access-control-allow-origin"] == "http://localhost:5173"
    finally:
        await embedded.stop()
    with pytest.raises(SettingsError, match="VAULTMAIL_ALLOWED_ORIGINS='console.acme.example': "
                       "should be origins like https://app.example.com"):
        parse_origins("console.acme.example")


# -- `vaultmail mcp` at start ----------------------------------------------------------------

async def _mcp(*argv: str) -> tuple[int, str, str]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "bot.cli.main", "mcp", *argv, cwd=str(ROOT),
        stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE)
    async with asyncio.timeout(60):  # it must end by itself, not wait on stdin
        out, err = await proc.communicate()
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


async def test_vaultmail_mcp_fails_at_start_when_it_cannot_work(embedded: Embedded) -> None:
    gone = await api_tokens.create_token(embedded.services.store, SCOUT)
    await api_tokens.revoke_token(embedded.services.store,
                                  (await api_tokens.list_tokens(embedded.services.store))[-1].id)
    closed = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    for argv, why in ((["--token", gone, "--app", embedded.app_url], "refused the API token"),
                      (["--token", "vm_x", "--app", closed], "cannot reach the vaultmail app")):
        code, out, err = await _mcp(*argv)
        lines = err.strip().splitlines()
        assert code == 2 and len(lines) == 1 and why in lines[0], err
        assert out == "", "nothing on the protocol's stream"
