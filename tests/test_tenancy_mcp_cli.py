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
    seed_office(embedded.forge, parse_office(yaml.safe_dump(EVIL), "evil.yml"))
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
