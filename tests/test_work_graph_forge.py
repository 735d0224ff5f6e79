"""Issue 25, the local forge: GitHub's issue types, sub-issues and dependencies, with their
webhooks, as
GitHub's REST and webhooks descriptions shape them (the sub-issues, dependencies and
issue-types operations of @octokit/openapi-types 29, in tests/conformance/octokit)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from githubkit import GitHub, TokenAuthStrategy, webhooks
from githubkit.cache import MemCacheStrategy

from localforge import LocalForge
from localforge.tests import conftest as forge_fixtures
from localforge.tests import test_persist_rows
from localforge.tests.conftest import SECRET, Hooks, Keys, World
from tests.conformance import validator

hooks = forge_fixtures.hooks
keys = forge_fixtures.keys
persisted = test_persist_rows.persisted  # a forge that keeps its state in a data_dir
on_file = test_persist_rows._on_file
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
            events=["issues", "issue_comment", "sub_issues", "issue_dependencies"],
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
        if r.event in ("issues", "sub_issues", "issue_dependencies"):
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


# -- dependencies ----------------------------------------------------------------------------
async def test_dependencies_add_list_both_sides_remove_and_their_webhooks(world: World) -> None:
    blocked = await new_issue(world, "Blocked")
    blocker = await new_issue(world, "Blocker", repo="acme/goals")
    await world.idle()
    world.hooks.clear()
    deps = f"{ISSUES}/{blocked['number']}/dependencies"
    status, headers, body = await world.call("POST", f"{deps}/blocked_by", "marco",
                                             {"issue_id": blocker["id"]})
    assert status == 201 and body["id"] == blocker["id"], "the answer is the blocker"
    assert headers["Location"].endswith("/dependencies/blocked_by")
    status, _, listed = await world.call("GET", f"{deps}/blocked_by", "rita")
    assert status == 200 and [i["id"] for i in listed] == [blocker["id"]]
    status, _, listed = await world.call(
        "GET", f"/repos/acme/goals/issues/{blocker['number']}/dependencies/blocking", "rita")
    assert status == 200 and [i["id"] for i in listed] == [blocked["id"]]
    status, _, got = await world.call("GET", f"{ISSUES}/{blocked['number']}", "rita")
    assert got["issue_dependencies_summary"] == {"blocked_by": 1, "blocking": 0,
                                                 "total_blocked_by": 1, "total_blocking": 0}
    # a closed blocker blocks no more, but is still counted in the totals
    await world.call("PATCH", f"/repos/acme/goals/issues/{blocker['number']}", "marco",
                     {"state": "closed"})
    status, _, got = await world.call("GET", f"{ISSUES}/{blocked['number']}", "rita")
    assert got["issue_dependencies_summary"]["blocked_by"] == 0
    assert got["issue_dependencies_summary"]["total_blocked_by"] == 1
    await world.idle()
    sent = [(r.action, r.payload["repository"]["full_name"]) for r in world.hooks.received
            if r.event == "issue_dependencies"]
    assert sent == [("blocked_by_added", "acme/vault"), ("blocking_added", "acme/goals")]
    added = next(r.payload for r in world.hooks.received if r.action == "blocked_by_added")
    assert added["blocked_issue_id"] == blocked["id"]
    assert added["blocking_issue_id"] == blocker["id"]
    assert added["blocking_issue_repo"]["full_name"] == "acme/goals"
    assert added["installation"]["id"] == world.installation_id
    back = next(r.payload for r in world.hooks.received if r.action == "blocking_added")
    assert back["blocked_issue_repo"]["full_name"] == "acme/vault"
    parsed_by_githubkit(world)

    world.hooks.clear()
    status, _, body = await world.call("DELETE", f"{deps}/blocked_by/{blocker['id']}", "marco")
    assert status == 200 and body["id"] == blocker["id"]
    status, _, listed = await world.call("GET", f"{deps}/blocked_by", "rita")
    assert listed == []
    status, _, _ = await world.call("DELETE", f"{deps}/blocked_by/{blocker['id']}", "marco")
    assert status == 404, "no such dependency"
    await world.idle()
    assert [r.action for r in world.hooks.received if r.event == "issue_dependencies"] == [
        "blocked_by_removed", "blocking_removed"]
    parsed_by_githubkit(world)


async def test_dependencies_refuse_self_twice_readers_and_unseen_issues(world: World) -> None:
    a, b = await new_issue(world, "A"), await new_issue(world, "B")
    path = f"{ISSUES}/{a['number']}/dependencies/blocked_by"
    assert (await world.call("POST", path, "marco", {"issue_id": a["id"]}))[0] == 422
    assert (await world.call("POST", path, "marco", {"issue_id": "x"}))[0] == 422
    assert (await world.call("POST", path, "marco", {"issue_id": b["id"]}))[0] == 201
    status, _, body = await world.call("POST", path, "marco", {"issue_id": b["id"]})
    assert status == 422 and "already" in body["errors"][0]["message"]
    c = await new_issue(world, "C")
    assert (await world.call("POST", path, "rita", {"issue_id": c["id"]}))[0] == 403
    status, _, theirs = await world.call("POST", "/repos/olga/own/issues", "olga",
                                         {"title": "private"})
    assert (await world.call("POST", path, "marco", {"issue_id": theirs["id"]}))[0] == 404


async def test_an_issue_is_blocked_by_50_issues_at_most(world: World) -> None:
    world.forge.limits.update({"secondary_per_minute": 1000})
    blocked = await new_issue(world, "B")
    path = f"{ISSUES}/{blocked['number']}/dependencies/blocked_by"
    for i in range(50):
        other = await new_issue(world, f"b{i}")
        assert (await world.call("POST", path, "marco", {"issue_id": other["id"]}))[0] == 201
    extra = await new_issue(world, "one too many")
    status, _, body = await world.call("POST", path, "marco", {"issue_id": extra["id"]})
    assert status == 422 and "50" in body["errors"][0]["message"]


@pytest.mark.parametrize("version", ["2026-03-10", "2022-11-28"])
async def test_githubkit_drives_dependencies(world: World, version: str) -> None:
    client = GitHub(TokenAuthStrategy(world.tokens["marco"]), base_url=world.url,
                    cache_strategy=MemCacheStrategy())
    marco = client.rest(version)
    blocked, blocker = [(await marco.issues.async_create("acme", "vault", title=t)).parsed_data
                        for t in ("blocked", "blocker")]
    got = (await marco.issues.async_add_blocked_by_dependency(
        "acme", "vault", blocked.number, issue_id=blocker.id)).parsed_data
    assert got.id == blocker.id
    by = (await marco.issues.async_list_dependencies_blocked_by(
        "acme", "vault", blocked.number)).parsed_data
    assert [i.id for i in by] == [blocker.id]
    blocking = (await marco.issues.async_list_dependencies_blocking(
        "acme", "vault", blocker.number)).parsed_data
    assert [i.id for i in blocking] == [blocked.id]
    read = (await marco.issues.async_get("acme", "vault", blocked.number)).parsed_data
    assert read.issue_dependencies_summary is not None
    assert read.issue_dependencies_summary.blocked_by == 1
    gone = (await marco.issues.async_remove_dependency_blocked_by(
        "acme", "vault", blocked.number, blocker.id)).parsed_data
    assert gone.id == blocker.id
    assert (await marco.issues.async_list_dependencies_blocked_by(
        "acme", "vault", blocked.number)).parsed_data == []


async def _timeline(world: World, repo: str, number: int) -> list[tuple[str, str]]:
    status, _, got = await world.call("GET", f"/repos/{repo}/issues/{number}/timeline", "rita")
    assert status == 200, got
    return [(e["event"], e["actor"]["login"]) for e in got]


@pytest.mark.parametrize("version", ["2026-03-10", "2022-11-28"])
async def test_dependencies_and_sub_issues_show_on_both_timelines(world: World,
                                                                  version: str) -> None:
    """What GitHub's timeline shows of them: `blocked_by_added` / `_removed` on the blocked
    issue, `blocking_added` / `_removed` on its blocker, `sub_issue_added` / `_removed` on the
    parent and `parent_issue_added` / `_removed` on the sub-issue, each by who did it; and an
    unmodified githubkit reads such a timeline."""
    blocked = await new_issue(world, "Blocked")
    blocker = await new_issue(world, "Blocker", repo="acme/goals")
    deps = f"{ISSUES}/{blocked['number']}/dependencies/blocked_by"
    assert (await world.call("POST", deps, "marco", {"issue_id": blocker["id"]}))[0] == 201
    assert (await world.call("DELETE", f"{deps}/{blocker['id']}", "marco"))[0] == 200
    subs = f"{ISSUES}/{blocked['number']}/sub_issues"
    sub = await new_issue(world, "Part")
    assert (await world.call("POST", subs, "marco", {"sub_issue_id": sub["id"]}))[0] == 201
    assert (await world.call("DELETE", f"{ISSUES}/{blocked['number']}/sub_issue", "marco",
                             {"sub_issue_id": sub["id"]}))[0] == 200
    assert await _timeline(world, "acme/vault", blocked["number"]) == [
        ("blocked_by_added", "marco"), ("blocked_by_removed", "marco"),
        ("sub_issue_added", "marco"), ("sub_issue_removed", "marco")]
    assert await _timeline(world, "acme/goals", blocker["number"]) == [
        ("blocking_added", "marco"), ("blocking_removed", "marco")]
    assert await _timeline(world, "acme/vault", sub["number"]) == [
        ("parent_issue_added", "marco"), ("parent_issue_removed", "marco")]
    status, _, raw = await world.call("GET", f"{ISSUES}/{blocked['number']}/timeline", "rita")
    assert [(e["event"], (e.get("blocked_by") or e.get("sub_issue") or {}).get("number"))
            for e in raw] == [("blocked_by_added", blocker["number"]),
                              ("blocked_by_removed", blocker["number"]),
                              ("sub_issue_added", sub["number"]),
                              ("sub_issue_removed", sub["number"])]
    assert raw[0]["blocked_by"]["repository"]["full_name"] == "acme/goals"
    status, _, other = await world.call(
        "GET", f"/repos/acme/goals/issues/{blocker['number']}/timeline", "rita")
    status, _, part = await world.call("GET", f"{ISSUES}/{sub['number']}/timeline", "rita")
    assert other[0]["blocking"]["number"] == part[0]["parent_issue"]["number"] == \
        blocked["number"]
    problems = [p for e in raw + other + part for p in validator.check_component(
        e["event"].replace("_", "-") + "-issue-event", e, "rest:issues/list-events-for-timeline")]
    assert not problems, "\n".join(problems)
    status, _, shown = await world.call(
        "GET", f"{ISSUES}/{blocked['number']}/timeline?exclude=sub_issue_added", "rita")
    assert "sub_issue_added" not in [e["event"] for e in shown]

    # a blocker in a repository the reader cannot see stays unnamed on the timeline
    world.forge.set_permission("olga/own", "marco", "write")  # rita does not see olga's repo
    hidden = await new_issue(world, "Hidden", repo="olga/own")
    assert (await world.call("POST", deps, "marco", {"issue_id": hidden["id"]}))[0] == 201
    status, _, seen = await world.call("GET", f"{ISSUES}/{blocked['number']}/timeline", "rita")
    assert seen[-1]["event"] == "blocked_by_added" and seen[-1]["blocked_by"] is None
    status, _, seen = await world.call("GET", f"{ISSUES}/{blocked['number']}/timeline", "marco")
    assert seen[-1]["blocked_by"]["title"] == "Hidden"

    client = GitHub(TokenAuthStrategy(world.tokens["rita"]), base_url=world.url)
    read = (await client.rest(version).issues.async_list_events_for_timeline(
        "acme", "vault", blocked["number"])).parsed_data
    assert [getattr(e, "event", None) for e in read] == [
        "blocked_by_added", "blocked_by_removed", "sub_issue_added", "sub_issue_removed",
        "blocked_by_added"]


# -- issue fields (REST API 2026-03-10) ------------------------------------------------------
async def fields(world: World) -> dict[str, dict[str, Any]]:
    """A text field and a single-select one, made by the org's owner."""
    made = {}
    for body in ({"name": "Waiting on", "data_type": "text", "description": "Who"},
                 {"name": "Priority", "data_type": "single_select", "options": [
                     {"name": "High", "color": "red", "priority": 1},
                     {"name": "Low", "color": "green", "priority": 2}]}):
        status, _, got = await world.call("POST", "/orgs/acme/issue-fields", "admin", body)
        assert status == 200, got
        made[got["name"]] = got
    return made


async def test_org_owners_define_issue_fields_members_and_the_app_list_them(
        world: World) -> None:
    made = await fields(world)
    assert made["Waiting on"]["data_type"] == "text" and made["Waiting on"]["options"] is None
    assert [o["name"] for o in made["Priority"]["options"]] == ["High", "Low"]
    status, _, listed = await world.call("GET", "/orgs/acme/issue-fields", "rita")
    assert status == 200 and [f["name"] for f in listed] == ["Waiting on", "Priority"]
    token = await world.installation_token()
    status, _, listed = await world.call("GET", "/orgs/acme/issue-fields", token)
    assert status == 200 and len(listed) == 2
    # only an owner's own token defines them: a member, the App, a taken name, a bad type
    for who, body in (("marco", {"name": "Effort", "data_type": "number"}),
                      (token, {"name": "Effort", "data_type": "number"})):
        status, _, _ = await world.call("POST", "/orgs/acme/issue-fields", who, body)
        assert status == 403
    for body in ({"name": "waiting ON", "data_type": "text"}, {"name": "X", "data_type": "bool"},
                 {"name": "Y", "data_type": "single_select"}):
        status, _, _ = await world.call("POST", "/orgs/acme/issue-fields", "admin", body)
        assert status == 422, body
    status, _, _ = await world.call("GET", "/orgs/acme/issue-fields", "olga")
    assert status == 404
    fid = made["Priority"]["id"]
    status, _, got = await world.call("PATCH", f"/orgs/acme/issue-fields/{fid}", "admin",
                                      {"name": "Urgency"})
    assert status == 200 and got["name"] == "Urgency"
    status, _, _ = await world.call("DELETE", f"/orgs/acme/issue-fields/{fid}", "admin")
    assert status == 204
    status, _, listed = await world.call("GET", "/orgs/acme/issue-fields", "rita")
    assert [f["name"] for f in listed] == ["Waiting on"]


async def test_issue_field_values_set_read_clear_with_their_webhooks(world: World) -> None:
    made = await fields(world)
    text, select = made["Waiting on"]["id"], made["Priority"]["id"]
    issue = await new_issue(world, "Outcome")
    path = f"{ISSUES}/{issue['number']}/issue-field-values"
    await world.idle()
    world.hooks.clear()
    status, _, got = await world.call("POST", path, "marco", {"issue_field_values": [
        {"field_id": text, "value": "marco"}, {"field_id": select, "value": "High"}]})
    assert status == 200
    assert {v["issue_field_name"]: v["value"] for v in got} == {"Waiting on": "marco",
                                                               "Priority": "High"}
    status, _, read = await world.call("GET", f"{ISSUES}/{issue['number']}", "rita")
    by_id = {v["issue_field_id"]: v for v in read["issue_field_values"]}
    assert by_id[select]["single_select_option"]["name"] == "High"
    assert by_id[text]["value"] == "marco" and by_id[text]["data_type"] == "text"
    # an update, a value that does not fit, a reader, a field of no org
    await world.call("POST", path, "marco", {"issue_field_values": [
        {"field_id": text, "value": "marco, rita"}]})
    for body in ({"field_id": select, "value": "Medium"}, {"field_id": text, "value": 3},
                 {"field_id": 999999, "value": "x"}):
        status, _, _ = await world.call("POST", path, "marco", {"issue_field_values": [body]})
        assert status == 422, body
    status, _, _ = await world.call("POST", path, "rita", {"issue_field_values": [
        {"field_id": text, "value": "rita"}]})
    assert status == 403
    status, _, _ = await world.call("DELETE", f"{path}/{text}", "marco")
    assert status == 204
    status, _, _ = await world.call("DELETE", f"{path}/{text}", "marco")
    assert status == 404, "no value for it any more"
    status, _, left = await world.call("PUT", path, "marco", {"issue_field_values": []})
    assert status == 200 and left == []
    await world.idle()
    sent = [(r.action, r.payload["issue_field"]["name"],
             r.payload.get("issue_field_value", {}).get("value"),
             r.payload.get("changes", {}).get("issue_field_value", {}).get("from", {})
             .get("value"))
            for r in world.hooks.received if r.event == "issues"]
    assert sent == [("field_added", "Waiting on", "marco", None),
                    ("field_added", "Priority", None, None),
                    ("field_added", "Waiting on", "marco, rita", "marco"),
                    ("field_removed", "Waiting on", "marco, rita", None),
                    ("field_removed", "Priority", None, None)]
    chosen = next(r.payload for r in world.hooks.received if r.action == "field_added"
                  and r.payload["issue_field"]["name"] == "Priority")
    assert chosen["issue_field_value"]["option"]["name"] == "High"
    assert chosen["issue_field"]["field_type"] == "single_select"
    parsed_by_githubkit(world)


async def test_githubkit_drives_issue_fields(world: World) -> None:
    clients = {login: GitHub(TokenAuthStrategy(world.tokens[login]), base_url=world.url,
                             cache_strategy=MemCacheStrategy()) for login in ("admin", "marco")}
    admin, marco = clients["admin"].rest("2026-03-10"), clients["marco"].rest("2026-03-10")
    made = (await admin.orgs.async_create_issue_field(
        "acme", name="Waiting on", data_type="text")).parsed_data
    assert made is not None and made.name == "Waiting on"
    listed = (await marco.orgs.async_list_issue_fields("acme")).parsed_data
    assert [f.name for f in listed if f is not None] == ["Waiting on"]
    issue = (await marco.issues.async_create("acme", "vault", title="O")).parsed_data
    added = (await marco.issues.async_add_issue_field_values(
        "acme", "vault", issue.number,
        issue_field_values=[{"field_id": made.id, "value": "marco"}])).parsed_data
    assert [v.value for v in added] == ["marco"]
    got = (await marco.issues.async_get("acme", "vault", issue.number)).parsed_data
    assert got.issue_field_values and got.issue_field_values[0].issue_field_id == made.id
    replaced = (await marco.issues.async_set_issue_field_values(
        "acme", "vault", issue.number,
        issue_field_values=[{"field_id": made.id, "value": "rita"}])).parsed_data
    assert [v.value for v in replaced] == ["rita"]
    read = (await marco.issues.async_list_issue_field_values_for_issue(
        "acme", "vault", issue.number)).parsed_data
    assert [v.value for v in read] == ["rita"]
    await marco.issues.async_delete_issue_field_value("acme", "vault", issue.number, made.id)
    assert (await marco.issues.async_list_issue_field_values_for_issue(
        "acme", "vault", issue.number)).parsed_data == []


async def test_issue_field_values_on_create_update_and_the_list_filter(world: World) -> None:
    made = await fields(world)
    text, select = made["Waiting on"]["id"], made["Priority"]["id"]
    first = await new_issue(world, "First", issue_field_values=[
        {"field_id": select, "value": "High"}])
    assert [v["value"] for v in first["issue_field_values"]] == ["High"]
    status, _, by_rita = await world.call("POST", ISSUES, "rita", {
        "title": "x", "issue_field_values": [{"field_id": select, "value": "High"}]})
    assert status == 201 and by_rita["issue_field_values"] == [], "silently dropped"
    second = await new_issue(world, "Second")
    status, _, got = await world.call("PATCH", f"{ISSUES}/{second['number']}", "marco", {
        "issue_field_values": [{"field_id": text, "value": "marco"},
                               {"field_id": select, "value": "Low"}]})
    assert status == 200 and len(got["issue_field_values"]) == 2
    for query, want in (("priority:high", ["First"]), ("Priority:Low,Waiting on:marco",
                                                       ["Second"])):
        status, _, found = await world.call("GET", f"{ISSUES}?issue_field_values={query}",
                                            "marco")
        assert status == 200 and [i["title"] for i in found] == want, query
    status, _, _ = await world.call("GET", f"{ISSUES}?issue_field_values=effort:3", "marco")
    assert status == 422, "no such field"


async def test_issue_fields_and_values_are_persisted(tmp_path: Path,
                                                     persisted: World) -> None:
    world = persisted
    made = await fields(world)
    issue = await new_issue(world, "Outcome")
    path = f"{ISSUES}/{issue['number']}/issue-field-values"
    for value in ("marco", "rita"):  # a value set, then changed in place
        status, _, _ = await world.call("POST", path, "marco", {"issue_field_values": [
            {"field_id": made["Waiting on"]["id"], "value": value},
            {"field_id": made["Priority"]["id"], "value": "Low"}]})
        assert status == 200
    await world.call("PATCH", f"/orgs/acme/issue-fields/{made['Priority']['id']}", "admin",
                     {"options": [{"name": "Low", "color": "blue", "priority": 1,
                                   "id": made["Priority"]["options"][1]["id"]}]})
    await world.idle()
    world.forge.save()
    assert on_file(tmp_path).model_dump_json() == world.forge.state.model_dump_json()
    org = on_file(tmp_path).org("acme")
    assert org is not None and [f.name for f in org.issue_fields] == ["Waiting on", "Priority"]
