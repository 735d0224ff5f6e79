"""Forge requests each mail operation costs, counted from the local forge's request log.

Run: .venv/bin/python -m bench.requests_per_operation
Target (DESIGN §6): send 1, open 1, reply to an agent 2, close 1, tamper check 0.
"""

from __future__ import annotations

import asyncio
import tempfile
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp

from bot.app.embedded import Embedded, start_embedded


async def _count(embedded: Embedded, action: Callable[[], Awaitable[Any]]) -> list[str]:
    await embedded.settle()
    before = len(embedded.forge.requests.records)
    await action()
    await embedded.settle()
    return [f"{r.route} {r.status}" for r in embedded.forge.requests.records[before:]
            if r.auth in ("installation", "app")]


async def main() -> None:
    embedded = await start_embedded(data_dir=Path(tempfile.mkdtemp()), port=0, forge_port=0)
    rows: list[tuple[str, list[str], int]] = []
    try:
        async with aiohttp.ClientSession() as session:
            async def tool(principal: str, name: str, **args: Any) -> Any:
                headers = {"Authorization": f"Bearer {embedded.api_tokens[principal]}"}
                async with session.post(f"{embedded.app_url}/api/v1/tools/{name}",
                                        json=args, headers=headers) as resp:
                    return await resp.json()

            async def forge(login: str, method: str, path: str, body: Any) -> Any:
                headers = {"Authorization": f"token {embedded.forge_tokens[login]}"}
                async with session.request(method, embedded.forge.url + path, json=body,
                                           headers=headers) as resp:
                    return await resp.json()

            sent: dict[str, Any] = {}

            async def send() -> None:
                sent.update((await tool("agent:builder", "mail_send", to="scout",
                                        subject="Spec", body="Review the spec"))["mail"])

            rows.append(("send (mail_send)", await _count(embedded, send), 1))
            rows.append(("open (mail_open)", await _count(embedded, lambda: tool(
                "agent:scout", "mail_open", mail=sent["ref"])), 1))
            rows.append(("reply to an agent, by comment in the forge", await _count(
                embedded, lambda: forge("scout-bot", "POST",
                                        f"/repos/{sent['vault']}/issues/{sent['number']}/comments",
                                        {"body": "Looks fine"})), 2))
            rows.append(("close (mail_close)", await _count(embedded, lambda: tool(
                "agent:builder", "mail_close", mail=sent["ref"])), 1))
            issue = await forge("admin", "GET",
                                f"/repos/{sent['vault']}/issues/{sent['number']}", None)
            rows.append(("tamper check on issues.edited (title unchanged)", await _count(
                embedded, lambda: forge("admin", "PATCH",
                                        f"/repos/{sent['vault']}/issues/{sent['number']}",
                                        {"body": issue["body"]})), 0))
    finally:
        await embedded.stop()
    print("command: .venv/bin/python -m bench.requests_per_operation\n")
    print(f"| {'operation':<48} | requests | target | detail")
    print(f"|{'-' * 50}|----------|--------|-------")
    for name, reqs, target in rows:
        reads = [r for r in reqs if r.startswith("GET")]
        print(f"| {name:<48} | {len(reqs) - len(reads):>3} w {len(reads):>2} r | {target:>6} | "
              f"{'; '.join(reqs)}")


if __name__ == "__main__":
    asyncio.run(main())
