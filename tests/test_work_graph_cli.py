"""Issue 25: `vaultmail office setup-types` makes an organisation's issue types for the item
kinds, run as a shell command against the local forge with an owner's token."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path
from typing import Any

from bot.app.embedded import Embedded

ROOT = Path(__file__).resolve().parents[1]


async def setup_types(embedded: Embedded, login: str | None, cwd: Path,
                      *extra: str) -> tuple[int, str, str]:
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(cwd),
           "PYTHONPATH": str(ROOT)}
    if login is not None:
        env["GITHUB_TOKEN"] = embedded.forge_tokens[login]
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "bot.cli.main", "office", "setup-types", "--org", "acme",
        "--forge", embedded.forge.url, *extra, cwd=str(cwd), env=env,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(proc.communicate(), 120)
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


async def types_of(person: Any) -> list[str]:
    return [t["name"] for t in await person("admin").call("GET", "/orgs/acme/issue-types",
                                                          expect=200)]


async def test_setup_types_makes_the_four_types_once_with_an_owners_token(
        embedded: Embedded, person: Any, tools: Any, tmp_path: Path) -> None:
    await person("admin").call("POST", "/orgs/acme/issue-types",
                               {"name": "Plan", "is_enabled": True}, expect=200)
    code, out, err = await setup_types(embedded, "admin", tmp_path, "--json")
    assert code == 0, err
    rows = json.loads(out)["result"]["types"]
    assert [(r["type"], r["done"]) for r in rows] == [
        ("Goal", "created"), ("Outcome", "created"), ("Plan", "exists"),
        ("Evidence", "created")]
    assert sorted(await types_of(person)) == ["Evidence", "Goal", "Outcome", "Plan"]
    code, out, _ = await setup_types(embedded, "admin", tmp_path)  # again: nothing new
    assert code == 0 and out.count("exists") == 4
    # the types it made make items
    issue = await person("marco").open_issue("acme/scout-vault", "Faster sign-in", "x",
                                             type="Goal")
    await embedded.settle()
    got = await tools("agent:scout")("get_tree", goal=f"acme/scout-vault#{issue['number']}")
    assert got["goal"]["kind"] == "goal"


async def test_setup_types_needs_an_owner_and_a_token_and_takes_the_office_names(
        embedded: Embedded, person: Any, tmp_path: Path) -> None:
    code, _, err = await setup_types(embedded, None, tmp_path)
    assert code == 2 and "GITHUB_TOKEN" in err
    code, _, err = await setup_types(embedded, "marco", tmp_path)  # a member, no owner
    assert code == 1 and "owner of acme" in err
    assert await types_of(person) == []
    office = tmp_path / "vaultmail.yml"
    text = (ROOT / "bot" / "example_office.yml").read_text()
    office.write_text(text.replace("org: acme\n", "org: acme\nitem_types: {outcome: Epic}\n"))
    code, out, err = await setup_types(embedded, "admin", tmp_path, "--office", str(office))
    assert code == 0, err
    assert sorted(await types_of(person)) == ["Epic", "Evidence", "Goal", "Plan"]
