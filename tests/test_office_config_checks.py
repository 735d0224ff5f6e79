"""Issue 23: a config change in a pull request is checked before it is merged, as Mergify's and
Renovate's are. The local forge's branches, pull requests and check runs (GitHub's shapes, read
by an unmodified githubkit), then the app: a pull request in the org's `.github` repository
that changes `vaultmail.yml` gets a check run "vaultmail config", failing with an annotation
at each error's line and column, succeeding once a push fixes it; other pull requests get
nothing."""

from __future__ import annotations

import base64
import logging
from collections.abc import AsyncIterator
from importlib import resources
from types import SimpleNamespace
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from gidgethub import sansio
from githubkit import GitHub, TokenAuthStrategy, webhooks

from bot.app.context import HandlerContext
from bot.app.embedded import Embedded
from bot.forge.gitea import GiteaClient
from bot.office.config import OfficeConfigError, parse_office
from bot.office.source import OfficeSource
from handlers.config_checks import check_config_pull_request
from localforge import LocalForge
from localforge.tests import conftest as forge_fixtures
from localforge.tests.conftest import SECRET, Hooks, Keys, World
from tests.support import served

hooks = forge_fixtures.hooks
keys = forge_fixtures.keys
CONFIG_REPO = "acme/.github"


def _example() -> str:
    return resources.files("bot").joinpath("example_office.yml").read_text()


def _line_of(text: str, needle: str) -> int:
    return next(i for i, line in enumerate(text.splitlines(), 1) if needle in line)


# -- the local forge -----------------------------------------------------------------------
@pytest.fixture
async def world(hooks: Hooks, keys: Keys) -> AsyncIterator[World]:
    """localforge's test world, the App subscribed to `pull_request` with `checks: write`."""
    forge = LocalForge()
    await forge.start("127.0.0.1", 0)
    async with aiohttp.ClientSession() as session:
        tokens = {"admin": forge.add_user("admin")}
        forge.add_org("acme", owner="admin")
        tokens["marco"] = forge.add_user("marco", email="marco@acme.com")
        forge.add_org_member("acme", "marco")
        forge.add_repo("acme", "vault")
        forge.set_permission("acme/vault", "marco", "write")
        forge.put_file("acme/vault", "README.md", "hello\n")
        app_id = forge.register_app(
            slug="vaultmail", name="vaultmail", public_key_pem=keys.public_pem,
            webhook_url=hooks.url, webhook_secret=SECRET, events=["pull_request"],
            permissions={"issues": "write", "metadata": "read", "contents": "read",
                         "pull_requests": "read", "checks": "write"})
        inst = forge.install_app(app_id, "acme")
        await forge.webhooks_idle()
        hooks.clear()
        yield World(forge, hooks, keys, tokens, app_id, inst, session)
    await forge.stop()


async def test_pull_requests_and_check_runs_as_github_shapes_them(world: World) -> None:
    forge = world.forge
    number = forge.open_pull("acme/vault", "docs", {"README.md": "hello\nworld\n",
                                                    "NEW.md": "new\n"}, "marco")
    await world.idle()
    [opened] = [r for r in world.hooks.received if r.event == "pull_request"]
    webhooks.parse("pull_request", opened.body)  # githubkit's webhook models take it
    pr = opened.payload
    assert pr["action"] == "opened" and pr["number"] == number
    assert pr["installation"]["id"] == world.installation_id
    assert pr["repository"]["full_name"] == "acme/vault"
    assert pr["pull_request"]["head"]["ref"] == "docs"
    assert pr["pull_request"]["base"]["ref"] == "main"
    first = pr["pull_request"]["head"]["sha"]
    assert len(first) == 40

    token = await world.installation_token()
    client = GitHub(TokenAuthStrategy(token), base_url=world.url)
    gh = client.rest
    files: Any = (await gh.pulls.async_list_files("acme", "vault", number)).parsed_data
    assert sorted((f.filename, f.status) for f in files) == [
        ("NEW.md", "added"), ("README.md", "modified")]
    got = (await gh.pulls.async_get("acme", "vault", number)).parsed_data
    assert got.head.sha == first and got.changed_files == 2

    # a second push: synchronize, a new head; each commit's files stay readable at its sha
    world.hooks.clear()
    second = forge.push_to_branch("acme/vault", "docs", {"NEW.md": None}, "marco")
    await world.idle()
    [sync] = [r for r in world.hooks.received if r.event == "pull_request"]
    webhooks.parse("pull_request", sync.body)
    assert sync.payload["action"] == "synchronize"
    assert (sync.payload["before"], sync.payload["after"]) == (first, second)
    assert sync.payload["pull_request"]["head"]["sha"] == second
    files = (await gh.pulls.async_list_files("acme", "vault", number)).parsed_data
    assert [(f.filename, f.status) for f in files] == [("README.md", "modified")]
    for ref, present in ((first, True), (second, False), ("docs", False), ("main", False)):
        status, _, _ = await world.call("GET", f"/repos/acme/vault/contents/NEW.md?ref={ref}",
                                        "marco")
        assert status == (200 if present else 404), ref
    readme = (await gh.repos.async_get_content("acme", "vault", "README.md",
                                               ref=second)).parsed_data
    assert getattr(readme, "path", None) == "README.md"
    status, _, _ = await world.call("GET", "/repos/acme/vault/contents/README.md?ref=nope",
                                    "marco")
    assert status == 404

    # check runs: an App's, with annotations, listed for the commit and its branch
    made = (await gh.checks.async_create(
        "acme", "vault", data={
            "name": "lint", "head_sha": second, "status": "completed",
            "conclusion": "failure",
            "output": {"title": "1 problem", "summary": "fix it", "annotations": [
                {"path": "README.md", "start_line": 2, "end_line": 2, "start_column": 3,
                 "end_column": 3, "annotation_level": "failure", "message": "bad word"}]}}
    )).parsed_data
    assert made.status == "completed" and made.conclusion == "failure"
    assert made.output.annotations_count == 1
    assert [p.number for p in made.pull_requests] == [number]
    fixed = (await gh.checks.async_update("acme", "vault", made.id, data={
        "conclusion": "success", "output": {"title": "ok", "summary": "fine"}})).parsed_data
    assert fixed.conclusion == "success"
    listed = (await gh.checks.async_list_for_ref("acme", "vault", "docs")).parsed_data
    assert [(c.name, c.conclusion) for c in listed.check_runs] == [("lint", "success")]
    notes = (await gh.checks.async_list_annotations("acme", "vault", made.id)).parsed_data
    assert [(n.start_line, n.start_column, n.message) for n in notes] == [(2, 3, "bad word")]
    assert (await gh.checks.async_list_for_ref("acme", "vault", first)
            ).parsed_data.total_count == 0

    # GitHub's refusals: a person's token, a commit the repository lacks, columns on two lines
    status, _, body = await world.call("POST", "/repos/acme/vault/check-runs", "marco",
                                       {"name": "x", "head_sha": second})
    assert status == 403 and "GitHub App" in body["message"]
    auth = f"token {token}"
    status, _, body = await world.call("POST", "/repos/acme/vault/check-runs", auth=auth,
                                       json_body={"name": "x", "head_sha": "0" * 40})
    assert status == 422 and "No commit found" in body["message"]
    status, _, _ = await world.call("POST", "/repos/acme/vault/check-runs", auth=auth,
                                    json_body={"name": "x", "head_sha": second, "output": {
                                        "title": "t", "summary": "s", "annotations": [{
                                            "path": "a", "start_line": 1, "end_line": 2,
                                            "start_column": 1, "annotation_level": "notice",
                                            "message": "m"}]}})
    assert status == 422


async def test_check_runs_need_checks_write(world: World) -> None:
    forge = world.forge
    forge.open_pull("acme/vault", "docs", {"README.md": "x\n"}, "marco")
    sha = forge.state.repo("acme", "vault").branches["docs"].head_sha  # type: ignore[union-attr]
    forge.state.apps[world.app_id].permissions.pop("checks")
    token = await world.installation_token()
    status, _, body = await world.call("POST", "/repos/acme/vault/check-runs",
                                       auth=f"token {token}",
                                       json_body={"name": "x", "head_sha": sha})
    assert status == 403 and body["message"] == "Resource not accessible by integration"


async def test_a_check_runs_summary_is_held_to_githubs_limit(world: World) -> None:
    """GitHub documents output.summary (and text) at most 65,535 characters, refusing more."""
    forge = world.forge
    forge.open_pull("acme/vault", "docs", {"README.md": "x\n"}, "marco")
    sha = forge.state.repo("acme", "vault").branches["docs"].head_sha  # type: ignore[union-attr]
    auth = f"token {await world.installation_token()}"
    for key, size, want in (("summary", 65_535, 201), ("summary", 65_536, 422),
                            ("text", 65_536, 422)):
        output = {"title": "t", "summary": "s", key: "x" * size}
        status, _, body = await world.call("POST", "/repos/acme/vault/check-runs", auth=auth,
                                           json_body={"name": "x", "head_sha": sha,
                                                      "output": output})
        assert status == want, (key, size, body)
        if status == 422:
            assert body["message"] == ("Invalid request.\n\nOnly 65535 characters are "
                                       f"allowed; {size} were supplied."), body


# -- the app -------------------------------------------------------------------------------
async def _check_runs(office: Embedded, repo: str, ref: str) -> list[dict[str, Any]]:
    headers = {"Authorization": f"token {office.forge_tokens['admin']}"}
    async with aiohttp.ClientSession() as http:
        async with http.get(f"{office.forge.url}/repos/{repo}/commits/{ref}/check-runs",
                            headers=headers) as resp:
            assert resp.status == 200, await resp.text()
            runs: list[dict[str, Any]] = (await resp.json())["check_runs"]
        for run in runs:
            async with http.get(run["output"]["annotations_url"], headers=headers,
                                params={"per_page": "100"}) as resp:
                run["annotations"] = await resp.json()
    return runs


async def test_a_config_pull_request_gets_a_check_run_failing_then_passing(
        embedded: Embedded) -> None:
    forge = embedded.forge
    bad = _example().replace("slug: scout", "slug: Scout!").replace(
        "org: acme", "org: acme\nflavour: vanilla")
    with pytest.raises(OfficeConfigError) as pushed:  # what a push of it is refused with
        parse_office(bad, "acme/.github/vaultmail.yml", repository=True)
    number = forge.open_pull(CONFIG_REPO, "office-edit", {"vaultmail.yml": bad}, "marco")
    await embedded.settle()
    head = forge.state.repo("acme", ".github").pulls[number].head_sha  # type: ignore[union-attr]
    [run] = await _check_runs(embedded, CONFIG_REPO, head)
    assert run["name"] == "vaultmail config" and run["conclusion"] == "failure", run
    assert run["app"]["slug"] == "vaultmail"
    assert "2 errors" in run["output"]["title"], run["output"]
    summary = run["output"]["summary"]
    assert "agents[0].slug" in summary and "flavour" in summary and "vaultmail office check" \
        in summary
    places = sorted((a["path"], a["start_line"], a["start_column"], a["annotation_level"])
                    for a in run["annotations"])
    assert places == sorted([
        ("vaultmail.yml", _line_of(bad, "slug: Scout!"), 11, "failure"),
        ("vaultmail.yml", _line_of(bad, "flavour"), 1, "failure")])
    # the same messages a push of it gets, less the file name and the place
    assert sorted(a["message"] for a in run["annotations"]) == sorted(
        e.removeprefix("acme/.github/vaultmail.yml: ").rsplit(" (line ", 1)[0]
        for e in pushed.value.errors)

    # (a valid config that still differs from main's: one the same as main's changes nothing)
    fixed = forge.push_to_branch(CONFIG_REPO, "office-edit",
                                 {"vaultmail.yml": _example() + "# reviewed\n"}, "marco")
    await embedded.settle()
    [ok] = await _check_runs(embedded, CONFIG_REPO, fixed)
    assert ok["conclusion"] == "success" and ok["annotations"] == [], ok
    assert "valid" in ok["output"]["title"]
    # the pull request was not merged: the config in force is the one on main, unchanged,
    # and no refusal issue was opened for what is only proposed
    async with aiohttp.ClientSession() as http, http.get(
            f"{forge.url}/repos/{CONFIG_REPO}/issues?state=all",
            headers={"Authorization": f"token {embedded.forge_tokens['admin']}"}) as resp:
        assert await resp.json() == []


async def test_pull_requests_that_leave_the_config_alone_get_nothing(
        embedded: Embedded) -> None:
    forge = embedded.forge
    bad = _example().replace("slug: scout", "slug: Scout!")
    forge.add_repo("acme", "website")
    forge.put_file("acme/website", "index.md", "hi\n")
    elsewhere = forge.open_pull("acme/website", "config-lookalike",
                                {"vaultmail.yml": bad}, "marco")
    untouched = forge.open_pull(CONFIG_REPO, "readme", {"README.md": "the org\n"}, "marco")
    await embedded.settle()
    for repo, number in (("acme/website", elsewhere), (CONFIG_REPO, untouched)):
        owner, name = repo.split("/")
        head = forge.state.repo(owner, name).pulls[number].head_sha  # type: ignore[union-attr]
        assert await _check_runs(embedded, repo, head) == [], repo
    assert not any(run.name == "vaultmail config" for repo in forge.state.repos.values()
                   for run in repo.check_runs.values())


async def test_a_strangers_config_with_thousands_of_errors_costs_one_check_run_write(
        embedded: Embedded) -> None:
    """An outsider's pull request to a public `.github` whose vaultmail.yml holds an error
    for each of thousands of lines (some keys thousands of characters long): one write of
    one check run, its first 50 errors as annotations and in a summary GitHub takes, which
    says how many more there are. (Each login is thousands of characters: an error quotes
    it.)"""
    forge = embedded.forge
    forge.state.repo("acme", ".github").private = False
    forge.add_user("troll")
    long = "k" * 2400  # (the file under 1 MB: GitHub gives no bigger one's bytes in JSON)
    bad = "org: acme\nhumans:\n" + "".join(
        f"  - {{email: bad{i}, login: 'x y{i}{long}', nope{i}: 1}}\n" for i in range(400))
    before = len(forge.requests)
    number = forge.open_pull(CONFIG_REPO, "troll-patch", {"vaultmail.yml": bad}, "troll")
    await embedded.settle()
    writes = [r for r in list(forge.requests)[before:]
              if "check-runs" in r.route and r.method in ("POST", "PATCH")]
    assert [(r.method, r.status) for r in writes] == [("POST", 201)]
    head = forge.state.repo("acme", ".github").pulls[number].head_sha  # type: ignore[union-attr]
    [run] = await _check_runs(embedded, CONFIG_REPO, head)
    assert run["conclusion"] == "failure" and "1200 errors" in run["output"]["title"]
    assert len(run["annotations"]) == 50
    assert all(len(a["message"]) <= 500 for a in run["annotations"])
    summary = run["output"]["summary"]
    assert len(summary) < 40_000
    assert "1150 more" in summary and "push again" in summary, summary[-400:]



async def test_a_config_too_big_to_read_fails_the_check_saying_so(embedded: Embedded) -> None:
    """A pull request's config over the 2 MiB limit (on GitHub, one whose bytes the contents
    API does not give) is a failed check naming the limit, read no further than its size;
    the check's read raised, and no check was reported (acted out)."""
    forge = embedded.forge
    forge.add_user("troll")
    line = "# " + "x" * 1021 + "\n"
    number = forge.open_pull(CONFIG_REPO, "big", {"vaultmail.yml": line * 3 * 1024}, "troll")
    await embedded.settle()
    head = forge.state.repo("acme", ".github").pulls[number].head_sha  # type: ignore[union-attr]
    [run] = await _check_runs(embedded, CONFIG_REPO, head)
    assert run["conclusion"] == "failure", run
    assert "more than 2,097,152 bytes (2 MiB)" in run["output"]["summary"], run["output"]

# -- Gitea: a commit status (the local Gitea forge has no pull requests yet: a stub answers) ---
async def test_on_gitea_the_check_is_a_commit_status() -> None:
    bad = _example().replace("slug: scout", "slug: Scout!")
    sha = "a" * 40
    seen: list[tuple[str, str, Any]] = []

    async def files(request: web.Request) -> web.Response:
        seen.append(("GET", request.path_qs, None))
        return web.json_response([{"filename": "vaultmail.yml", "status": "changed"}])

    async def contents(request: web.Request) -> web.Response:
        seen.append(("GET", request.path_qs, None))
        return web.json_response({"type": "file", "encoding": "base64", "path": "vaultmail.yml",
                                  "content": base64.b64encode(bad.encode()).decode()})

    async def status(request: web.Request) -> web.Response:
        seen.append(("POST", request.path, await request.json()))
        return web.json_response({"id": 1, "status": "failure"}, status=201)

    app = web.Application()
    app.router.add_get("/api/v1/repos/acme/.github/pulls/3/files", files)
    app.router.add_get("/api/v1/repos/acme/.github/contents/vaultmail.yml", contents)
    app.router.add_post(f"/api/v1/repos/acme/.github/statuses/{sha}", status)
    async with served(app) as url, aiohttp.ClientSession() as http:
        forge = GiteaClient("t" * 40, http, url).installation()
        ctx = HandlerContext(services=SimpleNamespace(offices=OfficeSource()),  # type: ignore[arg-type]
                             forge=forge, installation_id=None, delivery_id="d",
                             log=logging.LoggerAdapter(logging.getLogger("test")))
        payload = {"action": "synchronized", "number": 3,
                   "pull_request": {"number": 3, "head": {"ref": "edit", "sha": sha},
                                    "base": {"ref": "main"}},
                   "repository": {"name": ".github", "owner": {"login": "acme"}}}
        await check_config_pull_request(sansio.Event(payload, event="pull_request",
                                                     delivery_id="d"), ctx)
    assert ("GET", f"/api/v1/repos/acme/.github/contents/vaultmail.yml?ref={sha}", None) in seen
    [(_, _, body)] = [s for s in seen if s[0] == "POST"]
    assert body["state"] == "failure" and body["context"] == "vaultmail config"
    assert body["description"].startswith("vaultmail.yml is invalid: 1 error: agents[0].slug")
    assert f"(line {_line_of(bad, 'Scout!')}, column 11)" in body["description"], body


async def test_an_app_without_checks_write_leaves_the_pull_request_unchecked(
        embedded: Embedded) -> None:
    """Registered before app.yml asked for it: no check run, and no delivery left failing."""
    forge = embedded.forge
    for app in forge.state.apps.values():
        app.permissions.pop("checks", None)
    bad = _example().replace("slug: scout", "slug: Scout!")
    forge.open_pull(CONFIG_REPO, "office-edit", {"vaultmail.yml": bad}, "marco")
    await embedded.settle()
    assert [r.status for r in forge.requests
            if r.route == "POST /repos/{owner}/{repo}/check-runs"] == [403]
    assert not any(repo.check_runs for repo in forge.state.repos.values())
    assert await embedded.services.store.dead_letters() == []
