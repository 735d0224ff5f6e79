"""The tools over MCP, with the SDK's own client: streamable HTTP at /mcp and stdio
(`vaultmail mcp` as a subprocess talking to the app)."""

from __future__ import annotations

import asyncio
import json
import re
import sys
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path
from typing import Any

import httpx2
import mcp_types as types
import pytest
from mcp import Client
from mcp.client.stdio import StdioServerParameters
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client

from bot.app.embedded import Embedded
from bot.store import api_tokens
from bot.tools import TOOLS
from tests.tool_scenario import run_refusals, run_scenario

ROOT = Path(__file__).resolve().parent.parent
_ERROR = re.compile(r"^error (\d{3}) (\S+): ([^\n]*)(?:\n\n(\{.*\}))?$", re.S)


def _token(embedded: Embedded, who: str) -> str:
    return embedded.api_tokens.get(who, who)


@asynccontextmanager
async def mcp_http(embedded: Embedded, token: str, mode: str = "auto") -> AsyncIterator[Client]:
    async with create_mcp_http_client(headers={"Authorization": f"Bearer {token}"}) as http, \
            Client(streamable_http_client(embedded.app_url + "/mcp", http_client=http),
                   mode=mode) as client:  # type: ignore[arg-type]
        yield client


def _stdio_params(embedded: Embedded, *who: str) -> StdioServerParameters:
    return StdioServerParameters(command=sys.executable,
                                 args=["-m", "bot.cli.main", "mcp", *who], cwd=str(ROOT))


@asynccontextmanager
async def mcp_stdio(embedded: Embedded, principal: str) -> AsyncIterator[Client]:
    params = _stdio_params(embedded, "--as", principal, "--data", str(embedded.data_dir))
    async with Client(params) as client:
        yield client


def _result(result: types.CallToolResult) -> dict[str, Any]:
    assert not result.is_error, result.content
    assert isinstance(result.structured_content, dict)
    return result.structured_content


def _refused(result: types.CallToolResult) -> tuple[int, str, str]:
    assert result.is_error
    [content] = result.content
    assert isinstance(content, types.TextContent)
    m = _ERROR.match(content.text)
    assert m, content.text
    assert isinstance(result.structured_content, dict)
    assert result.structured_content["error"] == {"code": m[2], "message": m[3]}
    extra = {k: v for k, v in result.structured_content.items() if k != "error"}
    assert set(extra) <= {"inbox"}, "an agent's inbox comes with its errors too"
    assert (json.loads(m[4]) if m[4] else {}) == extra, "and in the text a model reads"
    return int(m[1]), m[2], m[3]


async def test_the_scenario_over_mcp_streamable_http(embedded: Embedded) -> None:
    async with AsyncExitStack() as stack:
        clients = {p: await stack.enter_async_context(mcp_http(embedded, _token(embedded, p)))
                   for p in ("agent:builder", "agent:scout")}

        async def call(principal: str, tool: str, args: dict[str, Any]) -> dict[str, Any]:
            return _result(await clients[principal].call_tool(tool, args))

        await run_scenario(embedded, call)


async def test_the_scenario_over_mcp_stdio(embedded: Embedded) -> None:
    async with AsyncExitStack() as stack:
        clients = {p: await stack.enter_async_context(mcp_stdio(embedded, p))
                   for p in ("agent:builder", "agent:scout")}

        async def call(principal: str, tool: str, args: dict[str, Any]) -> dict[str, Any]:
            return _result(await clients[principal].call_tool(tool, args))

        await run_scenario(embedded, call)


async def test_tool_schemas_descriptions_and_the_inbox_prompt(embedded: Embedded) -> None:
    async with mcp_http(embedded, _token(embedded, "human:marco@acme.com")) as client:
        listed = {t.name: t for t in (await client.list_tools()).tools}
        assert set(listed) == set(TOOLS)
        send = listed["mail_send"]
        assert send.input_schema == TOOLS["mail_send"].args.model_json_schema(by_alias=True)
        assert set(send.input_schema["required"]) == {"to", "subject", "body"}
        assert send.input_schema["additionalProperties"] is False
        assert all(t.description for t in listed.values())
        [prompt] = (await client.list_prompts()).prompts
        assert prompt.name == "inbox"
        if "list_inbox" in TOOLS:
            got = await client.get_prompt("inbox")
            [message] = got.messages
            assert isinstance(message.content, types.TextContent)
            assert "yourTurn" in message.content.text


async def test_the_legacy_handshake_binds_a_session_to_its_principal(
        embedded: Embedded) -> None:
    """The 2025 handshake (stateful sessions) works too, as the token's principal."""
    async with mcp_http(embedded, _token(embedded, "agent:builder"), mode="legacy") as client:
        sent = _result(await client.call_tool(
            "mail_send", {"to": "scout", "subject": "Legacy", "body": "hello"}))
        assert sent["mail"]["from_principal"] == "agent:builder"
    # Another principal cannot use a session it did not open: a fresh one answers as itself.
    async with mcp_http(embedded, _token(embedded, "agent:scout"), mode="legacy") as client:
        listed = _result(await client.call_tool("mail_list", {}))
        assert [m["subject"] for m in listed["mails"]] == ["Legacy"]


async def test_refusals_over_mcp_streamable_http(embedded: Embedded) -> None:
    async def refusal(who: str | None, tool: str, args: dict[str, Any]) -> tuple[int, str, str]:
        if who is None or who.startswith("vm_"):
            headers = {"Authorization": f"Bearer {who}"} if who else {}
            with pytest.raises(Exception):  # noqa: B017  the SDK client cannot connect
                async with mcp_http(embedded, who or "") as client:
                    await client.list_tools()
            async with httpx2.AsyncClient() as http:
                resp = await http.post(embedded.app_url + "/mcp", headers=headers,
                                       json={"jsonrpc": "2.0", "id": 1, "method": "tools/list"})
            assert resp.headers["www-authenticate"].startswith("Bearer")
            err = resp.json()["error"]
            assert err["code"] == -32001 and err["message"].startswith("unauthenticated: ")
            return resp.status_code, err["data"]["code"], err["data"]["message"]
        async with mcp_http(embedded, _token(embedded, who)) as client:
            return _refused(await client.call_tool(tool, args))

    await run_refusals(embedded, refusal)


async def test_refusals_over_mcp_stdio(embedded: Embedded) -> None:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "bot.cli.main", "mcp", cwd=str(ROOT),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    _, err = await proc.communicate()
    assert proc.returncode == 2 and b"--token" in err, "no token: it says how to give one"

    async with AsyncExitStack() as stack:
        clients: dict[str, Client] = {}

        async def refusal(who: str | None, tool: str,
                          args: dict[str, Any]) -> tuple[int, str, str]:
            assert who is not None
            if who == "agent:scout":
                who = "agent:builder"  # one server less to start: bad arguments are bad for all
            if who.startswith("vm_"):  # a token that acts for no one: it does not start
                proc = await asyncio.create_subprocess_exec(
                    sys.executable, "-m", "bot.cli.main", "mcp", "--token", who, "--app",
                    embedded.app_url, "--json", cwd=str(ROOT), stdin=asyncio.subprocess.PIPE,
                    stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
                out, err = await proc.communicate()
                shown = json.loads(out)
                assert proc.returncode == 2 and shown["ok"] is False, err
                assert len(err.decode().strip().splitlines()) == 1, err
                return 401, shown["error"]["code"], shown["error"]["message"]
            if who not in clients:
                params = _stdio_params(embedded, "--as", who, "--data", str(embedded.data_dir))
                clients[who] = await stack.enter_async_context(Client(params))
            return _refused(await clients[who].call_tool(tool, args))

        await run_refusals(embedded, refusal, no_token=False)


async def test_an_agent_calling_agent_chat_over_mcp_is_denied(embedded: Embedded) -> None:
    async with mcp_http(embedded, _token(embedded, "agent:builder")) as client:
        status, code, message = _refused(await client.call_tool(
            "agent_chat", {"agent": "scout", "message": "hi"}))
    assert (status, code) == (403, "denied") and "for people" in message


async def test_a_token_revoked_mid_session_is_refused_at_once(embedded: Embedded) -> None:
    store = embedded.services.store
    token = await api_tokens.create_token(store, "agent:builder")
    async with mcp_http(embedded, token, mode="legacy") as client:
        await client.list_tools()
        newest = (await api_tokens.list_tokens(store))[-1]
        assert newest.last_used_at is not None
        await api_tokens.revoke_token(store, newest.id)
        with pytest.raises(Exception, match="unauthenticated: this API token is unknown or rev"):
            await client.call_tool("mail_list", {})


QUESTION: dict[str, Any] = {
    "targetType": "outcome", "to": ["marco@acme.com"], "header": "Token TTL",
    "body": "After the migration, should existing sessions keep working?",
    "options": [
        {"label": "Keep 30 days", "recommended": True,
         "description": "Nobody is signed out; we carry dual-read code for a month."},
        {"label": "Force re-login",
         "description": "Everyone signs in again once; the migration ships clean."}]}


async def test_the_inbox_prompt_takes_a_person_through_their_turn(
        embedded: Embedded, person: Any) -> None:
    issue = await person("marco").open_issue("acme/scout-vault", "Auth migration",
                                             "Ship the auth migration", labels=["outcome"])
    await embedded.settle()
    item = f"acme/scout-vault#{issue['number']}"
    async with mcp_http(embedded, _token(embedded, "agent:scout")) as scout:
        asked = _result(await scout.call_tool("add_comment", {**QUESTION, "target": item}))
    async with mcp_http(embedded, _token(embedded, "human:marco@acme.com")) as marco:
        got = await marco.get_prompt("inbox")
        [message] = got.messages
        assert isinstance(message.content, types.TextContent)
        text = message.content.text
        assert "1 card(s)" in text and "Header: Token TTL" in text
        assert "Option 1. Keep 30 days (recommended): Nobody is signed out" in text
        assert "Option 2. Force re-login: Everyone signs in again once" in text
        assert "Option 3. Defer" in text and "deferred" in text and "add_comment" in text
        [card] = (await marco.call_tool("list_inbox", {})).structured_content[  # type: ignore[index]
            "you"]["yourTurn"]
        # answering as the prompt says records the reply, and the card leaves the stack
        _result(await marco.call_tool("add_comment", {
            "targetType": "outcome", "target": card["item"], "parent": card["thread"],
            "option": 1}))
        after = await marco.get_prompt("inbox")
        content = after.messages[0].content
        assert isinstance(content, types.TextContent) and "Nothing is waiting" in content.text
    assert asked  # the question was posted by scout


async def test_an_unknown_tool_is_json_rpcs_invalid_params(embedded: Embedded) -> None:
    """MCP: an unknown tool is a protocol error (-32602), not a tool's isError result
    (issue 23); the message names the tools there are."""
    from mcp.shared.exceptions import MCPError

    async with mcp_http(embedded, _token(embedded, "agent:scout")) as client:
        with pytest.raises(MCPError) as raised:
            await client.call_tool("no_such_tool", {})
    assert raised.value.error.code == types.INVALID_PARAMS == -32602
    assert "no_such_tool" in raised.value.error.message
    assert "mail_send" in raised.value.error.message


async def test_a_runs_token_over_mcp_sends_mail_a_hop_past_the_mail_that_woke_the_run(
        embedded: Embedded, tools: Any, person: Any) -> None:
    """A mail run's token (bot.app.runs: one per run, naming the run's mail) acts over /mcp as
    over the tool endpoint: fresh mail sent with it is one hop more than the mail that woke
    the run, its agents' turns counted, so two agents answering each wake with fresh mail
    reach the loop guard whichever face they use. The agent's long-lived token starts at 0."""
    builder, scout = tools("agent:builder"), tools("agent:scout")
    ping = (await builder("mail_send", to="scout", subject="Ping", body="ping"))["mail"]
    pong = (await scout("mail_send", to="builder", subject="Re: Ping", body="pong",
                        inReplyTo=ping["ref"]))["mail"]
    woke = (await builder("mail_send", to="scout", subject="Re: Ping", body="ping again",
                          inReplyTo=pong["ref"]))["mail"]
    await scout("mail_open", mail=woke["ref"])
    await person("builder-bot").comment(woke["vault"], woke["number"], "any news?")
    await embedded.settle()  # builder's follow-up woke scout: hop 2, and one agent's turn
    got = (await scout("mail_get", mail=woke["ref"]))["mail"]
    assert (got["hops"], got["agent_turns"], got["state"]) == (2, 1, "mail:new"), got
    run = await api_tokens.create_token(embedded.services.store, "agent:scout", "acme",
                                        lasts=60.0, woken_by=woke["mail_id"])
    fresh = {"to": "builder", "subject": "Fresh", "body": "news"}
    async with mcp_http(embedded, run) as client:
        sent = _result(await client.call_tool("mail_send", fresh))["mail"]
    assert (sent["hops"], sent["state"]) == (4, "quiet"), sent
    async with mcp_http(embedded, _token(embedded, "agent:scout")) as client:
        sent = _result(await client.call_tool("mail_send", fresh))["mail"]
    assert (sent["hops"], sent["state"]) == (0, "mail:new"), sent


async def test_a_chat_runs_token_starts_at_hop_0_and_climbs_per_recipient(
        embedded: Embedded) -> None:
    """A chat run (a person's chat: its token names `chat:<n>`, no mail) sends from hop 0, as
    the person would, and is a budget as a mail run is: each send from it to one recipient is
    a hop past the last, so a chat run cannot wake another agent without end (it sent every
    mail at 0); another recipient starts at 0 again."""
    run = await api_tokens.create_token(embedded.services.store, "agent:scout", "acme",
                                        lasts=60.0, woken_by="chat:1")
    async with mcp_http(embedded, run) as client:
        sent = [_result(await client.call_tool("mail_send", {
            "to": to, "subject": "From chat", "body": "news"}))["mail"]
            for to in ("builder", "builder", "critic", "builder", "builder")]
    assert [(m["to_principal"], m["hops"], m["state"]) for m in sent] == [
        ("agent:builder", 0, "mail:new"), ("agent:builder", 1, "mail:new"),
        ("agent:critic", 0, "mail:new"), ("agent:builder", 2, "mail:new"),
        ("agent:builder", 3, "mail:new")], sent


async def test_a_run_named_where_it_cannot_count_is_refused_not_ignored(
        embedded: Embedded) -> None:
    """`mail_send`'s `run` names the agent's run a mail is sent from. Given where it cannot
    count, it was dropped without a word: by a person (whose mail is sent from no run), and
    beside a run's own token (which names its run already), where a run that is not the
    token's own, or none at all, was taken as the token's. Each is now a 422 that says what
    to do, and nothing is sent."""
    store = embedded.services.store
    run = await api_tokens.create_token(store, "agent:scout", "acme", lasts=60.0,
                                        woken_by="chat:1")
    marco = embedded.api_tokens["human:marco@acme.com"]
    before = await store.fetchone("SELECT count(*) AS n FROM mails")
    for token in (marco, run):
        async with mcp_http(embedded, token) as client:
            refused = await client.call_tool("mail_send", {
                "to": "builder", "subject": "Which run?", "body": "b", "run": 999})
        assert refused.is_error, refused
        text = refused.content[0].text  # type: ignore[union-attr]
        assert "run" in text and ("leave it out" in text or "leave `run` out" in text), text
    after = await store.fetchone("SELECT count(*) AS n FROM mails")
    assert after["n"] == before["n"], "nothing was sent"
