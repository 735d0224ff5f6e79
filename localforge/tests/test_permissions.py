"""Who may see and change what: GitHub's roles, 404 for private repos, silent label drop."""

from __future__ import annotations

from .conftest import World

ISSUES = "/repos/acme/vault/issues"


async def test_outsider_and_anonymous_get_404_on_a_private_repo(world: World) -> None:
    for who in ("olga", None):
        status, _, body = await world.call("GET", "/repos/acme/vault", who)
        assert status == 404
        assert body["message"] == "Not Found"
    status, _, body = await world.call("GET", "/repos/acme/vault", "rita")
    assert status == 200
    assert body["permissions"] == {"admin": False, "maintain": False, "push": False,
                                   "triage": False, "pull": True}


async def test_bad_token_is_401_bad_credentials(world: World) -> None:
    status, _, body = await world.call("GET", "/repos/acme/vault", auth="token nope")
    assert status == 401
    assert body["message"] == "Bad credentials"


async def test_read_access_creates_an_issue_but_labels_and_assignees_are_dropped(
        world: World) -> None:
    status, _, issue = await world.call("POST", ISSUES, "rita", {
        "title": "hello", "body": "b", "labels": ["mail:new"], "assignees": ["rita"]})
    assert status == 201
    assert issue["labels"] == []
    assert issue["assignees"] == []
    assert issue["user"]["login"] == "rita"
    status, _, labels = await world.call("GET", "/repos/acme/vault/labels", "rita")
    assert [lb["name"] for lb in labels] == []  # not even auto-created


async def test_push_access_keeps_labels_and_assignees(world: World) -> None:
    status, _, issue = await world.call("POST", ISSUES, "marco", {
        "title": "hello", "labels": ["mail:new"], "assignees": ["marco"]})
    assert status == 201
    assert [lb["name"] for lb in issue["labels"]] == ["mail:new"]
    assert [a["login"] for a in issue["assignees"]] == ["marco"]


async def test_collaborator_permission_levels(world: World) -> None:
    expected = {"admin": ("admin", "admin"), "marco": ("write", "write"),
                "tina": ("read", "triage"), "rita": ("read", "read"),
                "olga": ("none", "none")}
    for login, (permission, role) in expected.items():
        status, _, body = await world.call(
            "GET", f"/repos/acme/vault/collaborators/{login}/permission", "marco")
        assert status == 200
        assert (body["permission"], body["role_name"]) == (permission, role), login
        assert body["user"]["login"] == login
    status, _, _ = await world.call(
        "GET", "/repos/acme/vault/collaborators/nobody/permission", "marco")
    assert status == 404


async def test_editing_someone_elses_issue_needs_triage(world: World) -> None:
    _, _, issue = await world.call("POST", ISSUES, "marco", {"title": "t"})
    path = f"{ISSUES}/{issue['number']}"
    status, _, _ = await world.call("PATCH", path, "rita", {"title": "hijacked"})
    assert status == 403
    status, _, body = await world.call("PATCH", path, "tina", {"labels": ["x"]})
    assert status == 200
    assert [lb["name"] for lb in body["labels"]] == ["x"]
    # the author may edit their own issue, but without triage a label change is ignored
    _, _, own = await world.call("POST", ISSUES, "rita", {"title": "mine"})
    status, _, body = await world.call("PATCH", f"{ISSUES}/{own['number']}", "rita",
                                       {"title": "mine, edited", "labels": ["x"]})
    assert status == 200
    assert body["title"] == "mine, edited"
    assert body["labels"] == []


async def test_label_management_needs_write_and_triage_may_label_issues(world: World) -> None:
    status, _, _ = await world.call("POST", "/repos/acme/vault/labels", "tina",
                                    {"name": "mail:new", "color": "0e8a16"})
    assert status == 403
    status, _, _ = await world.call("POST", "/repos/acme/vault/labels", "marco",
                                    {"name": "mail:new", "color": "0e8a16"})
    assert status == 201
    _, _, issue = await world.call("POST", ISSUES, "rita", {"title": "t"})
    labels = f"{ISSUES}/{issue['number']}/labels"
    status, _, _ = await world.call("POST", labels, "rita", {"labels": ["mail:new"]})
    assert status == 403
    status, _, body = await world.call("POST", labels, "tina", {"labels": ["mail:new"]})
    assert status == 200
    assert body[0]["color"] == "0e8a16"


async def test_org_owner_is_admin_everywhere_and_sees_members(world: World) -> None:
    status, _, body = await world.call("GET", "/repos/acme/vault", "admin")
    assert status == 200 and body["permissions"]["admin"] is True
    status, _, members = await world.call("GET", "/orgs/acme/members", "admin")
    assert status == 200
    assert {m["login"] for m in members} == {"admin", "marco", "tina", "rita"}
    status, _, members = await world.call("GET", "/orgs/acme/members", "olga")
    assert members == []


async def test_installation_token_is_scoped_to_its_installation(world: World) -> None:
    world.forge.add_org("other", owner="olga")
    world.forge.add_repo("other", "secret")
    token = await world.installation_token()
    status, _, _ = await world.call("GET", "/repos/other/secret", auth=f"token {token}")
    assert status == 404
    status, _, body = await world.call("GET", "/installation/repositories",
                                       auth=f"token {token}")
    assert status == 200
    assert [r["full_name"] for r in body["repositories"]] == ["acme/vault"]
    assert body["total_count"] == 1
