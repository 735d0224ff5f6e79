"""A private repository of the office on `vaultmail up --forge gitea`: an org member reaches it
only through a team that has it (Gitea's GetUserRepoPermission), and the app shows its items to
no one the forge would not show them to (seed comments-and-inbox: "reading never shares")."""

from __future__ import annotations

from typing import Any

import aiohttp

from bot.app.embedded import Embedded
from tests.support import ToolClient, gitea_api

SECRET = "acme/secret"
WORDS = "Launch codename Bluebird"  # a title nobody outside acme/secret may read
LEE = "human:lee@acme.com"


async def _refused(client: ToolClient, tool: str, **args: Any) -> dict[str, Any]:
    status, body = await client.raw(tool, args)
    assert status == 404, (tool, status, body)
    return dict(body["error"])


async def _unread(tools: ToolClient) -> str:
    inbox = await tools("list_inbox")
    return str(inbox["you"])


async def test_an_org_member_in_no_team_with_a_private_repository_sees_none_of_its_items(
        office: Embedded) -> None:
    """lee is an org member (with write on the vaults), in no team that has acme/secret: the
    forge hides it from him, and so does the app, as for an item that does not exist. A team
    with read on it, as a Gitea org owner gives, shows him its item and a question to him
    there; taken out of the team, he sees neither."""
    office.forge.add_repo("acme", "secret")
    office.forge.set_permission(SECRET, "marco", "admin")
    async with aiohttp.ClientSession() as session:
        marco = gitea_api(session, office, "marco")
        label = await marco("POST", f"/repos/{SECRET}/labels",
                            {"name": "outcome", "color": "#00aabb"}, 201)
        issue = await marco("POST", f"/repos/{SECRET}/issues",
                            {"title": f"{WORDS}: pricing", "body": "x",
                             "labels": [label["id"]]}, 201)
        await office.settle()
        ref = f"{SECRET}#{issue['number']}"
        lee = gitea_api(session, office, "lee")
        await lee("GET", f"/repos/{SECRET}", expect=404)
        tools = ToolClient(session, office, LEE)
        err = await _refused(tools, "get_outcome", outcome=ref)
        nobody = await _refused(tools, "get_outcome", outcome=f"{SECRET}#999")
        assert err["code"] == nobody["code"] == "not_found" and WORDS not in str(err)

        office.forge.add_team("acme", "launch", ["lee"])
        office.forge.set_team_permission("acme", "launch", SECRET, "read")
        office.services.visibility.forget()
        await lee("GET", f"/repos/{SECRET}")
        seen = await tools("get_outcome", outcome=ref)
        assert seen["outcome"]["title"] == f"{WORDS}: pricing"
        await marco("POST", f"/repos/{SECRET}/issues/{issue['number']}/comments",
                    {"body": f"@lee {WORDS}: 12 or 15 euros?"}, 201)
        await office.settle()
        assert WORDS in await _unread(tools)

        office.forge.remove_team_member("acme", "launch", "lee")
        office.services.visibility.forget()
        await lee("GET", f"/repos/{SECRET}", expect=404)
        err = await _refused(tools, "get_outcome", outcome=ref)
        assert err["code"] == "not_found" and WORDS not in str(err)
        assert WORDS not in await _unread(tools)
