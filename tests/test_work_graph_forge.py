"""Issue 25, the local forge: GitHub's issue types and sub-issues, with their webhooks, as
GitHub's REST and webhooks descriptions shape them (the sub-issues and issue-types operations
of @octokit/openapi-types 29, in tests/conformance/octokit)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
from githubkit import GitHub, TokenAuthStrategy, webhooks
from githubkit.cache import MemCacheStrategy

from localforge import LocalForge
from localforge.tests import conftest as forge_fixtures
from localforge.tests.conftest import SECRET, Hooks, Keys, World

hooks = forge_fixtures.hooks
keys = forge_fixtures.keys
ISSUES = "/repos/acme/vault/issues"


@pytest.fixture
async def world(hooks: Hooks, keys: Keys) -> AsyncIterator[World]:
    """localforge's test world, with the App subscribed to `sub_issues` as well."""
    forge = LocalForge()
    await forge.start("127.0.0.1", 0)
    async with aiohttp.ClientSession() as session:
        tokens = {"admin": forge.add_user("admin")}
        forge.add_org("acme", owner="admin")
        for login in ("marco", "rita"):
            tokens[login] = forge.add_user(login, email=f"{login}@acme.com")
            forge.add_org_member("acme", login)
        tokens["olga"] = forge.add_user("olga")
        forge.add_repo("acme", "vault")
        forge.add_repo("acme", "goals")
        forge.add_repo("olga", "own")
        for repo in ("acme/vault", "acme/goals"):
            forge.set_permission(repo, "marco", "write")
            forge.set_permission(repo, "rita", "read")
        forge.set_permission("olga/own", "olga", "admin")
        app_id = forge.register_app(
            slug="vaultmail", name="vaultmail", public_key_pem=keys.public_pem,
            webhook_url=hooks.url, webhook_secret=SECRET,
            events=["issues", "issue_comment", "sub_issues"],
            permissions={"issues": "write", "metadata": "read"})
        inst = forge.install_app(app_id, "acme")
        await forge.webhooks_idle()
        hooks.clear()
        yield World(forge, hooks, keys, tokens, app_id, inst, session)
    await forge.stop()


async def new_issue(world: World, title: str, repo: str = "acme/vault",
                    **extra: Any) -> dict[str, Any]:
    status, _, body = await world.call("POST", f"/repos/{repo}/issues", "marco",
                                       {"title": title, **extra})
    assert status == 201, body
    return dict(body)


def parsed_by_githubkit(world: World) -> None:
    """Every delivery so far parses as githubkit's (unmodified) webhook models have it."""
    for r in world.hooks.received:
        if r.event in ("issues", "sub_issues"):
            webhooks.parse(r.event, r.body)


async def types(world: World, *names: str) -> None:
    for name in names:
        status, _, body = await world.call("POST", "/orgs/acme/issue-types", "admin",
                                           {"name": name, "is_enabled": True})
        assert status == 200, body


# -- issue types ---------------------------------------------------------------------------
async def test_org_owners_create_issue_types_members_list_them(world: World) -> None:
    status, _, made = await world.call("POST", "/orgs/acme/issue-types", "admin", {
        "name": "Plan", "is_enabled": True, "description": "How we get there",
        "color": "blue"})
    assert status == 200
    assert {k: made[k] for k in ("name", "description", "color", "is_enabled")} == {
        "name": "Plan", "description": "How we get there", "color": "blue", "is_enabled": True}
    assert isinstance(made["id"], int) and made["node_id"] and made["created_at"]
    status, _, listed = await world.call("GET", "/orgs/acme/issue-types", "rita")
    assert status == 200 and [t["name"] for t in listed] == ["Plan"]
    # a member who is no owner may not; the same name again is taken; an outsider sees nothing
    status, _, _ = await world.call("POST", "/orgs/acme/issue-types", "marco",
                                    {"name": "Goal", "is_enabled": True})
    assert status == 403
    status, _, _ = await world.call("POST", "/orgs/acme/issue-types", "admin",
                                    {"name": "plan", "is_enabled": True})
    assert status == 422
    status, _, _ = await world.call("POST", "/orgs/acme/issue-types", "admin",
                                    {"name": "Goal", "is_enabled": True, "color": "teal"})
    assert status == 422
    status, _, _ = await world.call("GET", "/orgs/acme/issue-types", "olga")
    assert status == 404
    token = await world.installation_token()  # the App's installation reads its org's types
    status, _, listed = await world.call("GET", "/orgs/acme/issue-types", token)
    assert status == 200 and len(listed) == 1


async def test_an_issue_takes_a_type_by_name_with_typed_and_untyped_webhooks(
        world: World) -> None:
    await types(world, "Goal", "Plan")
    issue = await new_issue(world, "Ship it", type="Plan")
    assert issue["type"]["name"] == "Plan"
    n = issue["number"]
    status, _, got = await world.call("GET", f"{ISSUES}/{n}", "rita")
    assert got["type"]["name"] == "Plan"
    status, _, got = await world.call("PATCH", f"{ISSUES}/{n}", "marco", {"type": "goal"})
    assert status == 200 and got["type"]["name"] == "Goal"
    status, _, got = await world.call("PATCH", f"{ISSUES}/{n}", "marco", {"type": None})
    assert status == 200 and got["type"] is None
    status, _, _ = await world.call("PATCH", f"{ISSUES}/{n}", "marco", {"type": "Epic"})
    assert status == 422
    await world.idle()
    typed = [(r.action, r.payload.get("type", {}).get("name"),
              (r.payload["issue"].get("type") or {}).get("name"))
             for r in world.hooks.received if r.event == "issues"
             and r.action in ("typed", "untyped")]
    assert typed == [("typed", "Plan", "Plan"), ("typed", "Goal", "Goal"),
                     ("untyped", "Goal", None)]
    parsed_by_githubkit(world)
    # someone without push access opens an issue: the type is silently dropped
    status, _, by_rita = await world.call("POST", ISSUES, "rita", {"title": "x", "type": "Plan"})
    assert status == 201 and by_rita["type"] is None
    # list filters: by a type's name, any type, none
    await new_issue(world, "Another plan", type="Plan")
    for query, want in (("Plan", ["Another plan"]), ("*", ["Another plan"]),
                        ("none", ["Ship it", "x"])):
        status, _, found = await world.call("GET", f"{ISSUES}?type={query}", "marco")
        assert sorted(i["title"] for i in found) == want, query


async def test_a_repository_of_a_user_has_no_issue_types(world: World) -> None:
    status, _, body = await world.call("POST", "/repos/olga/own/issues", "olga",
                                       {"title": "x", "type": "Plan"})
    assert status == 422 and body["errors"][0]["field"] == "type"


# -- sub-issues ----------------------------------------------------------------------------
async def test_sub_issues_add_list_parent_remove_and_their_webhooks(world: World) -> None:
    goal = await new_issue(world, "Goal", repo="acme/goals")
    plan = await new_issue(world, "Plan")
    await world.idle()
    world.hooks.clear()
    parent_path = f"/repos/acme/goals/issues/{goal['number']}"
    status, headers, body = await world.call("POST", f"{parent_path}/sub_issues", "marco",
                                             {"sub_issue_id": plan["id"]})
    assert status == 201 and body["number"] == goal["number"], "the answer is the parent"
    assert body["sub_issues_summary"] == {"total": 1, "completed": 0, "percent_completed": 0}
    assert headers["Location"].endswith("/sub_issues")
    status, _, listed = await world.call("GET", f"{parent_path}/sub_issues", "rita")
    assert status == 200 and [i["id"] for i in listed] == [plan["id"]]
    status, _, parent = await world.call("GET", f"{ISSUES}/{plan['number']}/parent", "rita")
    assert status == 200 and parent["id"] == goal["id"]
    status, _, got = await world.call("GET", f"{ISSUES}/{plan['number']}", "rita")
    assert got["parent_issue_url"] == f"{world.url}{parent_path}"
    await world.idle()
    sent = [(r.action, r.payload["repository"]["full_name"]) for r in world.hooks.received
            if r.event == "sub_issues"]
    assert sent == [("sub_issue_added", "acme/goals"), ("parent_issue_added", "acme/vault")]
    added = next(r.payload for r in world.hooks.received if r.action == "sub_issue_added")
    assert added["parent_issue_id"] == goal["id"] and added["sub_issue_id"] == plan["id"]
    assert added["sub_issue"]["parent_issue_url"] == f"{world.url}{parent_path}"
    assert added["sub_issue_repo"]["full_name"] == "acme/vault"
    assert added["installation"]["id"] == world.installation_id
    back = next(r.payload for r in world.hooks.received if r.action == "parent_issue_added")
    assert back["parent_issue_repo"]["full_name"] == "acme/goals"
    parsed_by_githubkit(world)
    # webhook `issue` objects carry no parent_issue_url (GitHub's webhooks description)
    world.hooks.clear()
    await world.call("PATCH", f"{ISSUES}/{plan['number']}", "marco", {"title": "Plan 2"})
    await world.idle()
    [edited] = [r.payload for r in world.hooks.received if r.event == "issues"]
    assert "parent_issue_url" not in edited["issue"]

    world.hooks.clear()
    status, _, body = await world.call("DELETE", f"{parent_path}/sub_issue", "marco",
                                       {"sub_issue_id": plan["id"]})
    assert status == 200 and body["sub_issues_summary"]["total"] == 0
    status, _, _ = await world.call("GET", f"{ISSUES}/{plan['number']}/parent", "rita")
    assert status == 404
    status, _, got = await world.call("GET", f"{ISSUES}/{plan['number']}", "rita")
    assert got["parent_issue_url"] is None
    await world.idle()
    assert [r.action for r in world.hooks.received if r.event == "sub_issues"] == [
        "sub_issue_removed", "parent_issue_removed"]
    parsed_by_githubkit(world)


async def test_one_parent_unless_replaced_no_loops_and_githubs_limits(world: World) -> None:
    a, b, c = [await new_issue(world, t) for t in ("A", "B", "C")]
    add = lambda parent, sub, **extra: world.call(  # noqa: E731
        "POST", f"{ISSUES}/{parent['number']}/sub_issues", "marco",
        {"sub_issue_id": sub["id"], **extra})
    assert (await add(a, c))[0] == 201
    status, _, body = await add(b, c)
    assert status == 422 and "one parent" in body["errors"][0]["message"]
    assert (await add(b, c, replace_parent=True))[0] == 201
    status, _, subs = await world.call("GET", f"{ISSUES}/{a['number']}/sub_issues", "marco")
    assert subs == []
    assert (await add(c, b))[0] == 422, "B is C's parent: C cannot hold B"
    assert (await add(c, c))[0] == 422
    status, _, _ = await world.call("POST", f"{ISSUES}/{a['number']}/sub_issues", "rita",
                                    {"sub_issue_id": b["id"]})
    assert status == 403, "a reader changes no sub-issues"
    # 8 levels at most: A > B > C and a chain of 5 more is 8; one more is refused
    chain = [b, c]
    for i in range(5):
        nxt = await new_issue(world, f"L{i}")
        assert (await add(chain[-1], nxt))[0] == 201
        chain.append(nxt)
    assert (await add(a, b))[0] == 201  # A is the 1st level, the last of the chain the 8th
    status, _, body = await add(chain[-1], await new_issue(world, "too deep"))
    assert status == 422 and "8 levels" in body["errors"][0]["message"]
    # another owner's issue is no sub-issue of acme's
    status, _, theirs = await world.call("POST", "/repos/olga/own/issues", "olga",
                                         {"title": "theirs"})
    status, _, body = await add(a, theirs)
    assert status == 422 and "same repository owner" in body["errors"][0]["message"]


async def test_a_parent_holds_100_sub_issues_at_most(world: World) -> None:
    world.forge.limits.update({"secondary_per_minute": 1000})  # 100 issues in a second
    parent = await new_issue(world, "P")
    for i in range(100):
        sub = await new_issue(world, f"s{i}")
        status, _, _ = await world.call("POST", f"{ISSUES}/{parent['number']}/sub_issues",
                                        "marco", {"sub_issue_id": sub["id"]})
        assert status == 201
    extra = await new_issue(world, "one too many")
    status, _, body = await world.call("POST", f"{ISSUES}/{parent['number']}/sub_issues",
                                       "marco", {"sub_issue_id": extra["id"]})
    assert status == 422 and "100" in body["errors"][0]["message"]
    status, headers, page = await world.call(
        "GET", f"{ISSUES}/{parent['number']}/sub_issues?per_page=30", "marco")
    assert len(page) == 30 and 'rel="next"' in headers["Link"]


async def test_reprioritising_moves_a_sub_issue_before_or_after_another(world: World) -> None:
    parent = await new_issue(world, "P")
    subs = [await new_issue(world, t) for t in ("a", "b", "c")]
    for s in subs:
        await world.call("POST", f"{ISSUES}/{parent['number']}/sub_issues", "marco",
                         {"sub_issue_id": s["id"]})
    path = f"{ISSUES}/{parent['number']}/sub_issues"

    async def order() -> list[str]:
        return [i["title"] for i in (await world.call("GET", path, "marco"))[2]]

    status, _, _ = await world.call("PATCH", f"{path}/priority", "marco",
                                    {"sub_issue_id": subs[2]["id"], "before_id": subs[0]["id"]})
    assert status == 200 and await order() == ["c", "a", "b"]
    await world.call("PATCH", f"{path}/priority", "marco",
                     {"sub_issue_id": subs[2]["id"], "after_id": subs[1]["id"]})
    assert await order() == ["a", "b", "c"]
    status, _, _ = await world.call("PATCH", f"{path}/priority", "marco",
                                    {"sub_issue_id": subs[2]["id"]})
    assert status == 422


# -- an unmodified githubkit parses every answer -------------------------------------------
@pytest.mark.parametrize("version", ["2026-03-10", "2022-11-28"])
async def test_githubkit_drives_issue_types_and_sub_issues(world: World, version: str) -> None:
    clients = {login: GitHub(TokenAuthStrategy(world.tokens[login]), base_url=world.url,
                             cache_strategy=MemCacheStrategy()) for login in ("admin", "marco")}
    admin, marco = clients["admin"].rest(version), clients["marco"].rest(version)
    made = (await admin.orgs.async_create_issue_type(
        "acme", name="Outcome", is_enabled=True, color="blue")).parsed_data
    assert made.name == "Outcome"
    listed = (await marco.orgs.async_list_issue_types("acme")).parsed_data
    assert [t.name for t in listed] == ["Outcome"]
    parent = (await marco.issues.async_create("acme", "vault", title="O",
                                              type="Outcome")).parsed_data
    assert parent.type is not None and parent.type.name == "Outcome"
    subs = [(await marco.issues.async_create("acme", "vault", title=t)).parsed_data
            for t in ("a", "b")]
    for s in subs:
        got = (await marco.issues.async_add_sub_issue("acme", "vault", parent.number,
                                                      sub_issue_id=s.id)).parsed_data
        assert got.number == parent.number
    assert got.sub_issues_summary is not None and got.sub_issues_summary.total == 2
    moved = (await marco.issues.async_reprioritize_sub_issue(
        "acme", "vault", parent.number, sub_issue_id=subs[1].id,
        before_id=subs[0].id)).parsed_data
    assert moved.id == parent.id
    listed_subs = (await marco.issues.async_list_sub_issues("acme", "vault",
                                                            parent.number)).parsed_data
    assert [i.title for i in listed_subs] == ["b", "a"]
    up = (await marco.issues.async_get_parent("acme", "vault", subs[0].number)).parsed_data
    assert up.id == parent.id
    sub = (await marco.issues.async_get("acme", "vault", subs[0].number)).parsed_data
    assert sub.parent_issue_url is not None and sub.parent_issue_url.endswith(
        f"/issues/{parent.number}")
    left = (await marco.issues.async_remove_sub_issue("acme", "vault", parent.number,
                                                      sub_issue_id=subs[0].id)).parsed_data
    assert left.sub_issues_summary is not None and left.sub_issues_summary.total == 1
    typed = (await marco.issues.async_update("acme", "vault", parent.number,
                                             type=None)).parsed_data
    assert typed.type is None
