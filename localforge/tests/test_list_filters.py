"""Every list filter of the operations the forge serves is applied, or refused with GitHub's own
error; none is ignored. Also the contents media types and search's shape (what Octokit found)."""

from __future__ import annotations

from typing import Any

from .conftest import World

ISSUES = "/repos/acme/vault/issues"


async def _numbers(world: World, query: str, who: str = "marco") -> list[int]:
    status, _, body = await world.call("GET", f"{ISSUES}?state=all&{query}", who)
    assert status == 200, body
    return sorted(i["number"] for i in body)


async def _seed(world: World) -> None:
    for title, body in (("one", "cc @rita please"), ("two", "nothing"), ("three", "@ritaz no")):
        status, _, _ = await world.call("POST", ISSUES, "marco", {"title": title, "body": body})
        assert status == 201
    await world.call("POST", f"{ISSUES}/2/comments", "tina", {"body": "over to @Rita"})


async def test_mentioned_is_the_body_or_a_comment(world: World) -> None:
    await _seed(world)
    assert await _numbers(world, "mentioned=rita") == [1, 2]
    assert await _numbers(world, "mentioned=olga") == []


async def test_milestone_type_and_issue_fields_as_github_applies_them(world: World) -> None:
    await _seed(world)
    assert await _numbers(world, "milestone=none") == [1, 2, 3]
    assert await _numbers(world, "milestone=*") == []
    status, _, body = await world.call("GET", f"{ISSUES}?milestone=7", "marco")
    assert status == 422
    assert body["errors"] == [{"value": "7", "resource": "Issue", "field": "milestone",
                               "code": "invalid"}]
    assert await _numbers(world, "type=none") == [1, 2, 3]
    assert await _numbers(world, "type=*") == []
    assert await _numbers(world, "type=Bug") == []
    status, _, body = await world.call("GET", f"{ISSUES}?issue_field_values=priority:Urgent",
                                       "marco")
    assert status == 422 and body["errors"][0]["field"] == "issue_field_values"


async def test_contents_raw_media_type_is_the_files_text(world: World) -> None:
    world.forge.put_file("acme/vault", "docs/a.md", "# Hello\n")
    url = "/repos/acme/vault/contents/docs/a.md"
    for accept in ("application/vnd.github.raw+json", "application/vnd.github.raw",
                   "application/vnd.github.v3.raw"):
        async with world.session.get(world.url + url, headers={
                "Authorization": f"token {world.tokens['marco']}", "Accept": accept}) as resp:
            assert resp.status == 200 and resp.content_type == "text/plain"
            assert await resp.text() == "# Hello\n"
    status, _, body = await world.call("GET", url, "marco")
    assert status == 200 and body["encoding"] == "base64"
    status, _, tree = await world.call("GET", "/repos/acme/vault/contents/docs", "marco",
                                       headers={"Accept": "application/vnd.github.object+json"})
    assert status == 200 and tree["type"] == "dir"
    assert [e["name"] for e in tree["entries"]] == ["a.md"]
    status, _, body = await world.call("GET", f"{url}?ref=main", "marco")
    assert status == 200
    status, _, body = await world.call("GET", f"{url}?ref=feature", "marco")
    assert status == 404 and body["message"] == "No commit found for the ref feature"


async def test_search_puts_items_first_and_applies_its_qualifiers(world: World) -> None:
    await _seed(world)
    status, _, body = await world.call("GET", "/search/issues?q=repo:acme/vault+mentions:rita",
                                       "marco")
    assert status == 200
    keys = [k for k in body if k not in ("total_count", "incomplete_results")]
    assert keys[0] == "items"  # Octokit's paginate takes the first such key as the list
    assert sorted(i["number"] for i in body["items"]) == [1, 2]  # body or comments
    _, _, body = await world.call("GET", "/search/issues?q=repo:acme/vault+commenter:tina",
                                  "marco")
    assert [i["number"] for i in body["items"]] == [2]
    _, _, body = await world.call("GET", "/search/issues?q=repo:acme/vault+rita+in:comments",
                                  "marco")
    assert [i["number"] for i in body["items"]] == [2]
    _, _, body = await world.call("GET", "/search/issues?q=repo:acme/vault&sort=comments"
                                  "&order=desc", "marco")
    assert [i["number"] for i in body["items"]][0] == 2
    status, _, _ = await world.call("GET", "/search/issues?q=x&sort=stars", "marco")
    assert status == 422
    _, _, body = await world.call("GET", "/search/issues?q=repo:acme/vault&search_type=semantic",
                                  "marco")
    assert body["search_type"] == "lexical"
    assert body["lexical_fallback_reason"] == ["service_unavailable"]


async def test_the_other_list_filters(world: World) -> None:
    async def get(path: str, who: str = "admin") -> tuple[int, Any]:
        status, _, body = await world.call("GET", path, who)
        return status, body

    forge = world.forge
    forge.add_team("acme", "pricing", ["marco"])
    assert (await get("/orgs/acme/repos?type=forks"))[1] == []
    assert [r["name"] for r in (await get("/orgs/acme/repos?type=sources"))[1]] == ["vault"]
    assert [r["name"] for r in (await get("/orgs/acme/repos?type=member", "marco"))[1]] == [
        "vault"]
    assert (await get("/orgs/acme/repos?type=member", "rita"))[1] == []
    assert (await get("/orgs/acme/repos?type=bogus"))[0] == 422
    assert (await get("/orgs/acme/repos?sort=stars"))[0] == 422
    assert (await get("/orgs/acme/members?filter=2fa_disabled"))[1] == []
    assert (await get("/orgs/acme/members?filter=bogus"))[0] == 422
    assert [m["login"] for m in (await get("/orgs/acme/teams/pricing/members?role=member"))[1]
            ] == ["marco"]
    assert (await get("/orgs/acme/teams/pricing/members?role=maintainer"))[1] == []
    assert (await get("/orgs/acme/teams/pricing/members?role=boss"))[0] == 422
    await world.call("POST", ISSUES, "marco", {"title": "t", "labels": ["x"]})
    await world.call("POST", f"{ISSUES}/1/comments", "marco", {"body": "c"})
    await world.call("POST", f"{ISSUES}/1/reactions", "marco", {"content": "heart"})
    events = [e["event"] for e in (await get(f"{ISSUES}/1/timeline"))[1]]
    assert "labeled" in events and "commented" in events
    events = [e["event"] for e in (await get(f"{ISSUES}/1/timeline?exclude=labeled"))[1]]
    assert "labeled" not in events and "commented" in events
    assert len((await get(f"{ISSUES}/1/reactions?content=heart"))[1]) == 1
    assert (await get(f"{ISSUES}/1/reactions?content=%2B1"))[1] == []
    assert (await get(f"{ISSUES}/1/reactions?content=love"))[0] == 422
    jwt = f"Bearer {world.jwt()}"
    status, _, body = await world.call("GET", "/app/installations?since=2000-01-01T00:00:00Z",
                                       auth=jwt)
    assert status == 200 and len(body) == 1
    _, _, body = await world.call("GET", "/app/installations?since=2999-01-01T00:00:00Z",
                                  auth=jwt)
    assert body == []
    _, _, body = await world.call("GET", "/app/installations?outdated=true", auth=jwt)
    assert body == []
    status, _, _ = await world.call("GET", "/app/installations?outdated=maybe", auth=jwt)
    assert status == 422
