"""PyGithub, unmodified, against the local forge: App authentication, issues, labels, comments,
pagination, conditional requests and errors, as a PyGithub user writes them.

PyGithub is synchronous (requests), so the scenario runs in a worker thread while the forge
answers on the test's event loop. PyGithub's own pacing is left as shipped (a second between
writes), so the scenario keeps its writes few."""

from __future__ import annotations

import asyncio

import pytest
from github import Auth, Github, GithubException, GithubIntegration, UnknownObjectException

from .conftest import ORG, World

REPO = f"{ORG}/scout-vault"


def _scenario(base_url: str, app_id: int, private_pem: str, forge_requests: object) -> None:
    app_auth = Auth.AppAuth(app_id, private_pem)
    integration = GithubIntegration(base_url=base_url, auth=app_auth)
    assert integration.get_app().slug == "vaultmail"
    installation = integration.get_repo_installation(*REPO.split("/"))
    gh = Github(base_url=base_url, auth=app_auth.get_installation_auth(installation.id),
                per_page=2)
    repo = gh.get_repo(REPO)
    assert repo.full_name == REPO and repo.private

    label = repo.create_label("mail:new", "0e8a16", "unread")
    assert label.name == "mail:new" and label.color == "0e8a16"
    made = [repo.create_issue(title=f"Mail {n}", body="hello", labels=["mail:new"])
            for n in range(3)]
    assert [lb.name for lb in made[0].labels] == ["mail:new"]
    assert made[0].user.login == "vaultmail[bot]" and made[0].user.type == "Bot"

    # pagination: PyGithub follows the Link header, 2 a page
    listed = repo.get_issues(state="all")
    assert listed.totalCount == 3  # from the last page's link, as PyGithub reads it
    assert sorted(i.number for i in listed) == sorted(i.number for i in made)
    assert [i.number for i in repo.get_issues(labels=[label])] != []

    issue = made[0]
    comment = issue.create_comment("first")
    comment.edit("edited")
    assert [c.body for c in issue.get_comments()] == ["edited"]
    issue.add_to_labels("mail:working")
    issue.remove_from_labels("mail:new")
    assert [lb.name for lb in issue.get_labels()] == ["mail:working"]
    issue.edit(state="closed", state_reason="completed")
    assert repo.get_issue(issue.number).state == "closed"
    issue.create_reaction("heart")
    found = gh.search_issues(f"repo:{REPO} is:issue label:mail:working")
    assert [i.number for i in found] == [issue.number]
    assert gh.get_rate_limit().resources.core.limit >= 5000

    # conditional requests: update() sends If-None-Match and reports whether anything changed
    fresh = repo.get_issue(made[1].number)
    assert fresh.update() is False  # 304
    made[1].edit(title="Renamed")
    assert fresh.update() is True and fresh.title == "Renamed"

    # errors as GitHub sends them, read as PyGithub reads them
    with pytest.raises(UnknownObjectException):
        repo.get_issue(9999)
    with pytest.raises(GithubException) as dup:
        repo.create_label("mail:new", "ededed")
    assert dup.value.status == 422
    assert dup.value.data["errors"][0]["code"] == "already_exists"  # type: ignore[index]


async def test_pygithub_drives_issues_labels_comments_and_pages(world: World) -> None:
    await asyncio.to_thread(_scenario, world.url, world.app_id,
                            world.key.private_pem.decode(), world.forge.requests)
    routes = {r.route for r in world.forge.requests}
    assert "POST /app/installations/{installation_id}/access_tokens" in routes
    statuses = [r.status for r in world.forge.requests
                if r.route == "GET /repos/{owner}/{repo}/issues/{issue_number}"]
    assert 304 in statuses
