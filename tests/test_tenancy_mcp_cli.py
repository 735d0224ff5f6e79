"""evil tries acme's mail over MCP (the SDK's own client) and reads the ledger with the CLI
(issue 21): MCP answers "not found" as the HTTP tools do, and `vaultmail ledger --org` prints
and checks one office's chain only."""

from __future__ import annotations

import json

import aiohttp
import yaml

from bot.app.embedded import Embedded
from bot.office.config import parse_office
from bot.office.seed import seed_office
from bot.store import api_tokens
from tests.support import ToolClient
from tests.test_cli_tools import vaultmail
from tests.test_mcp import _refused, _result, mcp_http
from tests.test_tenancy import EVIL, MARCO, SECRET


async def _with_evil(embedded: Embedded, session: aiohttp.ClientSession) -> tuple[str, str]:
    seed_office(embedded.forge, parse_office(yaml.safe_dump(EVIL), "evil.yml", repository=False))
    (app_id,) = embedded.forge.state.apps
    embedded.forge.install_app(int(app_id), "evil")
    sent = (await ToolClient(session, embedded, MARCO)(
        "mail_send", to="scout", subject=SECRET, body="x"))["mail"]
    await embedded.settle()
    return sent["ref"], await api_tokens.create_token(embedded.services.store, MARCO, "evil")


async def test_over_mcp_another_office_finds_nothing_of_this_one(
        embedded: Embedded, session: aiohttp.ClientSession) -> None:
    ref, evil = await _with_evil(embedded, session)
    async with mcp_http(embedded, evil) as client:
        status, code, _ = _refused(await client.call_tool("mail_get", {"mail": ref}))
        assert (status, code) == (404, "not_found")
        listed = _result(await client.call_tool("mail_list", {}))
        resources = await client.list_resources()
        assert SECRET not in json.dumps(listed) + str(resources)


async def test_vaultmail_ledger_prints_and_checks_one_offices_chain(
        embedded: Embedded, session: aiohttp.ClientSession) -> None:
    _, evil = await _with_evil(embedded, session)
    await ToolClient(session, embedded, MARCO).raw(
        "mail_send", {"to": "scout", "subject": "Evil plan", "body": "x"}, token=evil)
    await embedded.settle()
    data = str(embedded.data_dir)
    code, out, err = await vaultmail("ledger", "--org", "evil", "--data", data, "--json")
    assert code == 0, err
    shown = json.loads(out)["result"]
    assert shown["chain"] == "intact" and shown["entries"]
    assert {e["office"] for e in shown["entries"]} == {"evil"} and SECRET not in out
    code, out, err = await vaultmail("ledger", "--data", data, "--json")  # the operator: all
    assert code == 0 and {e["office"] for e in json.loads(out)["result"]["entries"]} >= {
        "acme", "evil"}


PROTOCOL = "2025-06-18"


async def _mcp_post(session: aiohttp.ClientSession, url: str, token: str, body: object,
                    sid: str | None = None) -> tuple[int, str | None]:
    headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json",
               "Accept": "application/json, text/event-stream",
               "MCP-Protocol-Version": PROTOCOL, **({"Mcp-Session-Id": sid} if sid else {})}
    async with session.post(url, data=json.dumps(body), headers=headers) as resp:
        await resp.read()
        return resp.status, resp.headers.get("Mcp-Session-Id")


async def test_an_mcp_session_is_not_another_offices_principal_of_the_same_name(
        embedded: Embedded, session: aiohttp.ClientSession) -> None:
    """evil declares an `agent:scout` of its own: with its token and acme's scout's session id
    it can neither use that session nor end it (404, as for no session)."""
    await _with_evil(embedded, session)
    store = embedded.services.store
    acme = await api_tokens.create_token(store, "agent:scout", "acme")
    evil = await api_tokens.create_token(store, "agent:scout", "evil")
    url = embedded.app_url + "/mcp"
    status, sid = await _mcp_post(session, url, acme, {
        "jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
            "protocolVersion": PROTOCOL, "capabilities": {},
            "clientInfo": {"name": "acme-scout", "version": "1"}}})
    assert status == 200 and sid
    assert (await _mcp_post(session, url, acme, {
        "jsonrpc": "2.0", "method": "notifications/initialized"}, sid))[0] == 202
    call = {"jsonrpc": "2.0", "id": 2, "method": "tools/list"}
    assert (await _mcp_post(session, url, evil, call, sid))[0] == 404
    async with session.delete(url, headers={
            "Authorization": f"Bearer {evil}", "Mcp-Session-Id": sid,
            "MCP-Protocol-Version": PROTOCOL}) as resp:
        assert resp.status == 404
    assert (await _mcp_post(session, url, acme, call, sid))[0] == 200  # still acme's
