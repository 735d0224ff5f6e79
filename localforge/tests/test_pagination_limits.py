"""Pagination links, ETags and 304s, primary and secondary rate limits."""

from __future__ import annotations

import re

from .conftest import World

ISSUES = "/repos/acme/vault/issues"


def links(header: str) -> dict[str, str]:
    return {rel: url for url, rel in re.findall(r'<([^>]+)>; rel="(\w+)"', header)}


async def _many(world: World, n: int) -> None:
    for i in range(n):
        status, _, _ = await world.call("POST", ISSUES, "marco", {"title": f"issue {i}"})
        assert status == 201


async def test_link_header_pages_through_everything(world: World) -> None:
    await _many(world, 7)
    status, headers, page1 = await world.call("GET", f"{ISSUES}?per_page=3", "marco")
    assert status == 200 and len(page1) == 3
    rels = links(headers["Link"])
    assert set(rels) == {"next", "last"}
    assert "page=3" in rels["last"]
    seen = [i["number"] for i in page1]
    url = rels["next"]
    while url:
        status, headers, page = await world.call("GET", url, "marco")
        seen += [i["number"] for i in page]
        rels = links(headers.get("Link", ""))
        assert "first" in rels and "prev" in rels
        url = rels.get("next", "")
    assert seen == list(range(7, 0, -1))


async def test_per_page_is_capped_at_100_and_defaults_to_30(world: World) -> None:
    await _many(world, 31)
    _, headers, page = await world.call("GET", ISSUES, "marco")
    assert len(page) == 30 and "next" in links(headers["Link"])
    _, headers, page = await world.call("GET", f"{ISSUES}?per_page=500", "marco")
    assert len(page) == 31 and "Link" not in headers


async def test_repositories_id_form_of_the_path_works(world: World) -> None:
    await _many(world, 2)
    repo_id = world.forge.state.repo("acme", "vault").id  # type: ignore[union-attr]
    status, _, page = await world.call("GET", f"/repositories/{repo_id}/issues", "marco")
    assert status == 200 and len(page) == 2


async def test_304_with_etag_costs_no_rate_limit(world: World) -> None:
    await _many(world, 1)
    status, headers, _ = await world.call("GET", ISSUES, "marco")
    assert status == 200
    etag = headers["ETag"]
    remaining = int(headers["X-RateLimit-Remaining"])
    for name in ("X-RateLimit-Limit", "X-RateLimit-Used", "X-RateLimit-Reset",
                 "X-RateLimit-Resource"):
        assert name in headers
    status, headers, body = await world.call("GET", ISSUES, "marco",
                                             headers={"If-None-Match": etag})
    assert status == 304 and body is None
    assert int(headers["X-RateLimit-Remaining"]) == remaining
    await world.call("POST", ISSUES, "marco", {"title": "changed"})
    status, headers, _ = await world.call("GET", ISSUES, "marco",
                                          headers={"If-None-Match": etag})
    assert status == 200
    assert int(headers["X-RateLimit-Remaining"]) == remaining - 2


async def test_primary_limit_refuses_with_403_and_remaining_zero(world: World) -> None:
    world.forge.limits.primary = 3
    for _ in range(3):
        status, _, _ = await world.call("GET", "/repos/acme/vault", "marco")
        assert status == 200
    status, headers, body = await world.call("GET", "/repos/acme/vault", "marco")
    assert status == 403, body
    assert headers["X-RateLimit-Remaining"] == "0"
    assert "rate limit exceeded" in body["message"]
    status, _, _ = await world.call("GET", "/repos/acme/vault", "tina")  # per token
    assert status == 200
    status, _, body = await world.call("GET", "/rate_limit", "marco")  # free
    assert status == 200 and body["resources"]["core"]["remaining"] == 0
    world.forge.clock.advance(int(headers["X-RateLimit-Reset"]) - world.forge.clock.now() + 1)
    status, headers, _ = await world.call("GET", "/repos/acme/vault", "marco")
    assert status == 200 and headers["X-RateLimit-Remaining"] == "2"


async def test_secondary_limit_on_content_creation(world: World) -> None:
    status, _, body = await world.call("POST", "/_forge/limits",
                                       json_body={"secondary_per_minute": 2})
    assert status == 200 and body["secondary_per_minute"] == 2
    await _many(world, 2)
    status, headers, body = await world.call("POST", ISSUES, "marco", {"title": "third"})
    assert status == 403
    assert "secondary rate limit" in body["message"]
    assert 1 <= int(headers["Retry-After"]) <= 60
    status, _, _ = await world.call("POST", f"{ISSUES}/1/comments", "marco", {"body": "x"})
    assert status == 403  # comments count too
    status, _, _ = await world.call("PATCH", f"{ISSUES}/1", "marco", {"title": "edit"})
    assert status == 200  # edits are not content creation
    world.forge.clock.advance(int(headers["Retry-After"]))
    status, _, _ = await world.call("POST", ISSUES, "marco", {"title": "third"})
    assert status == 201


async def test_secondary_hourly_limit(world: World) -> None:
    world.forge.limits.secondary_per_hour = 3
    for i in range(3):
        world.forge.clock.advance(61)
        status, _, _ = await world.call("POST", ISSUES, "marco", {"title": str(i)})
        assert status == 201
    status, headers, _ = await world.call("POST", ISSUES, "marco", {"title": "x"})
    assert status == 403 and int(headers["Retry-After"]) > 60
