"""REST API versions as GitHub serves them, and ETags that depend on the token as GitHub's do."""

from __future__ import annotations

from .conftest import World

ISSUES = "/repos/acme/vault/issues"
V2026 = {"X-GitHub-Api-Version": "2026-03-10"}


async def _issue(world: World) -> None:
    status, _, _ = await world.call("POST", ISSUES, "marco",
                                    {"title": "Budget", "labels": ["mail:new"],
                                     "assignees": ["marco"]})
    assert status == 201


async def test_without_the_header_2022_11_28_is_served(world: World) -> None:
    await _issue(world)
    status, headers, issue = await world.call("GET", f"{ISSUES}/1", "marco")
    assert status == 200 and headers["X-GitHub-Api-Version-Selected"] == "2022-11-28"
    assert issue["assignee"]["login"] == "marco"
    label = issue["labels"][0]
    assert label["archived_at"] is None and label["archived_by"] is None
    _, _, repo = await world.call("GET", "/repos/acme/vault", "marco")
    assert repo["has_downloads"] is True
    _, _, limits = await world.call("GET", "/rate_limit", "marco")
    assert limits["rate"] == limits["resources"]["core"]


async def test_2026_03_10_drops_what_it_dropped(world: World) -> None:
    await _issue(world)
    status, headers, issue = await world.call("GET", f"{ISSUES}/1", "marco", headers=V2026)
    assert status == 200 and headers["X-GitHub-Api-Version-Selected"] == "2026-03-10"
    assert "assignee" not in issue and [a["login"] for a in issue["assignees"]] == ["marco"]
    assert issue["labels"][0]["archived_at"] is None
    _, _, repo = await world.call("GET", "/repos/acme/vault", "marco", headers=V2026)
    assert "has_downloads" not in repo
    _, _, limits = await world.call("GET", "/rate_limit", "marco", headers=V2026)
    assert "rate" not in limits and limits["resources"]["core"]["limit"] == 5000
    # the singular `assignee` is no longer a parameter in 2026-03-10
    status, _, made = await world.call("POST", ISSUES, "marco",
                                       {"title": "x", "assignee": "marco"}, headers=V2026)
    assert status == 201 and made["assignees"] == []


async def test_a_version_github_does_not_serve_is_a_400(world: World) -> None:
    for bad in ("2021-01-01", "v3"):
        status, _, body = await world.call("GET", ISSUES, "marco",
                                           headers={"X-GitHub-Api-Version": bad})
        assert status == 400
        assert f'"{bad}", is not a supported version' in body["message"]
        assert '"2026-03-10" (most recent), "2022-11-28"' in body["message"]


async def test_webhooks_are_not_versioned(world: World) -> None:
    await world.call("POST", ISSUES, "marco", {"title": "v", "assignees": ["marco"]},
                     headers=V2026)
    await world.idle()
    opened = next(r for r in world.hooks.received if r.action == "opened")
    assert opened.payload["issue"]["assignee"]["login"] == "marco"


async def test_an_etag_holds_only_for_the_token_that_got_it(world: World) -> None:
    await _issue(world)
    first = world.tokens["marco"]
    second = world.forge.add_user("marco")  # a second token of the same user
    _, headers, _ = await world.call("GET", ISSUES, auth=f"token {first}")
    etag = headers["ETag"]
    assert etag.startswith('W/"') and len(etag) == 64 + 4
    status, _, _ = await world.call("GET", ISSUES, auth=f"token {first}",
                                    headers={"If-None-Match": etag})
    assert status == 304
    status, headers, _ = await world.call("GET", ISSUES, auth=f"token {second}",
                                          headers={"If-None-Match": etag})
    assert status == 200 and headers["ETag"] != etag
    # the Authorization header's very value counts, and so does Accept
    _, bearer, _ = await world.call("GET", ISSUES, auth=f"Bearer {first}")
    _, accept, _ = await world.call("GET", ISSUES, auth=f"token {first}",
                                    headers={"Accept": "application/vnd.github+json"})
    assert len({etag, bearer["ETag"], accept["ETag"]}) == 3


async def test_a_new_installation_token_after_the_hour_means_new_etags(world: World) -> None:
    await _issue(world)
    old = await world.installation_token()
    _, headers, _ = await world.call("GET", ISSUES, auth=f"token {old}")
    etag, remaining = headers["ETag"], int(headers["X-RateLimit-Remaining"])
    status, headers, _ = await world.call("GET", ISSUES, auth=f"token {old}",
                                          headers={"If-None-Match": etag})
    assert status == 304 and int(headers["X-RateLimit-Remaining"]) == remaining
    world.forge.clock.advance(3600)
    status, _, _ = await world.call("GET", ISSUES, auth=f"token {old}",
                                    headers={"If-None-Match": etag})
    assert status == 401  # expired
    new = await world.installation_token()
    _, _, limits = await world.call("GET", "/rate_limit", auth=f"token {new}")  # costs nothing
    before = limits["resources"]["core"]["remaining"]
    status, headers, _ = await world.call("GET", ISSUES, auth=f"token {new}",
                                          headers={"If-None-Match": etag})
    assert status == 200 and headers["ETag"] != etag  # a full read, and it costs one
    assert int(headers["X-RateLimit-Remaining"]) == before - 1
