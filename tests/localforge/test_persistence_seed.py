"""Persistence across restarts, seeding from an office config, and the CLI."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import io
from pathlib import Path

import aiohttp

from bot.localforge import LocalForge
from bot.localforge.cli import add_forge_parser, run_forge
from bot.localforge.seed import seed_office
from bot.office import load_office


async def _get(url: str, token: str) -> tuple[int, object]:
    async with aiohttp.ClientSession() as s, s.get(
            url, headers={"Authorization": f"token {token}"}) as r:
        return r.status, await r.json()


async def test_state_survives_a_restart_on_the_same_data_dir(tmp_path: Path) -> None:
    forge = LocalForge(data_dir=tmp_path)
    await forge.start()
    token = forge.add_user("admin")
    forge.add_org("acme", owner="admin")
    forge.add_repo("acme", "vault")
    async with aiohttp.ClientSession() as s, s.post(
            f"{forge.url}/repos/acme/vault/issues",
            json={"title": "kept", "labels": ["mail:new"]},
            headers={"Authorization": f"token {token}"}) as r:
        assert r.status == 201
    forge.clock.advance(100)
    offset = forge.clock.offset
    await forge.stop()

    again = LocalForge(data_dir=tmp_path)
    await again.start()
    try:
        status, issues = await _get(f"{again.url}/repos/acme/vault/issues", token)
        assert status == 200
        assert [(i["title"], [lb["name"] for lb in i["labels"]])  # type: ignore[index]
                for i in issues] == [("kept", ["mail:new"])]  # type: ignore[attr-defined]
        assert again.clock.offset == offset
        async with aiohttp.ClientSession() as s, s.post(
                f"{again.url}/repos/acme/vault/issues", json={"title": "next"},
                headers={"Authorization": f"token {token}"}) as r:
            assert (await r.json())["number"] == 2
    finally:
        await again.stop()


async def test_seed_office_sets_up_the_org_as_designed() -> None:
    office = load_office()
    forge = LocalForge()
    await forge.start()
    try:
        tokens = seed_office(forge, office)
        assert set(tokens) == {"admin", "marco", "sara", "lee", "scout-bot", "builder-bot",
                               "critic-bot"}

        async def perm(repo: str, login: str) -> str:
            status, body = await _get(
                f"{forge.url}/repos/{repo}/collaborators/{login}/permission", tokens["admin"])
            assert status == 200
            return str(body["role_name"])  # type: ignore[index]

        assert await perm("acme/scout-vault", "admin") == "admin"
        assert await perm("acme/scout-vault", "lee") == "write"
        assert await perm("acme/scout-vault", "scout-bot") == "write"
        assert await perm("acme/builder-vault", "scout-bot") == "read"
        status, members = await _get(f"{forge.url}/orgs/acme/teams/pricing/members",
                                     tokens["marco"])
        assert status == 200
        assert {m["login"] for m in members} == {"sara", "marco"}  # type: ignore[attr-defined,index]
        status, body = await _get(f"{forge.url}/repos/acme/.github/contents/vaultmail.yml",
                                  tokens["marco"])
        assert status == 200 and body["name"] == "vaultmail.yml"  # type: ignore[index]
        status, _ = await _get(f"{forge.url}/repos/acme/scout-vault", tokens["critic-bot"])
        assert status == 200
    finally:
        await forge.stop()


async def test_cli_serves_and_prints_ready(tmp_path: Path) -> None:
    parser = argparse.ArgumentParser(prog="vaultmail")
    sub = parser.add_subparsers(dest="command")
    add_forge_parser(sub)
    office = Path(__file__).resolve().parents[2] / "bot" / "example_office.yml"
    tokens_file = tmp_path / "tokens.json"
    args = parser.parse_args(["forge", "--seed", str(office), "--port", "0",
                              "--tokens", str(tokens_file)])
    assert args.func is run_forge
    stop = asyncio.Event()
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        task = asyncio.create_task(run_forge(args, stop))
        for _ in range(200):
            if "forge ready" in out.getvalue():
                break
            await asyncio.sleep(0.01)
    line = out.getvalue().strip()
    assert line.startswith("forge ready http://127.0.0.1:")
    import json

    tokens = json.loads(tokens_file.read_text())["forge_tokens"]
    status, _ = await _get(f"{line.split()[-1]}/repos/acme/scout-vault", tokens["marco"])
    assert status == 200
    stop.set()
    assert await task == 0
