"""Issue 25 on Gitea: the local forge's Gitea dialect has Gitea's issue dependencies
(routers/api/v1/repo/issue_dependency.go, 1.22): `dependencies` (what blocks an issue) and
`blocks` (what it blocks), each listed, added and removed with an `IssueMeta` body; and its
exclusive scoped labels. The app shows who an outcome waits on through the dependencies."""

from __future__ import annotations

from importlib import resources
from typing import Any

import aiohttp

from bot.app.embedded import Embedded
from bot.office.source import CONFIG_PATH, CONFIG_REPO
from tests.gitea.conftest import GiteaSetup
from tests.items_support import MARCO, SCOUT, TOKEN_TTL
from tests.support import gitea_api

VAULT = "/repos/acme/scout-vault"


async def _issue(g: GiteaSetup, s: aiohttp.ClientSession, title: str,
                 repo: str = VAULT) -> dict[str, Any]:
    _, body, _ = await g.call(s, "vaultmail", "POST", f"{repo}/issues", {"title": title},
                              expect=201)
    return dict(body)


def meta(issue: dict[str, Any], repo: str = "scout-vault") -> dict[str, Any]:
    return {"owner": "acme", "repo": repo, "index": issue["number"]}


async def test_dependencies_and_blocks_both_ways_across_repositories(
        gitea: GiteaSetup, session: aiohttp.ClientSession) -> None:
    g, s = gitea, session
    blocked, blocker = await _issue(g, s, "Blocked"), await _issue(g, s, "Blocker")
    other = await _issue(g, s, "Elsewhere", "/repos/acme/builder-vault")
    deps = f"{VAULT}/issues/{blocked['number']}/dependencies"
    _, got, _ = await g.call(s, "vaultmail", "POST", deps, meta(blocker), expect=201)
    assert got["number"] == blocked["number"], "the answer is the issue in the path"
    _, listed, headers = await g.call(s, "marco", "GET", deps, expect=200)
    assert [i["number"] for i in listed] == [blocker["number"]]
    _, blocks, _ = await g.call(s, "marco", "GET",
                                f"{VAULT}/issues/{blocker['number']}/blocks", expect=200)
    assert [i["number"] for i in blocks] == [blocked["number"]]
    # the other way round: the issue in the path blocks the one in the body, in another repo
    _, got, _ = await g.call(s, "vaultmail", "POST",
                             f"{VAULT}/issues/{blocker['number']}/blocks",
                             meta(other, "builder-vault"), expect=201)
    assert got["number"] == blocker["number"]
    _, listed, _ = await g.call(s, "vaultmail", "GET",
                                f"/repos/acme/builder-vault/issues/{other['number']}"
                                "/dependencies", expect=200)
    assert [(i["repository"]["full_name"], i["number"]) for i in listed] == [
        ("acme/scout-vault", blocker["number"])]
    # removing answers 201 too (Gitea's handler), and a second removal is Gitea's 500
    await g.call(s, "vaultmail", "DELETE", deps, meta(blocker), expect=201)
    _, listed, _ = await g.call(s, "marco", "GET", deps, expect=200)
    assert listed == []
    await g.call(s, "vaultmail", "DELETE", deps, meta(blocker), expect=500)


async def test_dependencies_refuse_twice_circles_and_who_may_not_write(
        gitea: GiteaSetup, session: aiohttp.ClientSession) -> None:
    g, s = gitea, session
    a, b = await _issue(g, s, "A"), await _issue(g, s, "B")
    deps_a = f"{VAULT}/issues/{a['number']}/dependencies"
    await g.call(s, "vaultmail", "POST", deps_a, meta(b), expect=201)
    await g.call(s, "vaultmail", "POST", deps_a, meta(b), expect=500)  # exists
    await g.call(s, "vaultmail", "POST", f"{VAULT}/issues/{b['number']}/dependencies",
                 meta(a), expect=500)  # circular
    # builder's agent reads scout's vault but may not write it: Gitea hides it (404)
    await g.call(s, "builder-bot", "POST", f"{VAULT}/issues/{b['number']}/dependencies",
                 meta(await _issue(g, s, "C")), expect=404)
    await g.call(s, "vaultmail", "POST", deps_a, {"owner": "acme", "repo": "scout-vault",
                                                   "index": 999}, expect=404)


# -- exclusive scoped labels -----------------------------------------------------------------
async def test_an_exclusive_scoped_label_takes_the_place_of_the_other_of_its_scope(
        gitea: GiteaSetup, session: aiohttp.ClientSession) -> None:
    g, s = gitea, session

    async def label(name: str, exclusive: bool = True) -> int:
        _, body, _ = await g.call(s, "vaultmail", "POST", f"{VAULT}/labels",
                                  {"name": name, "color": "#00aabb", "exclusive": exclusive},
                                  expect=201)
        assert body["exclusive"] is exclusive
        return int(body["id"])

    new, working, plain, other = (await label("mail/new"), await label("mail/working"),
                                  await label("keep"), await label("kind/goal"))
    loose = await label("loose/x", exclusive=False)
    issue = await _issue(g, s, "A mail")
    path = f"{VAULT}/issues/{issue['number']}/labels"

    def names(body: Any) -> list[str]:
        return sorted(lb["name"] for lb in body)

    _, got, _ = await g.call(s, "vaultmail", "POST", path, {"labels": [new, plain, other]},
                             expect=200)
    assert names(got) == ["keep", "kind/goal", "mail/new"]
    _, got, _ = await g.call(s, "vaultmail", "POST", path, {"labels": [working]}, expect=200)
    assert names(got) == ["keep", "kind/goal", "mail/working"], "the forge refuses two states"
    # replacing with two of one scope: the later one stays
    _, got, _ = await g.call(s, "vaultmail", "PUT", path,
                             {"labels": [working, new, loose, plain]}, expect=200)
    assert names(got) == ["keep", "loose/x", "mail/new"]
    # a label that is not exclusive has no scope: two of them stay
    loose2 = await label("loose/y", exclusive=False)
    _, got, _ = await g.call(s, "vaultmail", "POST", path, {"labels": [loose2]}, expect=200)
    assert names(got) == ["keep", "loose/x", "loose/y", "mail/new"]
    # editing a label can make it exclusive
    _, edited, _ = await g.call(s, "vaultmail", "PATCH", f"{VAULT}/labels/{loose}",
                                {"exclusive": True}, expect=200)
    assert edited["exclusive"] is True


# -- the app: waiting shown through Gitea's dependencies ------------------------------------
async def test_on_gitea_an_outcome_waiting_on_a_person_depends_on_their_tracker(
        office: Embedded, session: aiohttp.ClientSession) -> None:
    text = resources.files("bot").joinpath("example_office.yml").read_text()
    office.forge.put_file(f"acme/{CONFIG_REPO}", CONFIG_PATH,
                          text.replace("org: acme\n", "org: acme\nwaiting: dependency\n", 1),
                          pusher="admin")
    await office.settle()
    call = gitea_api(session, office, "marco")

    async def tool(who: str, name: str, **args: Any) -> Any:
        headers = {"Authorization": f"Bearer {office.api_tokens[who]}"}
        async with session.post(f"{office.app_url}/api/v1/tools/{name}", json=args,
                                headers=headers) as resp:
            got = await resp.json()
            assert resp.status == 200, got
            return got

    lid = (await call("POST", f"{VAULT}/labels", {"name": "outcome", "color": "#00aabb"},
                      201))["id"]
    outcome = await call("POST", f"{VAULT}/issues", {"title": "Auth schema migration",
                                                     "body": "x", "labels": [lid]}, 201)
    await office.settle()
    ref = f"acme/scout-vault#{outcome['number']}"
    asked = await tool(SCOUT, "add_comment", **{**TOKEN_TTL, "target": ref})
    deps = f"{VAULT}/issues/{outcome['number']}/dependencies"
    [tracker] = await call("GET", deps)
    assert tracker["title"] == "Waiting on marco" and tracker["state"] == "open"
    await tool(MARCO, "add_comment", targetType="outcome", target=ref,
               parent=asked["comment"]["id"], option=1)
    assert await call("GET", deps) == [], "answered: it depends on nobody"
