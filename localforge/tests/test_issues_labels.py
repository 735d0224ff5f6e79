"""Issue and label semantics GitHub has and the schemas cannot express."""

from __future__ import annotations

from .conftest import World

ISSUES = "/repos/acme/vault/issues"


async def _issue(world: World, title: str, labels: list[str] | None = None,
                 who: str = "marco") -> int:
    status, _, body = await world.call("POST", ISSUES, who,
                                       {"title": title, "labels": labels or []})
    assert status == 201, body
    number: int = body["number"]
    return number


async def test_unknown_labels_are_auto_created_ededed_without_description(world: World) -> None:
    n = await _issue(world, "a", ["mail:new"])
    status, _, body = await world.call("POST", f"{ISSUES}/{n}/labels", "marco",
                                       {"labels": ["Foo", {"name": "bAr"}]})
    assert status == 200
    assert [(lb["name"], lb["color"], lb["description"], lb["default"]) for lb in body] == [
        ("mail:new", "ededed", None, False), ("Foo", "ededed", None, False),
        ("bAr", "ededed", None, False)]
    status, _, label = await world.call("GET", "/repos/acme/vault/labels/foo", "marco")
    assert status == 200 and label["name"] == "Foo"  # names match case-insensitively


async def test_removing_a_label_not_on_the_issue_is_404(world: World) -> None:
    n = await _issue(world, "a", ["mail:new", "keep"])
    status, _, body = await world.call("DELETE", f"{ISSUES}/{n}/labels/absent", "marco")
    assert status == 404
    assert body["message"] == "Label does not exist"
    status, _, body = await world.call("DELETE", f"{ISSUES}/{n}/labels/mail:new", "marco")
    assert status == 200
    assert [lb["name"] for lb in body] == ["keep"]
    status, _, _ = await world.call("DELETE", f"{ISSUES}/{n}/labels/mail:new", "marco")
    assert status == 404


async def test_set_and_clear_labels(world: World) -> None:
    n = await _issue(world, "a", ["a", "b"])
    status, _, body = await world.call("PUT", f"{ISSUES}/{n}/labels", "marco",
                                       {"labels": ["b", "c"]})
    assert status == 200 and [lb["name"] for lb in body] == ["b", "c"]
    status, _, _ = await world.call("DELETE", f"{ISSUES}/{n}/labels", "marco")
    assert status == 204
    _, _, body = await world.call("GET", f"{ISSUES}/{n}/labels", "marco")
    assert body == []


async def test_list_filter_labels_is_and_state_defaults_to_open(world: World) -> None:
    both = await _issue(world, "both", ["mail:new", "urgent"])
    await _issue(world, "one", ["mail:new"])
    closed = await _issue(world, "closed", ["mail:new", "urgent"])
    await world.call("PATCH", f"{ISSUES}/{closed}", "marco", {"state": "closed"})
    _, _, body = await world.call("GET", f"{ISSUES}?labels=mail:new,urgent", "marco")
    assert [i["number"] for i in body] == [both]
    _, _, body = await world.call("GET", f"{ISSUES}?labels=mail:new,urgent&state=all", "marco")
    assert sorted(i["number"] for i in body) == [both, closed]
    _, _, body = await world.call("GET", f"{ISSUES}?state=closed", "marco")
    assert [(i["number"], i["state"], i["state_reason"]) for i in body] == [
        (closed, "closed", "completed")]


async def test_since_sort_and_direction(world: World) -> None:
    first = await _issue(world, "first")
    world.forge.clock.advance(120)
    second = await _issue(world, "second")
    _, _, body = await world.call("GET", ISSUES, "marco")
    assert [i["number"] for i in body] == [second, first]  # created, desc by default
    _, _, body = await world.call("GET", f"{ISSUES}?direction=asc", "marco")
    assert [i["number"] for i in body] == [first, second]
    world.forge.clock.advance(120)
    await world.call("POST", f"{ISSUES}/{first}/comments", "marco", {"body": "bump"})
    _, _, body = await world.call("GET", f"{ISSUES}?sort=updated", "marco")
    assert [i["number"] for i in body] == [first, second]
    _, _, second_body = await world.call("GET", f"{ISSUES}/{second}", "marco")
    since = second_body["updated_at"]
    world.forge.clock.advance(5)
    _, _, body = await world.call("GET", f"{ISSUES}?since={since}", "marco")
    assert {i["number"] for i in body} == {first, second}
    _, _, first_body = await world.call("GET", f"{ISSUES}/{first}", "marco")
    _, _, body = await world.call("GET", f"{ISSUES}?since={first_body['updated_at']}",
                                  "marco")
    assert [i["number"] for i in body] == [first]
    assert first_body["comments"] == 1


async def test_labels_on_repo_by_name_create_edit_delete(world: World) -> None:
    status, _, label = await world.call("POST", "/repos/acme/vault/labels", "marco",
                                        {"name": "mail:new", "color": "#0E8A16",
                                         "description": "new mail"})
    assert status == 201
    assert (label["color"], label["description"]) == ("0e8a16", "new mail")
    status, _, body = await world.call("POST", "/repos/acme/vault/labels", "marco",
                                       {"name": "MAIL:NEW"})
    assert status == 422 and body["errors"][0]["code"] == "already_exists"
    status, _, label = await world.call("PATCH", "/repos/acme/vault/labels/mail:new", "marco",
                                        {"new_name": "mail:fresh", "color": "ffffff"})
    assert status == 200 and label["name"] == "mail:fresh"
    status, _, _ = await world.call("GET", "/repos/acme/vault/labels/mail:new", "marco")
    assert status == 404
    status, _, _ = await world.call("DELETE", "/repos/acme/vault/labels/mail:fresh", "marco")
    assert status == 204


async def test_close_reopen_and_timeline(world: World) -> None:
    n = await _issue(world, "a", ["mail:new"])
    await world.call("POST", f"{ISSUES}/{n}/comments", "rita", {"body": "hi"})
    status, _, body = await world.call("PATCH", f"{ISSUES}/{n}", "marco",
                                       {"state": "closed", "state_reason": "not_planned"})
    assert (body["state"], body["state_reason"]) == ("closed", "not_planned")
    assert body["closed_by"]["login"] == "marco" and body["closed_at"]
    status, _, body = await world.call("PATCH", f"{ISSUES}/{n}", "marco", {"state": "open"})
    assert (body["state"], body["state_reason"], body["closed_at"]) == ("open", "reopened",
                                                                       None)
    _, _, events = await world.call("GET", f"{ISSUES}/{n}/timeline", "marco")
    assert [e["event"] for e in events] == ["labeled", "commented", "closed", "reopened"]


async def test_comment_edit_and_delete_rules(world: World) -> None:
    n = await _issue(world, "a")
    _, _, c = await world.call("POST", f"{ISSUES}/{n}/comments", "rita", {"body": "mine"})
    path = f"/repos/acme/vault/issues/comments/{c['id']}"
    status, _, _ = await world.call("PATCH", path, "tina", {"body": "not yours"})
    assert status == 403
    status, _, body = await world.call("PATCH", path, "rita", {"body": "mine, edited"})
    assert status == 200 and body["body"] == "mine, edited"
    status, _, _ = await world.call("DELETE", path, "marco")
    assert status == 204
    status, _, _ = await world.call("GET", path, "marco")
    assert status == 404
    status, _, body = await world.call("POST", f"{ISSUES}/{n}/comments", "rita", {})
    assert status == 422


async def test_reactions_are_idempotent_per_user_and_content(world: World) -> None:
    n = await _issue(world, "a")
    path = f"{ISSUES}/{n}/reactions"
    status, _, r1 = await world.call("POST", path, "rita", {"content": "eyes"})
    assert status == 201
    status, _, r2 = await world.call("POST", path, "rita", {"content": "eyes"})
    assert status == 200 and r2["id"] == r1["id"]
    status, _, _ = await world.call("POST", path, "rita", {"content": "shrug"})
    assert status == 422
    _, _, issue = await world.call("GET", f"{ISSUES}/{n}", "rita")
    assert issue["reactions"]["eyes"] == 1 and issue["reactions"]["total_count"] == 1


async def test_contents_search_and_dispatch(world: World) -> None:
    world.forge.add_repo("acme", ".github")
    world.forge.put_file("acme/.github", "vaultmail.yml", "org: acme\n")
    token = await world.installation_token()
    auth = f"token {token}"
    status, _, body = await world.call("GET", "/repos/acme/.github/contents/vaultmail.yml",
                                       auth=auth)
    assert status == 200 and body["encoding"] == "base64"
    import base64

    assert base64.b64decode(body["content"]).decode() == "org: acme\n"
    status, _, _ = await world.call("GET", "/repos/acme/.github/contents/missing.yml",
                                    auth=auth)
    assert status == 404
    await _issue(world, "needle in title", ["mail:new"])
    await _issue(world, "other")
    status, headers, body = await world.call(
        "GET", "/search/issues?q=repo:acme/vault+is:issue+is:open+label:mail:new+needle",
        auth=auth)
    assert status == 200 and body["total_count"] == 1
    assert headers["X-RateLimit-Resource"] == "search"
    status, _, _ = await world.call("GET", "/search/issues?q=repo:acme/nope", auth=auth)
    assert status == 422
    status, _, _ = await world.call("POST", "/repos/acme/vault/dispatches", auth=auth,
                                    json_body={"event_type": "run", "client_payload": {}})
    assert status == 204
