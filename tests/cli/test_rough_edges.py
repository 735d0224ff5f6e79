"""Issue 23's smaller rough edges of the shell, each as a newcomer or operator meets it, run as
real processes: `vaultmail inbox` names the cards it lists, `up` and `demo` without `--data`
leave nothing in the temp directory, a wrong setting is reported under the name it was set by,
the HTTP tool listing speaks MCP's names, and `serve --help` lists every variable it reads."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import socket
import sys
from pathlib import Path
from typing import Any

import aiohttp
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa

from bot.app.embedded import Embedded
from tests.items_support import MARCO, SCOUT, make_item
from tests.support import free_port
from tests.test_cli_tools import vaultmail

ROOT = Path(__file__).resolve().parents[2]


async def _cli(*argv: str, cwd: Path, env: dict[str, str],
               ) -> asyncio.subprocess.Process:
    return await asyncio.create_subprocess_exec(
        sys.executable, "-m", "bot.cli.main", *argv, cwd=str(cwd),
        env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(cwd),
             "PYTHONPATH": str(ROOT), **env},
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)


async def _run(*argv: str, cwd: Path, env: dict[str, str]) -> tuple[int, str, str]:
    proc = await _cli(*argv, cwd=cwd, env=env)
    out, err = await asyncio.wait_for(proc.communicate(), 120)
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


# -- `vaultmail inbox` names each card by the id its tools take ---------------------------

async def test_inbox_shows_the_thread_of_a_question_not_none(
        embedded: Embedded, person: Any, tools: Any) -> None:
    outcome = await make_item(embedded, person("marco"), "outcome", "Beta",
                              assignees=["scout-bot"])
    asked = await tools(SCOUT)("add_comment", targetType="outcome", target=outcome,
                               header="Ship the beta", body="Ship Friday?",
                               options=[{"label": "Yes"}, {"label": "No"}],
                               to=["marco@acme.com"])
    thread = asked["comment"]["id"]
    code, out, err = await vaultmail("inbox", "--as", MARCO, "--data", str(embedded.data_dir))
    assert code == 0, err
    assert "None" not in out, out
    line = next(x for x in out.splitlines() if "Ship the beta" in x)
    assert line.strip().startswith(f"[{thread}] {outcome}"), line
    assert "1. Yes" in out and "2. No" in out


# -- `up` and `demo` without --data clean up after themselves ----------------------------

async def test_up_without_data_leaves_nothing_in_the_temp_directory(tmp_path: Path) -> None:
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    env = {"TMPDIR": str(tmp)}
    proc = await _cli("up", "--port", str(free_port()), "--forge-port", str(free_port()),
                      cwd=tmp_path, env=env)
    assert proc.stdout is not None
    try:
        ready = (await asyncio.wait_for(proc.stdout.readline(), 90)).decode()
        assert "ready" in ready, ready
        tokens = re.search(r"tokens (\S+)", ready)
        assert tokens is not None and Path(tokens[1]).is_relative_to(tmp), ready
        assert any(tmp.iterdir()), "its data lives in the temp directory while it runs"
    finally:
        proc.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(proc.wait(), 60) == 0
    assert list(tmp.iterdir()) == [], "stopped, it leaves no data (and no keys) behind"

    # a start that fails (its port in use) leaves nothing either
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        code, _, err = await _run("up", "--port", str(busy.getsockname()[1]),
                                  "--forge-port", str(free_port()), cwd=tmp_path, env=env)
    assert code == 2 and "Traceback" not in err, err
    assert list(tmp.iterdir()) == []


async def test_demo_without_data_leaves_nothing_in_the_temp_directory(tmp_path: Path) -> None:
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    code, out, err = await _run("demo", cwd=tmp_path, env={"TMPDIR": str(tmp)})
    assert code == 0 and "demo passed" in out, (out, err)
    assert list(tmp.iterdir()) == []


# -- a wrong setting is reported under the name the operator set -------------------------

def _pem() -> str:
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption()).decode()


async def _serve_refuses(tmp_path: Path, env: dict[str, str], dot_env: str = "") -> str:
    """`vaultmail serve` with these settings: exit 2, one line, no traceback; the line."""
    (tmp_path / ".env").write_text(dot_env)
    code, out, err = await _run("serve", cwd=tmp_path, env={"HOST": "127.0.0.1",
                                                            "PORT": str(free_port()), **env})
    assert code == 2, (code, out, err)
    lines = [x for x in err.splitlines() if x.strip()]
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


async def test_a_wrong_setting_names_the_variable_that_was_set(tmp_path: Path) -> None:
    key = tmp_path / "app.pem"
    key.write_text(_pem())
    good = {"PRIVATE_KEY_PATH": str(key), "WEBHOOK_SECRET": "s"}

    line = await _serve_refuses(tmp_path, {**good, "APP_ID": "abc"})
    assert line.startswith("vaultmail: APP_ID='abc': should be the App's numeric id"), line
    assert "GITHUB_APP_ID" not in line

    line = await _serve_refuses(tmp_path, good, dot_env="APP_ID=abc\n")
    assert line.startswith("vaultmail: APP_ID='abc'"), line
    assert ".env" in line, "it says where the value came from"

    line = await _serve_refuses(tmp_path, {**good, "GITHUB_APP_ID": "x1"})
    assert line.startswith("vaultmail: GITHUB_APP_ID='x1'"), line

    line = await _serve_refuses(tmp_path, {"APP_ID": "1", "WEBHOOK_SECRET": "s",
                                           "PRIVATE_KEY": "abc"})
    assert line.startswith("vaultmail: PRIVATE_KEY: not a PEM private key"), line
    assert "PRIVATE_KEY_PATH" not in line

    line = await _serve_refuses(tmp_path, {"APP_ID": "1", "WEBHOOK_SECRET": "s",
                                           "PRIVATE_KEY_PATH": str(tmp_path / "nope.pem")})
    assert line.startswith(f"vaultmail: PRIVATE_KEY_PATH={tmp_path / 'nope.pem'}: cannot "
                           "read it"), line
    assert "GITHUB_PRIVATE_KEY_PATH" not in line

    line = await _serve_refuses(tmp_path, {"APP_ID": "1", "WEBHOOK_SECRET": "s",
                                           "GITHUB_PRIVATE_KEY_PATH": str(tmp_path)})
    assert line.startswith(f"vaultmail: GITHUB_PRIVATE_KEY_PATH={tmp_path}: "), line

    # a value in both: the environment's wins, and is the one named
    line = await _serve_refuses(tmp_path, {**good, "APP_ID": "env1x"}, dot_env="APP_ID=7\n")
    assert line.startswith("vaultmail: APP_ID='env1x'") and ".env" not in line, line


async def test_a_wrong_setting_is_said_before_the_app_is_loaded(tmp_path: Path) -> None:
    """An operator's typo is answered at once: `serve` reads its settings before it loads the
    app (before, every module of the app was loaded first, two seconds here)."""
    key = tmp_path / "app.pem"
    key.write_text(_pem())
    (tmp_path / ".env").write_text("")
    code, _, err = await _run("serve", cwd=tmp_path, env={
        "PRIVATE_KEY_PATH": str(key), "WEBHOOK_SECRET": "s", "APP_ID": "abc",
        "PYTHONPROFILEIMPORTTIME": "1"})  # (each module loaded, on stderr)
    assert code == 2 and "APP_ID='abc'" in err, err
    loaded = {line.rsplit("|", 1)[-1].strip() for line in err.splitlines()
              if line.startswith("import time:")}
    assert "bot.app.settings" in loaded and "bot.app.web" not in loaded, sorted(
        m for m in loaded if m.startswith("bot."))


# -- the HTTP tool listing uses MCP's names ----------------------------------------------

async def test_the_http_tool_listing_says_input_schema_as_mcp_does(embedded: Embedded) -> None:
    async with aiohttp.ClientSession() as s, s.get(embedded.app_url + "/api/v1/tools") as resp:
        assert resp.status == 200
        listed = (await resp.json())["tools"]
    for t in listed:
        assert "inputSchema" in t and "outputSchema" in t, sorted(t)
        assert "input_schema" not in t and "output_schema" not in t, sorted(t)
    code, out, err = await vaultmail("tools", "--data", str(embedded.data_dir))
    assert code == 0 and "mail_send to subject body [inReplyTo]" in out, (out, err)


# -- `serve --help` lists every variable serve reads -------------------------------------

async def test_serve_help_lists_every_variable_serve_reads(tmp_path: Path) -> None:
    from pydantic import AliasChoices

    from bot.app.settings import _EnvFile

    code, out, err = await _run("serve", "--help", cwd=tmp_path, env={})
    assert code == 0, err
    missing = []
    for name, info in _EnvFile.model_fields.items():
        alias = info.validation_alias
        assert isinstance(alias, AliasChoices), name
        missing += [str(v) for v in alias.choices
                    if not re.search(rf"(^|[\s,(]){re.escape(str(v))}\b", out)]
    assert missing == [], f"serve --help does not mention {missing}"
    assert "--smtp-port" in out


# -- start-up failures: one line naming the port or file and what to do, exit 2 -----------

async def test_start_up_failures_name_the_port_or_file_and_what_to_do(tmp_path: Path) -> None:
    nope = tmp_path / "nope.yml"
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        runs = {
            "forge port": (["forge", "--port", str(port)], [f"127.0.0.1:{port}", "--port"]),
            "up office": (["up", "--office", str(nope), "--port", str(free_port()),
                           "--forge-port", str(free_port())], ["--office", str(nope)]),
            "forge seed": (["forge", "--seed", str(nope), "--port", str(free_port())],
                           ["--seed", str(nope)]),
        }
        for what, (argv, named) in runs.items():
            code, out, err = await _run(*argv, cwd=tmp_path, env={})
            lines = [x for x in err.splitlines() if x.strip()]
            assert code == 2 and len(lines) == 1 and "Traceback" not in err, (what, code, err)
            assert all(n in lines[0] for n in named), (what, lines[0])
            assert "--data" not in lines[0], (what, lines[0])
            assert "ready" not in out, (what, out)


async def test_a_command_with_no_app_to_act_for_says_so_in_one_line(tmp_path: Path) -> None:
    """No --data and no App settings: one line naming both ways, not the 15 lines of serve's
    quick start."""
    for argv in (["reindex"], ["verify", "acme/scout-vault#1"]):
        code, out, err = await _run(*argv, cwd=tmp_path, env={})
        lines = [x for x in err.splitlines() if x.strip()]
        assert code == 2 and len(lines) == 1 and "Traceback" not in err, (argv, code, err)
        assert lines[0].startswith(f"vaultmail {argv[0]}: "), lines[0]
        assert "--data" in lines[0] and "GITHUB_APP_ID" in lines[0], lines[0]
