"""githubkit, unmodified, against the local forge: its typed models parse every response, so a
validation error is a fidelity bug of the forge. Both REST API versions githubkit serves."""

from __future__ import annotations

from typing import Any

import pytest
from githubkit import AppAuthStrategy, AppInstallationAuthStrategy, GitHub
from githubkit.cache import MemCacheStrategy
from githubkit.exception import RequestFailed

from .conftest import ORG, World

REPO = "scout-vault"


def _client(w: World) -> GitHub[Any]:
    # the app's private key and id; githubkit mints the JWT and the installation token itself
    return GitHub(AppInstallationAuthStrategy(
        app_id=w.app_id, private_key=w.key.private_pem.decode(),
        installation_id=w.installation_id), base_url=w.url, http_cache=True,
        # githubkit's default cache is one per process; each test's forge is new (the same
        # app and installation ids with other tokens), so each client gets its own
        cache_strategy=MemCacheStrategy())


def _parsed(resp: Any) -> Any:
    """githubkit parses lazily: touching parsed_data runs its pydantic models."""
    return resp.parsed_data


@pytest.mark.parametrize("version", ["2026-03-10", "2022-11-28"])
async def test_githubkit_drives_issues_labels_comments_and_pages(world: World,
                                                               version: str) -> None:
    gh = _client(world)
    rest = gh.rest(version)
    # App authentication: the JWT for /app, then the installation's own token
    app_gh = GitHub(AppAuthStrategy(app_id=world.app_id,
                                    private_key=world.key.private_pem.decode()),
                    base_url=world.url, cache_strategy=MemCacheStrategy())
    app = _parsed(await app_gh.rest(version).apps.async_get_authenticated())
    assert app.slug == "vaultmail"
    inst = _parsed(await app_gh.rest(version).apps.async_get_repo_installation(ORG, REPO))
    assert inst.id == world.installation_id

    label = _parsed(await rest.issues.async_create_label(
        ORG, REPO, name="mail:new", color="0e8a16", description="unread"))
    assert label.name == "mail:new" and label.archived_at is None

    made = []
    for n in range(5):
        resp = await rest.issues.async_create(ORG, REPO, title=f"Mail {n}", body="hello",
                                              labels=["mail:new"])
        assert resp.headers["X-GitHub-Api-Version-Selected"] == version
        made.append(_parsed(resp))
    assert [lb.name for lb in made[0].labels if not isinstance(lb, str)] == ["mail:new"]

    # pagination over the Link header, 2 a page
    seen = [i.number async for i in gh.rest.paginate(
        rest.issues.async_list_for_repo, owner=ORG, repo=REPO, state="all", per_page=2)]
    assert sorted(seen) == sorted(i.number for i in made)

    number = made[0].number
    comment = _parsed(await rest.issues.async_create_comment(ORG, REPO, number, body="first"))
    edited = _parsed(await rest.issues.async_update_comment(ORG, REPO, comment.id,
                                                            body="edited"))
    assert edited.body == "edited"
    comments = _parsed(await rest.issues.async_list_comments(ORG, REPO, number))
    assert [c.body for c in comments] == ["edited"]
    _parsed(await rest.issues.async_add_labels(ORG, REPO, number, data=["mail:working"]))
    left = _parsed(await rest.issues.async_remove_label(ORG, REPO, number, "mail:new"))
    assert [lb.name for lb in left] == ["mail:working"]
    closed = _parsed(await rest.issues.async_update(ORG, REPO, number, state="closed",
                                                    state_reason="completed"))
    assert closed.state == "closed"
    _parsed(await rest.issues.async_list_events_for_timeline(ORG, REPO, number))
    _parsed(await rest.reactions.async_create_for_issue(ORG, REPO, number, content="heart"))
    found = _parsed(await rest.search.async_issues_and_pull_requests(
        q=f"repo:{ORG}/{REPO} is:issue label:mail:working"))
    assert [i.number for i in found.items] == [number]
    _parsed(await rest.rate_limit.async_get())
    _parsed(await rest.repos.async_get(ORG, REPO))

    # conditional requests: githubkit's HTTP cache revalidates with If-None-Match
    before = len(world.forge.requests)
    await rest.issues.async_get(ORG, REPO, number)
    again = _parsed(await rest.issues.async_get(ORG, REPO, number))
    assert again.number == number
    gets = [r.status for r in list(world.forge.requests)[before:]
            if r.route == "GET /repos/{owner}/{repo}/issues/{issue_number}"]
    assert gets[-1] == 304, gets

    # errors, as githubkit reads GitHub's
    with pytest.raises(RequestFailed) as missing:
        await rest.issues.async_get(ORG, REPO, 9999)
    assert missing.value.response.status_code == 404
    with pytest.raises(RequestFailed) as dup:
        await rest.issues.async_create_label(ORG, REPO, name="mail:new", color="ededed")
    assert dup.value.response.status_code == 422
    assert dup.value.response.json()["errors"][0]["code"] == "already_exists"
