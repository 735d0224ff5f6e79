"""The tools from the shell: `vaultmail send/open/reply/close/inbox/call ...` as a principal,
run as real subprocesses against the embedded app."""

from __future__ import annotations

import asyncio
import json
import re
import sys
from pathlib import Path
from typing import Any

from bot.app.embedded import Embedded
from tests.tool_scenario import run_refusals, run_scenario

ROOT = Path(__file__).resolve().parent.parent
_REFUSED = re.compile(r"refused \((\d{3}) (\S+)\): (.*)$", re.S)


async def vaultmail(*argv: str, stdin: str | None = None) -> tuple[int, str, str]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "bot.cli.main", *argv, cwd=str(ROOT),
        stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE)
    out, err = await proc.communicate(stdin.encode() if stdin is not None else None)
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


def _as(embedded: Embedded, who: str) -> list[str]:
    if who.startswith("vm_"):
        return ["--token", who, "--app", embedded.app_url]
    return ["--as", who, "--data", str(embedded.data_dir)]


def _argv(tool: str, args: dict[str, Any]) -> list[str]:
    if tool == "mail_send":
        return ["send", str(args.get("to")), str(args.get("subject")), str(args.get("body"))]
    if tool in ("mail_open", "mail_close"):
        return [tool.removeprefix("mail_"), args["mail"]]
    if tool == "mail_reply":
        return ["reply", args["mail"], args["body"]]
    if tool == "list_inbox":
        return ["inbox"]
    return ["call", tool, "--args", json.dumps(args)]


async def test_the_scenario_through_the_shell(embedded: Embedded) -> None:
    async def call(principal: str, tool: str, args: dict[str, Any]) -> dict[str, Any]:
        code, out, err = await vaultmail(*_argv(tool, args), *_as(embedded, principal),
                                         "--json")
        assert code == 0, err
        shown = json.loads(out)
        assert set(shown) == {"ok", "result"} and shown["ok"] is True
        result: dict[str, Any] = shown["result"]
        return result

    await run_scenario(embedded, call)


async def test_refusals_through_the_shell(embedded: Embedded) -> None:
    code, out, err = await vaultmail("send", "scout", "Hi", "x")
    assert code == 2 and "--token" in err and "--as" in err and out == ""

    async def refusal(who: str | None, tool: str, args: dict[str, Any]) -> tuple[int, str, str]:
        assert who is not None
        argv = (["call", tool, "--args", json.dumps(args)] if tool == "mail_send"
                and not isinstance(args.get("subject"), str) else _argv(tool, args))
        code, out, err = await vaultmail(*argv, *_as(embedded, who), "--json")
        assert code == 1, (code, out, err)
        m = _REFUSED.search(err.strip())
        assert m, err
        shown = json.loads(out)
        assert shown["ok"] is False and shown["error"] == {"code": m[2], "message": m[3]}
        assert set(shown) == ({"ok", "error", "inbox"} if who.startswith("agent:")
                              else {"ok", "error"})
        return int(m[1]), m[2], m[3]

    await run_refusals(embedded, refusal, no_token=False)


async def test_human_readable_output_and_the_generic_call(embedded: Embedded) -> None:
    me = _as(embedded, "builder")  # a short name: agent:builder
    code, out, err = await vaultmail("send", "scout", "Spec", "-", *me, stdin="Spec v2\n")
    assert code == 0, err
    assert re.match(r"acme/scout-vault#1 +new +agent:builder -> agent:scout  Spec", out)
    code, out, err = await vaultmail("call", "mail_send", "--arg", "to=scout",
                                     "--arg", "subject=More", "--arg", "body=42",
                                     *_as(embedded, "marco"), "--json")
    assert code == 0, err
    assert json.loads(out)["result"]["mail"]["body"] == "42", "a number for a text field is text"
    code, out, err = await vaultmail("inbox", *_as(embedded, "scout"))
    assert code == 0, err
    assert "Mail waiting for you (2):" in out and "from agent:builder: Spec" in out
    code, out, err = await vaultmail("call", "mail_send", "--arg", "to=scout",
                                     *_as(embedded, "scout"))
    assert code == 1 and "422 invalid_arguments" in err and "subject: Field required" in err
    code, out, err = await vaultmail("tools", "--data", str(embedded.data_dir))
    assert code == 0 and "mail_send to subject body [inReplyTo]" in out
