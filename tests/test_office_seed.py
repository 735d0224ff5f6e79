"""Seeding a local forge from an office config (the embedded default, `vaultmail forge --seed`)."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import io
from pathlib import Path

import aiohttp

from bot.office.config import load_office
from bot.office.seed import seed_office, seed_office_file
from localforge import LocalForge
from localforge.cli import add_forge_parser, run_forge


async def _get(url: str, token: str) -> tuple[int, object]:
    async with aiohttp.ClientSession() as s, s.get(
            url, headers={"Authorization": f"token {token}"}) as r:
        return r.status, await r.json()


async def test_seed_office_sets_up_the_org_as_designed() -> None:
    office = load_office()
    forge = LocalForge()
    await forge.start()
    try:
        tokens = seed_office(forge, office)
        assert set(tokens) == {"admin", "marco", "sara", "lee", "scout-bot", "builder-bot",
                               "critic-bot", "echo-bot"}

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
    office = Path(__file__).resolve().parents[1] / "bot" / "example_office.yml"
    tokens_file = tmp_path / "tokens.json"
    args = parser.parse_args(["forge", "--seed", str(office), "--port", "0",
                              "--tokens", str(tokens_file)])
    assert args.func is run_forge
    stop = asyncio.Event()
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        task = asyncio.create_task(run_forge(args, stop, seeder=seed_office_file))
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
