"""Items on `vaultmail up --forge gitea`, end to end: people comment on the forge's Gitea API
with their tokens, and read what reached them through the app's tools."""

from __future__ import annotations

from importlib import resources
from pathlib import Path
from typing import Any

import aiohttp

from bot.app.embedded import start_embedded
from tests.support import gitea_api

VAULT = "/repos/acme/scout-vault"
PEOPLE = """humans:
  - {email: john.doe@acme.com, login: john.doe, permissions: [mail.send]}
  - {email: john@acme.com, login: john, permissions: [mail.send]}
"""


async def test_a_mention_of_a_login_with_a_dot_reaches_that_person_not_another(
        tmp_path: Path) -> None:
    """Gitea's logins may hold '.' and '_': `@john.doe` was read as a mention of `john`, so a
    comment for john.doe reached john (and john.doe not at all)."""
    text = resources.files("bot").joinpath("example_office.yml").read_text()
    path = tmp_path / "office.yml"
    path.write_text(text.replace("humans:\n", PEOPLE, 1))
    office = await start_embedded(office_path=path, data_dir=tmp_path / "data", port=0,
                                  forge_port=0, dialect="gitea")
    try:
        async with aiohttp.ClientSession() as session:
            call = gitea_api(session, office, "marco")

            async def unread(principal: str) -> list[Any]:
                headers = {"Authorization": f"Bearer {office.api_tokens[principal]}"}
                async with session.post(f"{office.app_url}/api/v1/tools/list_inbox",
                                        json={}, headers=headers) as resp:
                    got = await resp.json()
                    assert resp.status == 200, got
                    return list(got["you"]["unread"])

            label = await call("POST", f"{VAULT}/labels", {"name": "outcome",
                                                           "color": "#00aabb"}, 201)
            outcome = await call("POST", f"{VAULT}/issues", {
                "title": "Totals", "body": "x", "labels": [label["id"]]}, 201)
            await office.settle()
            await call("POST", f"{VAULT}/issues/{outcome['number']}/comments",
                       {"body": "@john.doe could you check the totals?"}, 201)
            await office.settle()
            assert [c["body"] for c in await unread("human:john.doe@acme.com")] == [
                "@john.doe could you check the totals?"]
            assert await unread("human:john@acme.com") == []
    finally:
        await office.stop()
