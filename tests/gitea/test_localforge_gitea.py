"""The local forge's Gitea dialect: label ids, label_updated with the whole list, Gitea's
signature headers and payload shapes, page/limit ≤ 50 with X-Total-Count, no rate limits."""

from __future__ import annotations

import hashlib
import hmac

import aiohttp

from tests.gitea.conftest import SECRET, GiteaSetup

VAULT = "/repos/acme/scout-vault"


async def _label(g: GiteaSetup, s: aiohttp.ClientSession, name: str, color: str) -> int:
    _, body, _ = await g.call(s, "vaultmail", "POST", f"{VAULT}/labels",
                              {"name": name, "color": color, "description": "d"}, expect=201)
    return int(body["id"])


async def test_version_user_and_both_auth_schemes(gitea: GiteaSetup,
                                                  session: aiohttp.ClientSession) -> None:
    async with session.get(gitea.api + "/version") as resp:
        assert resp.status == 200 and "version" in await resp.json()
    _, me, headers = await gitea.call(session, "vaultmail", "GET", "/user", expect=200)
    assert me["login"] == "vaultmail" and "[bot]" not in me["login"]
    assert not any(h.lower().startswith("x-ratelimit") for h in headers)
    await gitea.call(session, "marco", "GET", "/user", scheme="Bearer", expect=200)
    async with session.get(gitea.api + "/user", headers={"Authorization": "token nope"}) as r:
        assert r.status == 401 and "message" in await r.json()


async def test_repo_labels_by_id_with_hash_colours(gitea: GiteaSetup,
                                                   session: aiohttp.ClientSession) -> None:
    lid = await _label(gitea, session, "mail:new", "#0E8A16")
    _, label, _ = await gitea.call(session, "marco", "GET", f"{VAULT}/labels/{lid}", expect=200)
    assert label["name"] == "mail:new" and label["color"] == "0e8a16"
    await gitea.call(session, "vaultmail", "PATCH", f"{VAULT}/labels/{lid}",
                     {"color": "#fbca04"}, expect=200)
    status, _, _ = await gitea.call(session, "marco", "GET", f"{VAULT}/labels/mail:new")
    assert status == 404, "labels are addressed by id, not by name"
    status, _, _ = await gitea.call(session, "vaultmail", "POST", f"{VAULT}/labels",
                                    {"name": "x", "color": "not-a-colour"})
    assert status == 422


async def test_create_issue_takes_label_ids_and_sends_opened_then_label_updated(
        gitea: GiteaSetup, session: aiohttp.ClientSession) -> None:
    lid = await _label(gitea, session, "mail:new", "#0e8a16")
    status, _, _ = await gitea.call(session, "marco", "POST", f"{VAULT}/issues",
                                    {"title": "t", "labels": ["mail:new"]})
    assert status == 422, "names are not accepted on create"
    _, issue, _ = await gitea.call(session, "marco", "POST", f"{VAULT}/issues",
                                   {"title": "t", "body": "b", "labels": [lid]}, expect=201)
    assert [lb["name"] for lb in issue["labels"]] == ["mail:new"]
    # builder's agent has only read on scout's vault: its labels are silently dropped
    _, other, _ = await gitea.call(session, "builder-bot", "POST", f"{VAULT}/issues",
                                   {"title": "t2", "labels": [lid]}, expect=201)
    assert other["labels"] == []
    got = [d for d in await gitea.deliveries() if d.payload.get("number") == issue["number"]]
    other_got = [d.payload["action"] for d in await gitea.deliveries()
                 if d.payload.get("number") == other["number"]]
    assert other_got == ["opened"], "labels dropped for a reader: nothing to notify"
    assert [(d.headers["X-Gitea-Event"], d.payload["action"]) for d in got] == [
        ("issues", "opened"), ("issues", "label_updated")], \
        "services/issue.NewIssue notifies the labels given at creation after `opened`"
    payload = got[0].payload
    assert "installation" not in payload and "organization" not in payload
    assert payload["issue"]["number"] == issue["number"] and payload["commit_id"] == ""
    assert payload["sender"]["login"] == "marco"


async def test_label_changes_send_one_label_updated_with_the_whole_list(
        gitea: GiteaSetup, session: aiohttp.ClientSession) -> None:
    new = await _label(gitea, session, "mail:new", "#0e8a16")
    working = await _label(gitea, session, "mail:working", "#fbca04")
    _, issue, _ = await gitea.call(session, "marco", "POST", f"{VAULT}/issues",
                                   {"title": "t"}, expect=201)
    n = issue["number"]
    _, labels, _ = await gitea.call(session, "vaultmail", "POST", f"{VAULT}/issues/{n}/labels",
                                    {"labels": [new, working]}, expect=200)
    assert {lb["name"] for lb in labels} == {"mail:new", "mail:working"}
    await gitea.call(session, "vaultmail", "PUT", f"{VAULT}/issues/{n}/labels",
                     {"labels": ["mail:working"]}, expect=200)  # names work here
    await gitea.call(session, "vaultmail", "DELETE", f"{VAULT}/issues/{n}/labels/{working}",
                     expect=204)
    await gitea.call(session, "vaultmail", "DELETE", f"{VAULT}/issues/{n}/labels/{working}",
                     expect=204)  # not on the issue any more: no error, label_updated all the same
    await gitea.call(session, "vaultmail", "POST", f"{VAULT}/issues/{n}/labels",
                     {"labels": [new]}, expect=200)
    await gitea.call(session, "vaultmail", "DELETE", f"{VAULT}/issues/{n}/labels", expect=204)
    status, _, _ = await gitea.call(session, "builder-bot", "POST",
                                    f"{VAULT}/issues/{n}/labels", {"labels": [new]})
    assert status == 403, "labelling needs write on the repository"
    got = [d for d in await gitea.deliveries()
           if d.payload.get("number") == n and d.payload["action"] != "opened"]
    seen = [(d.payload["action"], d.headers["X-Gitea-Event-Type"],
             sorted(lb["name"] for lb in d.payload["issue"]["labels"])) for d in got]
    assert seen == [
        ("label_updated", "issue_label", ["mail:new", "mail:working"]),
        ("label_updated", "issue_label", ["mail:working"]),
        ("label_updated", "issue_label", []),
        ("label_updated", "issue_label", []),
        ("label_updated", "issue_label", ["mail:new"]),
        ("label_cleared", "issue_label", []),
    ]
    assert all(d.headers["X-Gitea-Event"] == "issues" and "label" not in d.payload for d in got)


async def test_deliveries_are_signed_as_gitea_signs_them(gitea: GiteaSetup,
                                                         session: aiohttp.ClientSession) -> None:
    _, issue, _ = await gitea.call(session, "marco", "POST", f"{VAULT}/issues",
                                   {"title": "t"}, expect=201)
    await gitea.call(session, "sara", "POST", f"{VAULT}/issues/{issue['number']}/comments",
                     {"body": "hello"}, expect=201)
    got = await gitea.deliveries()
    comment = next(d for d in got if d.headers["X-Gitea-Event"] == "issue_comment")
    expected = hmac.new(SECRET.encode(), comment.body, hashlib.sha256).hexdigest()
    assert comment.headers["X-Gitea-Signature"] == expected, "bare hex, no sha256= prefix"
    assert comment.headers["X-Forgejo-Signature"] == expected
    assert comment.headers["X-Gogs-Signature"] == expected
    assert comment.headers["X-Hub-Signature-256"] == "sha256=" + expected
    guid = comment.headers["X-Gitea-Delivery"]
    assert comment.headers["X-Forgejo-Delivery"] == guid == comment.headers["X-GitHub-Delivery"]
    assert comment.payload["is_pull"] is False and comment.payload["action"] == "created"
    assert comment.payload["comment"]["body"] == "hello"
    assert "installation" not in comment.payload


async def test_pages_of_at_most_50_with_total_count_and_link(
        gitea: GiteaSetup, session: aiohttp.ClientSession) -> None:
    for i in range(55):
        await gitea.call(session, "marco", "POST", f"{VAULT}/issues", {"title": f"i{i}"},
                         expect=201)
    _, page1, headers = await gitea.call(session, "marco", "GET",
                                         f"{VAULT}/issues?state=all&limit=100", expect=200)
    assert len(page1) == 50, "limit is clamped to MAX_RESPONSE_ITEMS"
    assert headers["X-Total-Count"] == "55"
    assert 'rel="next"' in headers["Link"] and "page=2" in headers["Link"]
    _, page2, headers2 = await gitea.call(session, "marco", "GET",
                                          f"{VAULT}/issues?state=all&limit=100&page=2",
                                          expect=200)
    assert len(page2) == 5 and 'rel="next"' not in headers2.get("Link", "")
    _, default, _ = await gitea.call(session, "marco", "GET", f"{VAULT}/issues", expect=200)
    assert len(default) == 30


async def test_issue_comments_are_not_paged(gitea: GiteaSetup,
                                            session: aiohttp.ClientSession) -> None:
    _, issue, _ = await gitea.call(session, "marco", "POST", f"{VAULT}/issues", {"title": "t"},
                                   expect=201)
    for i in range(60):
        await gitea.call(session, "marco", "POST",
                         f"{VAULT}/issues/{issue['number']}/comments", {"body": f"c{i}"},
                         expect=201)
    _, comments, headers = await gitea.call(
        session, "marco", "GET", f"{VAULT}/issues/{issue['number']}/comments?limit=10",
        expect=200)
    assert len(comments) == 60 and "Link" not in headers


async def test_permission_contents_and_org_hooks(gitea: GiteaSetup,
                                                 session: aiohttp.ClientSession) -> None:
    _, perm, _ = await gitea.call(
        session, "vaultmail", "GET", f"{VAULT}/collaborators/marco/permission", expect=200)
    assert perm["permission"] == "write"
    _, own, _ = await gitea.call(
        session, "vaultmail", "GET", f"{VAULT}/collaborators/vaultmail/permission", expect=200)
    assert own["permission"] == "owner"
    status, _, _ = await gitea.call(session, "marco", "GET",
                                    f"{VAULT}/collaborators/sara/permission")
    assert status == 403, "collaborators can query only their own permission"
    _, content, _ = await gitea.call(session, "vaultmail", "GET",
                                     "/repos/acme/.github/contents/vaultmail.yml", expect=200)
    assert content["encoding"] == "base64" and content["type"] == "file"
    status, _, _ = await gitea.call(session, "marco", "POST", "/orgs/acme/hooks",
                                    {"type": "gitea", "config": {"url": "http://x/"}})
    assert status == 403, "only org owners manage org hooks"
    _, hook, _ = await gitea.call(
        session, "admin", "POST", "/orgs/acme/hooks",
        {"type": "gitea", "config": {"url": "http://127.0.0.1:9/", "content_type": "json",
                                     "secret": "s"}, "events": ["issues"], "active": True},
        expect=201)
    assert hook["events"] == ["issues", "issue_assign", "issue_label", "issue_milestone",
                              "issue_comment"], "`issues` expands as Webhook.EventsArray shows it"
    assert "secret" not in hook["config"]
    _, hooks, _ = await gitea.call(session, "admin", "GET", "/orgs/acme/hooks", expect=200)
    assert len(hooks) == 2
    _, orgs, _ = await gitea.call(session, "vaultmail", "GET", "/user/orgs", expect=200)
    assert [o["username"] for o in orgs] == ["acme"]


async def test_control_health_names_the_dialect(gitea: GiteaSetup,
                                                session: aiohttp.ClientSession) -> None:
    async with session.get(gitea.forge.url + "/_forge/health") as resp:
        assert (await resp.json())["dialect"] == "gitea"


async def test_the_timeline_says_who_commented_closed_reopened_and_labelled(
        gitea: GiteaSetup, session: aiohttp.ClientSession) -> None:
    """GET .../timeline (ListIssueCommentsAndTimeline): comments and the comment rows Gitea
    writes for a close, a reopen and each label added or removed (`body` "1" when added),
    oldest first, each with the user who did it."""
    new = await _label(gitea, session, "mail:new", "#0e8a16")
    _, issue, _ = await gitea.call(session, "marco", "POST", f"{VAULT}/issues",
                                   {"title": "t"}, expect=201)
    n = issue["number"]
    await gitea.call(session, "lee", "POST", f"{VAULT}/issues/{n}/comments", {"body": "hi"},
                     expect=201)
    await gitea.call(session, "vaultmail", "POST", f"{VAULT}/issues/{n}/labels",
                     {"labels": [new]}, expect=200)
    await gitea.call(session, "marco", "PATCH", f"{VAULT}/issues/{n}", {"state": "closed"},
                     expect=201)
    await gitea.call(session, "vaultmail", "PATCH", f"{VAULT}/issues/{n}", {"state": "open"},
                     expect=201)
    await gitea.call(session, "vaultmail", "DELETE", f"{VAULT}/issues/{n}/labels", expect=204)
    _, timeline, _ = await gitea.call(session, "marco", "GET", f"{VAULT}/issues/{n}/timeline",
                                      expect=200)
    seen = [(t["type"], t["user"]["login"], t["body"],
             (t["label"] or {}).get("name")) for t in timeline]
    assert seen == [("comment", "lee", "hi", None), ("label", "vaultmail", "1", "mail:new"),
                    ("close", "marco", "", None), ("reopen", "vaultmail", "", None),
                    ("label", "vaultmail", "", "mail:new")]
    _, page, headers = await gitea.call(session, "marco", "GET",
                                        f"{VAULT}/issues/{n}/timeline?limit=2&page=2",
                                        expect=200)
    assert [t["type"] for t in page] == ["close", "reopen"]


async def test_the_timeline_says_who_assigned_and_retitled(
        gitea: GiteaSetup, session: aiohttp.ClientSession) -> None:
    """An assignee added or removed is an `assignees` row (its `assignee`, and
    `removed_assignee` when removed), a new title a `change_title` row (`old_title`,
    `new_title`): models/issues/comment.go's CommentTypeAssignees and CommentTypeChangeTitle,
    as convert.ToTimelineComment renders them. A body edit writes none."""
    _, issue, _ = await gitea.call(session, "marco", "POST", f"{VAULT}/issues",
                                   {"title": "t"}, expect=201)
    n = issue["number"]
    await gitea.call(session, "marco", "PATCH", f"{VAULT}/issues/{n}",
                     {"assignees": ["lee"], "title": "Prices", "body": "EU"}, expect=201)
    await gitea.call(session, "lee", "PATCH", f"{VAULT}/issues/{n}", {"assignees": []},
                     expect=201)
    _, timeline, _ = await gitea.call(session, "marco", "GET", f"{VAULT}/issues/{n}/timeline",
                                      expect=200)
    seen = [(t["type"], t["user"]["login"], (t["assignee"] or {}).get("login"),
             t["removed_assignee"], t["old_title"], t["new_title"]) for t in timeline]
    assert seen == [("change_title", "marco", None, False, "t", "Prices"),
                    ("assignees", "marco", "lee", False, "", ""),
                    ("assignees", "lee", "lee", True, "", "")]


async def test_a_repository_is_read_by_its_id_by_whoever_may_see_it(
        gitea: GiteaSetup, session: aiohttp.ClientSession) -> None:
    """routers/api/v1/repo/repo.go GetByID: the repository with that id under its name now
    (renamed: its new one), with the caller's permissions; 404 alike for an id none has and
    for a private repository the caller may not see (nothing says it exists). Before, the
    route was missing: a Gitea bot could not follow a repository by id."""
    repo = gitea.forge.state.repo_by_full_name("acme/scout-vault")
    assert repo is not None and repo.private
    _, by_id, _ = await gitea.call(session, "vaultmail", "GET", f"/repositories/{repo.id}",
                                   expect=200)
    _, by_name, _ = await gitea.call(session, "vaultmail", "GET", VAULT, expect=200)
    assert by_id == by_name and by_id["permissions"]["admin"] is True
    gitea.forge.rename_repo("acme/scout-vault", "scout-mail")
    _, renamed, _ = await gitea.call(session, "marco", "GET", f"/repositories/{repo.id}",
                                     expect=200)
    assert renamed["full_name"] == "acme/scout-mail" and renamed["id"] == repo.id
    assert renamed["permissions"] == {"admin": False, "push": True, "pull": True}
    gitea.forge.add_user("eve", "eve@evil.test")
    gitea.tokens["eve"] = gitea.forge.user_token("eve")
    for who, repo_id in (("eve", repo.id), ("vaultmail", 999999)):
        status, body, _ = await gitea.call(session, who, "GET", f"/repositories/{repo_id}")
        assert status == 404 and body["message"] == "The target couldn't be found.", body
    async with session.get(f"{gitea.api}/repositories/{repo.id}") as resp:
        assert resp.status == 404, "no token: a private repository is not there"
    gitea.forge.state.repo_by_full_name("acme/scout-mail").private = False
    async with session.get(f"{gitea.api}/repositories/{repo.id}") as resp:
        public = await resp.json()
        assert resp.status == 200 and public["permissions"] == {
            "admin": False, "push": False, "pull": True}, public


async def test_a_renamed_repositorys_old_name_leads_to_its_new_one_as_gitea_leads_it(
        gitea: GiteaSetup, session: aiohttp.ClientSession) -> None:
    """services/context/repo.go RedirectToRepo: at a renamed repository's old name Gitea
    answers 307, reads and writes alike, to the same path and query under the new name, an
    absolute path (Go's http.Redirect); its owner's renamed login the same way
    (RedirectToUser). Before, the Gitea face led
    there as GitHub does, 301 to `/repositories/{id}/...`, no path Gitea has."""
    gitea.forge.rename_repo("acme/scout-vault", "scout-mail")
    headers = {"Authorization": f"token {gitea.bot_token}"}
    for method in ("GET", "POST"):
        async with session.request(method, f"{gitea.api}{VAULT}/issues?state=all",
                                   json={"title": "t"} if method == "POST" else None,
                                   headers=headers, allow_redirects=False) as resp:
            assert resp.status == 307, (method, resp.status)
            assert resp.headers["Location"] == \
                "/api/v1/repos/acme/scout-mail/issues?state=all", resp.headers
    async with session.get(f"{gitea.api}{VAULT}/issues", headers=headers) as resp:
        assert resp.status == 200 and str(resp.url).endswith("/repos/acme/scout-mail/issues")
