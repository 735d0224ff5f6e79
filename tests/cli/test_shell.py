"""The shell as scripts and people expect it: an infrastructure problem (the app or the forge
unreachable, a data directory that is not one) is one line that says what to do, never a
traceback, for every command; every `--json` output has one shape; `verify` exits 0 valid, 1
tampered or unsigned, 2 not found or a usage problem. Each command runs as a real process."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa

from bot.app.embedded import Embedded
from tests.support import free_port
from tests.test_cli_tools import vaultmail

SCOUT_VAULT = "acme/scout-vault"


def _one_line(code: int, err: str, expect: int = 2) -> str:
    assert code == expect, err
    assert "Traceback" not in err, err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1, err
    return lines[0]


def _json_failure(out: str, code: str) -> dict[str, Any]:
    shown: dict[str, Any] = json.loads(out)
    assert shown["ok"] is False and shown["error"]["code"] == code, shown
    assert set(shown["error"]) == {"code", "message"}
    return shown


async def test_version() -> None:
    code, out, err = await vaultmail("--version")
    assert code == 0 and out.startswith("vaultmail 0."), (out, err)


TOOL_COMMANDS = [["send", "scout", "Hi", "text"], ["open", "acme/scout-vault#1"],
                 ["reply", "acme/scout-vault#1", "ok"], ["close", "acme/scout-vault#1"],
                 ["mail"], ["show", "acme/scout-vault#1"], ["inbox"], ["chat", "scout", "hi"],
                 ["call", "mail_list", "--arg", "state=new"], ["mcp"]]


async def test_an_app_that_is_not_there_is_one_line_for_every_command_that_calls_it() -> None:
    app = f"http://127.0.0.1:{free_port()}"
    runs = await asyncio.gather(*(vaultmail(*argv, "--token", "vm_nobody", "--app", app,
                                            "--json", stdin="") for argv in TOOL_COMMANDS))
    for argv, (code, out, err) in zip(TOOL_COMMANDS, runs, strict=True):
        line = _one_line(code, err)
        assert line.startswith(f"vaultmail {argv[0]}: cannot reach the vaultmail app at {app}")
        assert "vaultmail up" in line, line
        _json_failure(out, "app_unreachable")
    code, out, err = await vaultmail("tools", "--app", app, "--json")
    assert "vaultmail up" in _one_line(code, err)
    _json_failure(out, "app_unreachable")


def _office_dir(tmp: Path, forge_url: str) -> Path:
    """A data directory as `vaultmail up --data` leaves it, for a forge at `forge_url`."""
    pem = rsa.generate_private_key(public_exponent=65537, key_size=2048).private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption()).decode()
    data = tmp / "office"
    data.mkdir()
    (data / "app.json").write_text(json.dumps({
        "app_id": 1, "installation_id": 11, "webhook_secret": "s", "private_key_pem": pem}))
    (data / "tokens.json").write_text(json.dumps({
        "forge_url": forge_url, "app_url": f"http://127.0.0.1:{free_port()}",
        "forge_tokens": {}, "api_tokens": {}}))
    return data


async def test_a_forge_that_is_not_there_is_one_line_with_what_to_do(tmp_path: Path) -> None:
    forge = f"http://127.0.0.1:{free_port()}"
    data = str(_office_dir(tmp_path, forge))
    commands = [["reindex"], ["verify", "acme/scout-vault#1", "--keys-url", f"{forge}/k.json"]]
    runs = await asyncio.gather(*(vaultmail(*argv, "--data", data) for argv in commands))
    for argv, (code, _out, err) in zip(commands, runs, strict=True):
        line = _one_line(code, err)
        assert line.startswith(f"vaultmail {argv[0]}: cannot reach the forge at {forge}"), line
        assert "is it running" in line and "--data" in line, line


DATA_COMMANDS = [["token", "create", "agent:scout"], ["token", "list"], ["token", "revoke", "1"],
                 ["ledger"], ["dead-letters"], ["keys", "rotate"],
                 ["keys", "revoke", "vm-acme-20260101-abcdef"], ["reindex"],
                 ["verify", "acme/scout-vault#1"], ["inbox", "--as", "scout"],
                 ["send", "scout", "Hi", "text", "--as", "scout"]]


@pytest.mark.parametrize("kind", ["missing", "a file"])
async def test_a_data_directory_that_is_not_one_is_one_line_and_left_alone(
        tmp_path: Path, kind: str) -> None:
    data = tmp_path / "nothing-here"
    if kind == "a file":
        data.write_text("not a directory")
    runs = await asyncio.gather(*(vaultmail(*argv, "--data", str(data), stdin="")
                                  for argv in DATA_COMMANDS))
    for code, _out, err in runs:
        line = _one_line(code, err)
        assert str(data) in line and "--data" in line, line
        assert "vaultmail up --data" in line, line
    assert not data.is_dir(), "nothing was made in its place"


async def test_every_json_output_has_one_shape(embedded: Embedded) -> None:
    data = str(embedded.data_dir)
    code, out, err = await vaultmail("send", "scout", "Spec", "v1", "--as", "builder",
                                     "--data", data, "--json")
    assert code == 0, err
    sent = json.loads(out)
    assert set(sent) == {"ok", "result"} and sent["ok"] is True
    assert sent["result"]["mail"]["subject"] == "Spec" and "inbox" in sent["result"]

    code, out, err = await vaultmail("send", "critic", "Spec", "v1", "--as", "builder",
                                     "--data", data, "--json")
    assert code == 1
    refused = json.loads(out)
    assert refused["ok"] is False and refused["error"]["code"] == "denied"
    assert set(refused) == {"ok", "error", "inbox"}, "an agent's inbox comes with it"
    assert set(refused["error"]) == {"code", "message"}

    code, out, err = await vaultmail("send", "--as", "builder", "--data", data, "--json")
    assert code == 2 and "usage" in err and out == "", "argparse's own usage errors: no JSON"
    code, out, err = await vaultmail("send", "scout", "S", "b", "--data", data, "--json")
    assert "--as" in _one_line(code, err)
    _json_failure(out, "usage")

    for argv, key in ((["token", "list"], "tokens"), (["ledger"], "entries"),
                      (["dead-letters"], "dead_letters")):
        code, out, err = await vaultmail(*argv, "--data", data, "--json")
        assert code == 0, err
        shown = json.loads(out)
        assert set(shown) == {"ok", "result"} and shown["ok"] is True, shown
        assert isinstance(shown["result"][key], list), shown
    code, out, err = await vaultmail("ledger", "--data", data, "--json")
    entries = json.loads(out)["result"]["entries"]
    assert "mail.sent" in [e["event"] for e in entries]
    assert json.loads(out)["result"]["chain"] == "intact"
    code, out, err = await vaultmail("verify", f"{SCOUT_VAULT}#1", "--data", data, "--json")
    assert code == 0, err
    verified = json.loads(out)
    assert verified["ok"] is True and verified["result"]["status"] == "valid"
    assert verified["result"]["from"] == "agent:builder"


async def test_verify_exits_1_for_tampered_or_unsigned_and_2_for_not_found(
        embedded: Embedded, person: Any, tools: Any) -> None:
    data = str(embedded.data_dir)
    sent = (await tools("agent:builder")("mail_send", to="scout", subject="Spec",
                                         body="v1"))["mail"]
    code, out, err = await vaultmail("verify", sent["ref"], "--data", data)
    assert code == 0 and out.startswith(f"valid: {sent['ref']} signed for office acme by key "
                                        "vm-acme-") and "from agent:builder" in out, (out, err)

    admin = person("admin")
    issue = await admin.issue(SCOUT_VAULT, sent["number"])
    await admin.call("PATCH", f"/repos/{SCOUT_VAULT}/issues/{sent['number']}",
                     {"body": issue["body"].replace("v1", "v2")}, expect=200)
    await embedded.settle()
    code, out, err = await vaultmail("verify", sent["ref"], "--data", data, "--json")
    assert code == 1, (out, err)
    shown = json.loads(out)
    assert shown["ok"] is False and shown["error"]["code"] == "tampered", shown

    plain = await admin.open_issue("acme/builder-vault", "No header", "just text")
    await embedded.settle()
    code, out, err = await vaultmail("verify", f"acme/builder-vault#{plain['number']}",
                                     "--data", data)
    assert code == 1 and out.startswith("unsigned: "), (out, err)

    for ref, why in ((f"{SCOUT_VAULT}#999", "no issue"), ("nonsense", "OWNER/REPO#N"),
                     ("elsewhere/repo#1", "not installed")):
        code, out, err = await vaultmail("verify", ref, "--data", data, "--json")
        assert why in _one_line(code, err), err
        assert json.loads(out)["ok"] is False
