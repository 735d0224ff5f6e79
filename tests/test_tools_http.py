"""The tools over plain HTTP (POST /api/v1/tools/<name>), and `list_inbox` long polls over
HTTP and MCP: woken by what is new, ended when the client goes away."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import aiohttp
import pytest

from bot.app.embedded import Embedded
from tests.support import ToolClient
from tests.test_mcp import mcp_http
from tests.tool_scenario import run_refusals, run_scenario


async def test_the_scenario_over_plain_http(embedded: Embedded, tools: Any) -> None:
    async def call(principal: str, tool: str, args: dict[str, Any]) -> dict[str, Any]:
        result: dict[str, Any] = await tools(principal)(tool, **args)
        return result

    await run_scenario(embedded, call)


async def test_refusals_over_plain_http(embedded: Embedded,
                                        session: aiohttp.ClientSession) -> None:
    async def refusal(who: str | None, tool: str, args: dict[str, Any]) -> tuple[int, str, str]:
        headers = {}
        if who is not None:
            headers["Authorization"] = f"Bearer {embedded.api_tokens.get(who, who)}"
        async with session.post(f"{embedded.app_url}/api/v1/tools/{tool}", json=args,
                                headers=headers) as resp:
            body = await resp.json()
            assert set(body["error"]) == {"code", "message"}
            # an agent's errors carry its inbox, as every result for it does (DESIGN 3.5)
            assert set(body) == ({"error", "inbox"} if who and who.startswith("agent:")
                                 else {"error"}), body
            return resp.status, body["error"]["code"], body["error"]["message"]

    await run_refusals(embedded, refusal)


async def _until(check: Any, timeout: float = 3.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.05)


async def test_a_long_poll_is_woken_by_new_mail(embedded: Embedded, tools: Any) -> None:
    builder: ToolClient = tools("agent:builder")
    started = time.monotonic()
    poll = asyncio.create_task(builder("list_inbox", wait=20))
    await _until(lambda: embedded.services.notifier.waiting() >= 1)
    await tools("agent:scout")("mail_send", to="builder", subject="Ping", body="are you there?")
    result = await asyncio.wait_for(poll, 3)
    assert time.monotonic() - started < 5, "woken at once, not at the end of the wait"
    assert [m["subject"] for m in result["inbox"]["mail"]] == ["Ping"]


async def test_a_long_poll_ends_when_the_http_client_goes_away(embedded: Embedded) -> None:
    notifier = embedded.services.notifier
    token = embedded.api_tokens["human:marco@acme.com"]
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=0.3)) as s:
        with pytest.raises(TimeoutError):
            await s.post(f"{embedded.app_url}/api/v1/tools/list_inbox", json={"wait": 30},
                         headers={"Authorization": f"Bearer {token}"})
    await _until(lambda: notifier.waiting() == 0)


async def test_a_long_poll_ends_when_the_mcp_client_goes_away(embedded: Embedded) -> None:
    notifier = embedded.services.notifier
    async with mcp_http(embedded, embedded.api_tokens["human:marco@acme.com"]) as client:
        poll = asyncio.create_task(client.call_tool("list_inbox", {"wait": 30}))
        await _until(lambda: notifier.waiting() == 1)
        poll.cancel()
        with pytest.raises(asyncio.CancelledError):
            await poll
    await _until(lambda: notifier.waiting() == 0)
