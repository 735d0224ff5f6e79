"""Persistence across restarts, seeding from an office config, and the CLI."""

from __future__ import annotations

from pathlib import Path

import aiohttp

from localforge import LocalForge


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
