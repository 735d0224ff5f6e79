"""The request loop's hot path done by hand, with the answers of what it stands in for: a
read's answer belongs to its caller (the ETag cache keeps the text it was read from, nested
parts too), and a route's URL is filled in as uritemplate fills it."""

from __future__ import annotations

from typing import Any
from urllib.parse import urljoin

import pytest
from uritemplate import URITemplate

from bot.forge.caller import format_url

from .conftest import REPO, Env


async def test_nested_parts_of_a_read_can_be_changed_without_touching_the_cache(
        env: Env) -> None:
    inst = env.inst()
    issue = await inst.create_issue(REPO, "cached", "body", labels=["mail:new"])
    first = await inst.get_issue(REPO, issue["number"])  # 200: what the cache now holds
    first["labels"].append({"name": "mutated"})
    first["user"]["login"] = "someone-else"
    second = await inst.get_issue(REPO, issue["number"])  # 304: from the cache
    assert inst.stats.not_modified == 1
    assert [label["name"] for label in second["labels"]] == ["mail:new"]
    assert second["user"]["login"] != "someone-else"
    second["labels"].clear()
    third = await inst.get_issue(REPO, issue["number"])
    assert [label["name"] for label in third["labels"]] == ["mail:new"]


BASE = "http://127.0.0.1:8080/api/v3"
ODD = "a b/c?d#e%f+g&h=i~j.k_l-m é中😀{}"


@pytest.mark.parametrize("url", [
    "/repos/{owner}/{repo}/issues/{number}", "/repos/{owner}/{repo}/issues{?state,number}",
    "/x/{owner}{repo}/y", "/plain/{}", "/literal", "http://elsewhere/abs/{owner}",
    "/q/{owner}?x={repo}", "/r/{owner}/{+repo}",
])
@pytest.mark.parametrize("values", [
    {"owner": "acme", "repo": "scout-vault", "number": 12},
    {"owner": ODD, "repo": ODD, "number": -3, "state": "all"},
    {"owner": "acme", "repo": True, "number": 2.5},  # (not text or a number: uritemplate's)
    {"owner": "acme", "repo": ["x", "y z"], "number": None},
    {"owner": "acme"},  # missing: expanded to nothing, as uritemplate does
    {},
])
def test_urls_are_filled_in_as_uritemplate_fills_them(url: str, values: dict[str, Any]) -> None:
    joined = urljoin(BASE + "/", url.removeprefix("/"))
    assert format_url(BASE, url, values) == str(URITemplate(joined).expand(values))
