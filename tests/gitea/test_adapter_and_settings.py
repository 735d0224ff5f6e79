"""The Gitea adapter (bot.forge.gitea_events), the settings read from GITEA_*, the client's
never-blind-create rule on Gitea, and the commands that select the dialect."""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import hmac
import json
import signal
import sys
from pathlib import Path

import aiohttp
import pytest

from bot.app.embedded import Embedded
from bot.app.settings import Settings, SettingsError
from bot.cli.main import build_parser
from bot.forge import gitea_events as gitea
from bot.forge.gitea import SYNTHETIC_INSTALLATION_ID, api_base
from tests.support import free_port


def _issue_payload(action: str) -> dict[str, object]:
    return {"action": action, "number": 7,
            "issue": {"id": 1, "number": 7, "title": "t", "body": None, "labels": [
                {"id": 3, "name": "mail:new", "color": "0e8a16"}], "assignees": None,
                "pull_request": None, "user": {"login": "marco", "username": "marco"}},
            "repository": {"full_name": "acme/scout-vault", "name": "scout-vault",
                           "owner": {"username": "acme", "login": "acme"}},
            "sender": {"login": "vaultmail", "username": "vaultmail"}, "commit_id": ""}


def test_label_updated_and_cleared_become_labeled() -> None:
    for action in ("label_updated", "label_cleared"):
        out = gitea.to_github("issues", _issue_payload(action), "vaultmail")
        assert out["action"] == "labeled" and out["gitea_action"] == action
    same = gitea.to_github("issues", _issue_payload("closed"), "vaultmail")
    assert same["action"] == "closed"


def test_shape_installation_and_bot_sender() -> None:
    out = gitea.to_github("issues", _issue_payload("opened"), "vaultmail")
    assert out["installation"] == {"id": SYNTHETIC_INSTALLATION_ID}
    assert out["sender"]["type"] == "Bot" and out["issue"]["user"]["type"] == "User"
    issue = out["issue"]
    assert "pull_request" not in issue and issue["assignees"] == [] and issue["body"] == ""
    assert issue["number"] == 7
    comment = gitea.to_github("issue_comment", {
        "action": "created", "is_pull": True, "issue": {"number": 2, "labels": []},
        "comment": {"id": 5, "body": "x", "user": {"login": "sara"}},
        "sender": {"login": "sara"}, "repository": {"full_name": "acme/x"}}, "vaultmail")
    assert comment["issue"]["pull_request"] == {}, "a pull request comment stays one"


def test_signature_is_bare_hex_hmac() -> None:
    body = b"Hello, World!"
    secret = "It's a Secret to Everybody"
    sig = "757107ea0eb2509fc211221cce984b8a37570b6d7586c22c46f4379c8b043e17"
    assert hmac.new(secret.encode(), body, hashlib.sha256).hexdigest() == sig
    assert gitea.signature_valid(body, sig, secret)
    assert not gitea.signature_valid(body, "sha256=" + sig, secret)
    assert not gitea.signature_valid(body, "", secret)
    assert not gitea.signature_valid(body, "é" * 64, secret)  # (was a TypeError)
    assert gitea.delivery_of({"X-Forgejo-Delivery": "d", "X-Forgejo-Event": "issues",
                              "X-Forgejo-Signature": sig}) == ("d", "issues", sig)


def test_settings_from_gitea_environment(tmp_path: Path) -> None:
    env = {"GITEA_URL": "https://gitea.example.com/", "GITEA_TOKEN": "t",
           "GITEA_WEBHOOK_SECRET": "s", "VAULTMAIL_DATA": str(tmp_path)}
    settings = Settings.from_env(env)
    assert (settings.dialect, settings.api_url, settings.token) == (
        "gitea", "https://gitea.example.com", "t")
    assert api_base(settings.api_url) == "https://gitea.example.com/api/v1"
    with pytest.raises(SettingsError, match="GITEA_WEBHOOK_SECRET"):
        Settings.from_env({"GITEA_URL": "https://g", "GITEA_TOKEN": "t"})
    with pytest.raises(SettingsError, match="GITHUB_APP_ID"):
        Settings.from_env({})


def test_commands_take_the_gitea_dialect() -> None:
    parser = build_parser()
    assert parser.parse_args(["up", "--forge", "gitea"]).forge == "gitea"
    assert parser.parse_args(["forge", "--dialect", "gitea"]).dialect == "gitea"


async def test_a_create_that_lands_then_fails_is_found_by_marker(office: Embedded) -> None:
    forge = office.services.forge_for(None)
    forge.config = dataclasses.replace(  # type: ignore[attr-defined]
        forge.config, backoff_base=0.01, backoff_max=0.05)
    office.forge.faults.add(route="POST /api/v1/repos/{owner}/{repo}/issues", status=502,
                            mode="after", count=1)
    headers = {"Authorization": f"Bearer {office.api_tokens['agent:builder']}"}
    async with aiohttp.ClientSession() as s, s.post(
            office.app_url + "/api/v1/tools/mail_send", headers=headers,
            json={"to": "scout", "subject": "Once", "body": "x"}) as resp:
        assert resp.status == 200, await resp.text()
    issues = office.forge.state.repo("acme", "scout-vault").issues  # type: ignore[union-attr]
    assert [i.title for i in issues.values()] == ["Once"]


async def test_vaultmail_up_forge_gitea(tmp_path: Path) -> None:
    port, forge_port = free_port(), free_port()
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "bot.cli.main", "up", "--forge", "gitea", "--data", str(tmp_path),
        "--port", str(port), "--forge-port", str(forge_port),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.DEVNULL)
    assert proc.stdout is not None
    try:
        line = (await asyncio.wait_for(proc.stdout.readline(), 60)).decode()
        assert "ready" in line
        tokens = json.loads((tmp_path / "tokens.json").read_text())
        async with aiohttp.ClientSession() as s:
            headers = {"Authorization": f"token {tokens['forge_tokens']['marco']}"}
            async with s.get(tokens["forge_url"] + "/api/v1/version") as resp:
                assert resp.status == 200
            async with s.post(tokens["forge_url"] + "/api/v1/repos/acme/scout-vault/issues",
                              headers=headers, json={"title": "Hi", "body": "x"}) as resp:
                assert resp.status == 201
            for _ in range(100):  # the app adopts it through the org webhook
                async with s.get(tokens["forge_url"] +
                                 "/api/v1/repos/acme/scout-vault/issues/1",
                                 headers=headers) as resp:
                    labels = [lb["name"] for lb in (await resp.json())["labels"]]
                if labels == ["mail/new"]:
                    break
                await asyncio.sleep(0.05)
            assert labels == ["mail/new"]
    finally:
        proc.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(proc.wait(), 30) == 0
